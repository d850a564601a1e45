"""The token gate of a serving run: every request's output ids against the FP32 reference's greedy sequence for
that request alone (requests are independent: a request's tokens must not depend on what it was batched with).

    refs, seconds = reference_sequences(model, prompts, output_tokens)   # {name: ReferenceSeq}, the time it took
    check = check_request("r3", got_ids, refs["r3"], policy="mixed")    # {"status": "ok", ...} or TokenMismatch
    ties = gate_run(run, refs)       # every request of a run, each one's check recorded; its near-ties

The rule is the two-request trials' (pdlib/report/checks.py `mismatch`): the ids must equal the reference's
exactly, or the run stops with one line naming the request and the first output that differs. One exception,
near-ties: where the reference's top-2 logit margin at output k is below NEAR_TIE_MARGIN (2x the 1e-3
tolerance) and pdlib picked the reference's runner-up, both picks are within tolerance of each other, so the
difference is not an error; it is recorded as a near-tie ("diverged at near-tie k"), and the request's check
stops there, since its later tokens continue a different sequence and legitimately differ.
"""

import time
from dataclasses import dataclass

import mlx.core as mx

from pdlib.errors import InputError, is_finite
from pdlib.report.checks import first_difference, mismatch
from pdlib.run.reference import Reference
from pdlib.run.trial import TokenMismatch
from pdlib.tolerance import ATOL
from pdlib.weights import LoadedModel

NEAR_TIE_MARGIN = 2 * ATOL


@dataclass
class ReferenceSeq:
    """One request's greedy reference: per output, the token, the runner-up and the top-2 logit margin."""

    tokens: list[int]
    runner_up: list[int]
    margin: list[float]

    def to_dict(self) -> dict:
        """What a report keeps: the smallest margin and where, and the near-tie positions."""
        k = min(range(len(self.margin)), key=self.margin.__getitem__)
        close = [i for i, m in enumerate(self.margin) if m < NEAR_TIE_MARGIN]
        return {"min_margin": self.margin[k], "min_margin_at": k, "near_tie_positions": close}


def _seq_fits(seq, n: int) -> bool:
    """A kept ReferenceSeq of n outputs: one token, runner-up (ids >= 0) and margin (finite, >= 0) per output."""
    return (
        isinstance(seq, dict)
        and set(seq) == {"tokens", "runner_up", "margin"}
        and all(isinstance(v, list) and len(v) == n for v in seq.values())
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in seq["tokens"] + seq["runner_up"])
        and all(is_finite(m) and m >= 0 for m in seq["margin"])
    )


def kept_references(kept, outputs: dict, *, where: str) -> dict:
    """{name: ReferenceSeq} from references an earlier command kept, checked against the requests they are for
    (`outputs`: name -> output tokens); InputError, one line naming `where`, for any out of shape."""
    if not isinstance(kept, dict) or set(kept) != set(outputs):
        raise InputError(f"{where}: its kept references are for other requests than this rep's; use a new log")
    bad = next((name for name, n in outputs.items() if not _seq_fits(kept[name], n)), None)
    if bad is not None:
        raise InputError(
            f"{where}: its kept reference of {bad} is damaged (tokens, runner_up and margin need one entry for each "
            f"of its {outputs[bad]} outputs); use a new log"
        )
    return {name: ReferenceSeq(**kept[name]) for name in outputs}


def _top2(logits: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    first = mx.argmax(logits)
    rest = mx.where(mx.arange(logits.size) == first, -mx.inf, logits)
    second = mx.argmax(rest)
    return first, second, logits[first] - logits[second]


def reference_sequence(ref: Reference, prompt_ids, output_tokens: int) -> ReferenceSeq:
    """The reference's greedy continuation of exactly `output_tokens` outputs: the first from the prompt's
    logits, each next one from feeding the one before."""
    stream = ref.stream(prompt_ids)
    seq = ReferenceSeq([], [], [])
    for k in range(output_tokens):
        if k:
            stream.step()
        first, second, margin = _top2(stream.logits)
        mx.eval(first, second, margin)
        if first.item() != stream.token.item():  # the stream feeds its own argmax: the same pick, or a bug here
            raise AssertionError(f"top-2 pick {first.item()} is not the stream's token {stream.token.item()}")
        seq.tokens.append(first.item())
        seq.runner_up.append(second.item())
        seq.margin.append(float(margin.item()))
    return seq


def reference_sequences(
    model: LoadedModel, prompts: dict[str, tuple[int, ...]], output_tokens: dict[str, int]
) -> tuple[dict[str, ReferenceSeq], float]:
    """Every request's reference sequence and the seconds they took (model construction included)."""
    t = time.perf_counter()
    ref = Reference(model)
    out = {name: reference_sequence(ref, ids, output_tokens[name]) for name, ids in prompts.items()}
    return out, time.perf_counter() - t


def check_request(name: str, got: list[int], ref: ReferenceSeq, *, policy: str) -> dict:
    """{"status": "ok", "checked": n} when `got` equals the reference; a near-tie record (module docstring)
    when the first difference is one; else TokenMismatch, one line."""
    k = first_difference(got, ref.tokens)
    if k is None:
        return {"status": "ok", "checked": len(got)}
    if k < min(len(got), len(ref.tokens)) and ref.margin[k] < NEAR_TIE_MARGIN and got[k] == ref.runner_up[k]:
        return {
            "status": "near-tie",
            "checked": k,
            "output": k,
            "got": got[k],
            "expected": ref.tokens[k],
            "margin": ref.margin[k],
            "text": f"diverged at near-tie {k}",
        }
    raise TokenMismatch(f"policy {policy!r}: request {name} {mismatch(got, ref.tokens)}")


def gate_run(run: dict, refs: dict) -> list[dict]:
    """Check every request of a run (check_request, in request order; the first mismatch raises) and record each
    one's check; returns the near-ties."""
    ties = []
    for r in run["requests"]:
        r["check"] = check_request(r["name"], r["output_ids"], refs[r["name"]], policy=run["policy"])
        if r["check"]["status"] == "near-tie":
            ties.append({"policy": run["policy"], "request": r["name"], **r["check"]})
    return ties
