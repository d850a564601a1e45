"""A serving run's params file: the workload (pdlib.workload's keys) and how it is served.

    workload_params, params = load_serve_params("params/serve-smoke-cpu.yaml")
    w = Workload.from_params(workload_params)

    model: synthetic:tiny            # what load_model accepts
    workload: {source: azure-code, first: 20, rate_multiplier: 10.0, max_prompt_tokens: 256, ...}
    chunk_size: 32                   # prompt tokens per chunk (eager, chunked, fifo) or per step (mixed)
    policies: [eager, chunked, mixed, fifo]
    warmups: 1                       # full untimed runs per policy first (compiles every step shape), checked too
    slo: {decode_ms: 2.0, ttft_ms: 500.0}   # optional: report.serving.slos_from_step's strict/relaxed SLOs
    peers: [mlx-lm-fp32@2048, mlx-lm-bf16@chunk]   # optional: mlx-lm's BatchGenerator (pdlib/run/peer.py)
    search: {lo: 0.25, hi: 64, reps: 3, precision: 0.1, max_per_rep: 8, start: null, floor: null,  # the rate
             slo: {decode_ms: null, ttft_ms: null}, criteria: [capacity, goodput]}   # searches, optional
    replay_requests: 4               # optional: requests per run checked in full on a replay (serve_replay.py)
    pipeline_decodes: true           # optional: a step of decodes issued before the one before is observed
    decode_rounds: batched           # optional: or turns, one decode a step (the two-request policies' steps)
    idle: wait                       # optional: or skip, an idle span's clock jumps to the next arrival (clock.py)

A peer is spelled `mlx-lm-<dtype>@<prefill_step_size>`: dtype fp32 or bf16, the size a positive integer or
`chunk` (the params' chunk_size); each is one timed run, named in the report with `chunk` resolved
(`mlx-lm-bf16@32`).

A `search` section is read only by a search (pdlib/run/serve_search.py); a plain serve ignores it. Every key in
it may be left out (SEARCH_DEFAULTS); a `null` SLO number is measured on the machine at the search's start.

Every key is refused unless known, with one line naming it and what is accepted.
"""

import math
from dataclasses import asdict, dataclass, fields

from pdlib.batching import BATCH_POLICIES, DECODE_ROUNDS
from pdlib.config import parse_peer, peer_name
from pdlib.errors import InputError, check_int
from pdlib.params_file import read_yaml
from pdlib.report.serving import MIN_PRECISION, slos_from_step
from pdlib.run.serve_replicas import resolve
from pdlib.workload import TRACE_SOURCES, Workload, at_rate

SLO_KEYS = ("decode_ms", "ttft_ms")
IDLE = ("wait", "skip")  # with no request in the system: wait for the next arrival, or jump the clock to it
CRITERIA = ("capacity", "goodput")
SEARCH_DEFAULTS = {
    "lo": 0.25,
    "hi": 64.0,
    "reps": 3,
    "precision": 0.1,
    "max_per_rep": 8,
    "start": None,  # None: the geometric mean of lo and hi (report.serving.search)
    "floor": None,  # None: lo; below it, a run failing at lo halves on down to it (report.serving.search)
    "slo": {"decode_ms": None, "ttft_ms": None},  # None: measured (serve_search.calibrate)
    "criteria": list(CRITERIA),
}


def _positive(name: str, v, *, null: bool = False) -> None:
    if v is None and null:
        return
    if isinstance(v, bool) or not isinstance(v, int | float) or not (0 < v < math.inf):
        raise InputError(f"{name} must be a positive finite number{' or null' if null else ''}, got {v!r}")


def search_settings(spec) -> dict:
    """The `search` section with its defaults filled in, or InputError, one line."""
    if not isinstance(spec, dict):
        raise InputError(f"search must be a mapping with keys of: {', '.join(SEARCH_DEFAULTS)}, got {spec!r}")
    unknown = sorted(str(k) for k in spec if k not in SEARCH_DEFAULTS)
    if unknown:
        raise InputError(f"search: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(SEARCH_DEFAULTS)}")
    out = {**SEARCH_DEFAULTS, **spec}
    for k in ("lo", "hi", "precision"):
        _positive(f"search {k}", out[k])
    if out["precision"] < MIN_PRECISION:
        raise InputError(f"search precision must be at least {MIN_PRECISION:g} (6-digit rates), got {out['precision']}")
    _positive("search start", out["start"], null=True)
    _positive("search floor", out["floor"], null=True)
    if out["floor"] is not None and out["floor"] > out["lo"]:
        raise InputError(f"search floor must be <= lo, got floor {out['floor']}, lo {out['lo']}")
    if out["hi"] < out["lo"] or out["start"] is not None and not out["lo"] <= out["start"] <= out["hi"]:
        raise InputError(f"search needs lo <= start <= hi, got lo {out['lo']}, start {out['start']}, hi {out['hi']}")
    check_int("search reps", out["reps"], 1, 100)  # each rep's workload is made up front
    check_int("search max_per_rep", out["max_per_rep"], 1)
    slo = out["slo"]
    if not isinstance(slo, dict) or set(slo) - set(SLO_KEYS):
        raise InputError(f"search slo must be a mapping of {', '.join(SLO_KEYS)} (each a number or null), got {slo!r}")
    out["slo"] = {k: slo.get(k) for k in SLO_KEYS}
    for k, v in out["slo"].items():
        _positive(f"search slo {k}", v, null=True)
    crit = out["criteria"]
    ok = isinstance(crit, list | tuple) and crit and all(c in CRITERIA for c in crit) and len(set(crit)) == len(crit)
    if not ok:
        raise InputError(f"search criteria must be a non-empty list of {', '.join(CRITERIA)}, no repeats; got {crit!r}")
    out["criteria"] = list(crit)
    return out


@dataclass(frozen=True)
class ServeParams:
    model: str = "synthetic:tiny"
    chunk_size: int = 32
    policies: tuple[str, ...] = ("eager", "chunked", "mixed", "fifo")
    warmups: int = 0
    slo: dict | None = None  # {decode_ms, ttft_ms} for slos_from_step
    peers: tuple[str, ...] = ()  # mlx-lm's BatchGenerator, timed beside the policies (module docstring)
    search: dict | None = None  # the rate searches' settings (search_settings; module docstring)
    replay_requests: int = 4  # requests per run checked in full on a replay of its steps (serve_replay.py)
    pipeline_decodes: bool = True  # a step of decodes issued before the one before it is observed (serve.py)
    decode_rounds: str = "batched"  # a round of decodes as one step, or "turns": one decode a step (batching.py)
    idle: str = "wait"  # or "skip": nothing in the system, the clock jumps to the next arrival (clock.py)

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise InputError(f"model must be a non-empty string, got {self.model!r}")
        check_int("chunk_size", self.chunk_size, 1)
        check_int("warmups", self.warmups, 0)
        check_int("replay_requests", self.replay_requests, 0)
        if self.decode_rounds not in DECODE_ROUNDS:
            raise InputError(f"decode_rounds must be one of {', '.join(DECODE_ROUNDS)}, got {self.decode_rounds!r}")
        if self.idle not in IDLE:
            raise InputError(f"idle must be one of {', '.join(IDLE)}, got {self.idle!r}")
        if not isinstance(self.pipeline_decodes, bool):
            raise InputError(f"pipeline_decodes must be true or false, got {self.pipeline_decodes!r}")
        if not isinstance(self.policies, (list, tuple)) or not self.policies:
            raise InputError(f"policies must be a non-empty list of: {', '.join(BATCH_POLICIES)}")
        for p in self.policies:
            if not isinstance(p, str):
                raise InputError(f"policies: {p!r} is not a policy name; expected one of: {', '.join(BATCH_POLICIES)}")
            try:
                resolve(p)
            except InputError as e:
                raise InputError(f"policies: {e}") from None
        if len(set(self.policies)) != len(self.policies):
            raise InputError(f"policies must not repeat, got {' '.join(self.policies)}")
        object.__setattr__(self, "policies", tuple(self.policies))
        if self.slo is not None:
            if not isinstance(self.slo, dict) or set(self.slo) != set(SLO_KEYS):
                raise InputError(f"slo must be null or a mapping of exactly {', '.join(SLO_KEYS)}, got {self.slo!r}")
            self.slos()  # refuses a bad number now, not after the run
        if not isinstance(self.peers, (list, tuple)):
            raise InputError(f"peers must be a list like [mlx-lm-fp32@2048, mlx-lm-bf16@chunk], got {self.peers!r}")
        object.__setattr__(self, "peers", tuple(self.peers))
        if self.search is not None:
            object.__setattr__(self, "search", search_settings(self.search))
        names = [peer_name(*c) for c in self.peer_configs()]
        if len(set(names)) != len(names):
            raise InputError(f"peers must not repeat (chunk is {self.chunk_size}), got {' '.join(names)}")

    @property
    def skip_idle(self) -> bool:
        """`idle: skip`: serve_once's and peer_once's skip_idle."""
        return self.idle == "skip"

    def peer_configs(self) -> list[tuple[str, int]]:
        """(dtype, prefill_step_size) per peer, in order."""
        return [parse_peer(p, self.chunk_size) for p in self.peers]

    def slos(self) -> dict:
        return {} if self.slo is None else slos_from_step(self.slo["decode_ms"], self.slo["ttft_ms"])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["policies"] = list(self.policies)
        d["peers"] = list(self.peers)
        return d


def load_serve_params(path, *, policies=None, peers=None) -> tuple[dict, ServeParams]:
    """(workload params for Workload.from_params, ServeParams) from a YAML file; the workload is built once
    here, so a bad one is refused before any work. `policies`, `peers`: lists run instead of the file's (the
    CLI's --policies, --peers), refused as the file's would be."""
    data = read_yaml(path)
    known = ("workload", *(f.name for f in fields(ServeParams)))
    if not isinstance(data, dict) or not data:
        raise InputError(f"params file {str(path)!r} must hold a mapping with keys: {', '.join(known)}")
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise InputError(
            f"params file {str(path)!r} has unknown key(s) {', '.join(unknown)}; accepted: {', '.join(known)}"
        )
    if "workload" not in data:
        raise InputError(f"params file {str(path)!r} needs a workload (pdlib/workload.py's keys)")
    workload = data.pop("workload")
    Workload.from_params(workload)
    given = {"policies": policies, "peers": peers}
    params = ServeParams(**{**data, **{k: list(v) for k, v in given.items() if v is not None}})
    if params.search is not None and workload.get("source") in ("poisson", *TRACE_SOURCES):  # its slowest rate too
        Workload.from_params(at_rate(workload, params.search["floor"] or params.search["lo"]))
    return dict(workload), params
