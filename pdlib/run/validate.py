"""The validation gate: run a policy's exact step sequence on the engine and check every number against the
FP32 reference before anything is timed.

    result = validate_policy("chunked", engine=engine, traces=traces, steps=plan("chunked", ...), output_tokens=1024)
    result.to_dict()    # per check kind: count, worst error and where; the smallest top-1/top-2 margin

Checks (each |x - ref| <= 1e-3 + 1e-3 * |ref|, fixed): `prefix_kv` — the complete K/V prefix after every
prefill chunk; `logits` and `token` — every output's full-vocabulary logits and its exact greedy token;
`decode_kv` — the K/V slot each decode writes; `checkpoint_kv` — the whole cache every K outputs.
A failure raises `ValidationError` naming the check, request, position and layer, so no timing can follow.
Comparisons run on the device as the steps go; only scalars come back to the host.
"""

from collections import defaultdict
from dataclasses import asdict, dataclass, field

import mlx.core as mx

from pdlib.engine import Engine
from pdlib.errors import RunFailure
from pdlib.run.executor import Hook, WorkResult, execute
from pdlib.run.reference import Reference
from pdlib.scheduler import Prefill, Step
from pdlib.tolerance import ATOL, RTOL, elementwise, tolerance_stats

DECODE_KV_BATCH = 16
KV_CHECK_BYTES = 1 << 28  # a side's K/V compared at once: a 7K-token prefix is 1.7 GB a side in FP32
CHECKS = ("prefix_kv", "logits", "token", "decode_kv", "checkpoint_kv")


class ValidationError(RunFailure):
    def __init__(self, message: str, result: "ValidationResult"):
        super().__init__(message)
        self.result = result


class ReferenceTrace:
    """One request's reference continuation, advanced in step with the engine. Every policy's gate starts over
    from output 0: while the outputs' logits fit in `keep_bytes`, they are kept, so a later policy replays
    them and reads K/V from the reference's cache, which only grows (a position's K/V never change), instead
    of re-running the reference; past that budget only the current output's logits are kept and a policy
    that starts over restarts the reference (its prompt pass and decodes run once per policy)."""

    def __init__(self, reference: Reference, prompt_ids, *, keep_bytes: int = 0):
        self.reference, self.prompt_ids = reference, list(prompt_ids)
        self.keep_bytes = keep_bytes
        self.stream = None
        self.index = -1  # the output whose logits the stream holds now
        self.tokens: list[int] = []  # greedy tokens of outputs 0 .. index
        self.kept: list[mx.array] = []  # logits of outputs 0 .. index, while they fit in keep_bytes

    def output(self, i: int) -> tuple[mx.array, int]:
        """Logits and greedy token of output i (0 = the one the prompt's last position yields)."""
        if i < len(self.kept):
            return self.kept[i], self.tokens[i]
        if self.stream is None or i < self.index:
            self.stream = self.reference.stream(self.prompt_ids)
            self.index, self.tokens, self.kept = 0, [self.stream.token.item()], []
            self._keep()
        while self.index < i:
            self.stream.step()
            self.index += 1
            self.tokens.append(self.stream.token.item())
            self._keep()
        return self.stream.logits, self.tokens[i]

    def _keep(self) -> None:
        row = self.stream.logits
        if len(self.kept) == self.index and (self.index + 1) * row.nbytes <= self.keep_bytes:
            self.kept.append(row)

    def kv(self, start: int, stop: int, layers: range | None = None) -> mx.array:
        """K and V over positions [start, stop) of every layer, or of `layers`: (layers, 2, Hkv, stop - start, Dh)."""
        kv = [self.stream.kv(i) for i in (range(len(self.stream.cache)) if layers is None else layers)]
        return mx.stack([mx.stack([k[:, start:stop], v[:, start:stop]]) for k, v in kv])

    def release(self) -> None:
        """Drop the reference's stream (its cache and logits): its request is done with."""
        self.stream, self.index, self.tokens, self.kept = None, -1, [], []


@dataclass
class CheckStats:
    count: int = 0
    worst_abs: float = 0.0  # largest |x - ref|
    worst_ratio: float = 0.0  # largest |x - ref| / (atol + rtol * |ref|); passes while <= 1
    where: dict | None = None  # request, position, layer of the worst ratio


@dataclass
class ValidationResult:
    policy: str
    steps: int = 0
    passed: bool = False
    checks: dict[str, CheckStats] = field(default_factory=lambda: {k: CheckStats() for k in CHECKS})
    min_margin: float = float("inf")  # smallest reference top-1 minus top-2 logit
    min_margin_where: dict | None = None
    failure: str | None = None
    tokens: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tolerance"] = {"atol": ATOL, "rtol": RTOL}
        return d


def _per_position(a: mx.array) -> mx.array:
    """(..., T, D) -> (everything else, T): one column per position along axis -2."""
    return a.swapaxes(-2, -1).reshape(-1, a.shape[-2])


def _first_bad_index(x: mx.array, ref: mx.array) -> int:
    """Index along the position axis (-2; 0 for 1-D logits) of the first value out of tolerance."""
    if x.ndim == 1:
        return 0
    return int(mx.argmax(mx.any(_per_position(elementwise(x, ref)[2]), axis=0)).item())


def _worst_index(x: mx.array, ref: mx.array) -> int:
    """Index along the position axis (-2; 0 for 1-D logits) of the worst ratio."""
    if x.ndim == 1:
        return 0
    return int(mx.argmax(mx.max(_per_position(elementwise(x, ref)[1]), axis=0)).item())


class _Checker:
    def __init__(self, result: ValidationResult):
        self.result = result

    def compare(
        self,
        kind: str,
        x: mx.array,
        ref: mx.array,
        *,
        req: str,
        first_position: int,
        layered: bool,
        count: int = 1,
        first_layer: int = 0,
    ) -> None:
        """x, ref: per layer on axis 0 when `layered` (K/V: (layers, 2, Hkv, T, Dh), layer first_layer first),
        else one 1-D logits row; positions on axis -2 starting at first_position; `count` checks at once (decode
        slots batched). One host sync per call; a failure names the first layer that fails and its first
        position out of tolerance."""
        if not layered:
            x, ref = x[None], ref[None]
        maxabs, ratios, bad = tolerance_stats(x, ref).tolist()
        c = self.result.checks[kind]
        c.count += count
        c.worst_abs = max(c.worst_abs, *maxabs)

        def where(i: int) -> dict:
            return {
                "request": req,
                "layer": first_layer + i if layered else None,
                "position": first_position + _worst_index(x[i] if layered else x[0], ref[i] if layered else ref[0]),
            }

        i = max(range(len(ratios)), key=lambda j: ratios[j])
        if ratios[i] > c.worst_ratio or c.where is None:
            c.worst_ratio, c.where = ratios[i], where(i)
        failing = [j for j, n in enumerate(bad) if n > 0]
        if failing:  # name the first layer that fails: errors propagate upwards from there
            j = failing[0]
            first = first_position + _first_bad_index(x[j] if layered else x[0], ref[j] if layered else ref[0])
            self.fail(
                kind,
                {"request": req, "layer": first_layer + j if layered else None, "position": first},
                f"{int(bad[j])} value(s) out of tolerance, worst |x-ref| = "
                f"{maxabs[j]:.3g} ({ratios[j]:.3g}x the allowed 1e-3 + 1e-3*|ref|)",
            )

    def token(self, got: int, want: int, *, req: str, index: int, position: int) -> None:
        c = self.result.checks["token"]
        c.count += 1
        if got != want:
            where = {"request": req, "layer": None, "position": position, "output": index}
            c.worst_abs, c.worst_ratio, c.where = float("inf"), float("inf"), where
            self.fail("token", where, f"output {index} is token {got}, the reference's is {want}")

    def fail(self, kind: str, where: dict, detail: str) -> None:
        layer = f", layer {where['layer']}" if where.get("layer") is not None else ""
        msg = (
            f"validation failed for policy {self.result.policy!r}: {kind} check, request {where['request']}, "
            f"position {where['position']}{layer}: {detail}"
        )
        self.result.failure = msg
        raise ValidationError(msg, self.result)


class Gate(Hook):
    """The executor hook that checks every part of every step against the reference traces. A request's
    decode slots are compared DECODE_KV_BATCH at a time (each slot is written once in a run, so reading
    it a few steps later reads what the decode wrote): reading one slot of every layer is ~500 graph nodes
    whether it is one slot or sixteen. Pending slots are compared before that request's checkpoint, before a
    failing output of it is reported, and at the end of the run (`finish`)."""

    def __init__(
        self,
        engine: Engine,
        traces: dict[str, ReferenceTrace],
        result: ValidationResult,
        *,
        checkpoint_every: int,
        on_step=None,
    ):
        self.engine, self.traces, self.result = engine, traces, result
        self.check = _Checker(result)
        self.checkpoint_every, self.on_step_done = checkpoint_every, on_step
        self.emitted: dict[str, int] = defaultdict(int)  # outputs checked per request
        self.pending: dict[str, list[int]] = {}  # request -> [start, stop) of decode slots not yet compared

    def on_step(self, index, step, results, t_start, t_end, *, timed):
        for r in results:
            req = r.work.req
            if isinstance(r.work, Prefill):
                self.traces[req].output(0)  # the reference's whole-prompt K/V
                self.compare_kv("prefix_kv", req, 0, r.stop)
                if r.output is not None:
                    self.check_output(req, r, r.stop - 1)
            else:
                self.traces[req].output(self.emitted[req])  # make sure the reference has written slot start
                self.queue_decode_kv(req, r.start, r.stop)
                self.check_output(req, r, r.start)
        self.result.steps += 1
        if self.on_step_done:
            self.on_step_done()

    def queue_decode_kv(self, req: str, start: int, stop: int) -> None:
        span = self.pending.get(req)
        if span is not None and span[1] == start:
            span[1] = stop
        else:
            self.flush_decode_kv(req)
            span = self.pending[req] = [start, stop]
        if span[1] - span[0] >= DECODE_KV_BATCH:
            self.flush_decode_kv(req)

    def flush_decode_kv(self, req: str) -> None:
        span = self.pending.pop(req, None)
        if span is not None:
            self.compare_kv("decode_kv", req, *span, count=span[1] - span[0])

    def finish(self) -> None:
        for req in list(self.pending):
            self.flush_decode_kv(req)

    def compare_kv(self, kind: str, req: str, start: int, stop: int, *, count: int = 1) -> None:
        """K/V over [start, stop), as many layers at a time as KV_CHECK_BYTES allows (a host sync each), so a long
        prefix's check needs a slice of its size beside the caches, not several times all of it."""
        cfg = self.engine.model.cfg
        layer_bytes = 2 * cfg.num_key_value_heads * cfg.head_dim * 4 * max(1, stop - start)
        group = max(1, KV_CHECK_BYTES // layer_bytes)
        for first in range(0, cfg.num_hidden_layers, group):
            layers = range(first, min(first + group, cfg.num_hidden_layers))
            self.check.compare(
                kind,
                self.engine.kv(req, start, stop, layers),
                self.traces[req].kv(start, stop, layers),
                req=req,
                first_position=start,
                layered=True,
                count=count if first == 0 else 0,
                first_layer=first,
            )

    def check_output(self, req: str, r: WorkResult, position: int) -> None:
        i = self.emitted[req]
        ref_logits, ref_token = self.traces[req].output(i)
        try:
            self.check.compare("logits", r.output.logits, ref_logits, req=req, first_position=position, layered=False)
            self.check.token(r.token, ref_token, req=req, index=i, position=position)
        except ValidationError:
            self.flush_decode_kv(req)  # a wrong K/V slot comes before the output it spoils: name it first
            raise
        top2 = mx.topk(ref_logits, 2)
        margin = abs((top2[1] - top2[0]).item())
        if margin < self.result.min_margin:
            self.result.min_margin, self.result.min_margin_where = margin, {"request": req, "output": i}
        self.emitted[req] = i + 1
        if self.checkpoint_every and self.emitted[req] % self.checkpoint_every == 0:
            self.flush_decode_kv(req)  # a bad slot is named by its own check first
            # the cache as this output left it (with pipelined decodes, the next step may have written more)
            self.compare_kv("checkpoint_kv", req, 0, r.stop)


def validate_policy(
    policy: str,
    *,
    engine: Engine,
    traces: dict[str, ReferenceTrace],
    steps: list[Step],
    output_tokens: int,
    checkpoint_every: int = 64,
    logical_reset: bool = True,
    on_step=None,
    pipeline: bool = False,
    poll: bool = False,
) -> ValidationResult:
    """Run `policy`'s plan `steps` through the executor (A's set-up prefill, B's reset at t0, then the
    policy's steps: exactly what a trial runs) and check each one. For `disagg`, `steps` is the live
    mechanism itself (Experiment.walk), held to the plan per request (pdlib/run/disagg/remote.py says why)."""
    result = ValidationResult(policy)
    gate = Gate(engine, traces, result, checkpoint_every=checkpoint_every, on_step=on_step)
    execute(engine, steps, logical_reset=logical_reset, hooks=[gate], pipeline=pipeline, poll=poll)
    gate.finish()
    result.tokens = {r: traces[r].tokens[:output_tokens] for r in ("A", "B")}
    result.passed = True
    return result
