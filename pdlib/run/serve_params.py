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

A peer is spelled `mlx-lm-<dtype>@<prefill_step_size>`: dtype fp32 or bf16, the size a positive integer or
`chunk` (the params' chunk_size); each is one timed run, named in the report with `chunk` resolved
(`mlx-lm-bf16@32`).

Every key is refused unless known, with one line naming it and what is accepted.
"""

from dataclasses import asdict, dataclass, fields

from pdlib.batching import BATCH_POLICIES
from pdlib.errors import InputError, check_int
from pdlib.report.serving import slos_from_step
from pdlib.workload import Workload

SLO_KEYS = ("decode_ms", "ttft_ms")
PEER_SYSTEM = "mlx-lm"
PEER_DTYPES = ("fp32", "bf16")


def peer_name(dtype: str, prefill_step_size: int) -> str:
    return f"{PEER_SYSTEM}-{dtype}@{prefill_step_size}"


def parse_peer(spec, chunk_size: int) -> tuple[str, int]:
    """(dtype, prefill_step_size) of a peer's spelling (module docstring), or InputError, one line."""
    expected = f"expected {PEER_SYSTEM}-<{'|'.join(PEER_DTYPES)}>@<prefill_step_size|chunk>, e.g. mlx-lm-fp32@2048"
    head, _, size = spec.partition("@") if isinstance(spec, str) else ("", "", "")
    system, _, dtype = head.rpartition("-")
    if system != PEER_SYSTEM or dtype not in PEER_DTYPES or not (size == "chunk" or size.isascii() and size.isdigit()):
        raise InputError(f"peers: unknown peer {spec!r}; {expected}")
    step = chunk_size if size == "chunk" else int(size)
    if step < 1:
        raise InputError(f"peers: {spec!r} needs a prefill_step_size >= 1")
    return dtype, step


@dataclass(frozen=True)
class ServeParams:
    model: str = "synthetic:tiny"
    chunk_size: int = 32
    policies: tuple[str, ...] = ("eager", "chunked", "mixed", "fifo")
    warmups: int = 0
    slo: dict | None = None  # {decode_ms, ttft_ms} for slos_from_step
    peers: tuple[str, ...] = ()  # mlx-lm's BatchGenerator, timed beside the policies (module docstring)

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise InputError(f"model must be a non-empty string, got {self.model!r}")
        check_int("chunk_size", self.chunk_size, 1)
        check_int("warmups", self.warmups, 0)
        if not isinstance(self.policies, (list, tuple)) or not self.policies:
            raise InputError(f"policies must be a non-empty list of: {', '.join(BATCH_POLICIES)}")
        for p in self.policies:
            if p not in BATCH_POLICIES:
                raise InputError(
                    f"policies: unknown serving policy {p!r}; expected one of: {', '.join(BATCH_POLICIES)}"
                )
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
        names = [peer_name(*c) for c in self.peer_configs()]
        if len(set(names)) != len(names):
            raise InputError(f"peers must not repeat (chunk is {self.chunk_size}), got {' '.join(names)}")

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


def load_serve_params(path) -> tuple[dict, ServeParams]:
    """(workload params for Workload.from_params, ServeParams) from a YAML file; the workload is built once
    here, so a bad one is refused before any work."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except UnicodeDecodeError as e:
        raise InputError(f"params file {str(path)!r} is not UTF-8 text ({e.reason})") from None
    except (OSError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read params file {str(path)!r}: {first}") from None
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
    return dict(workload), ServeParams(**data)
