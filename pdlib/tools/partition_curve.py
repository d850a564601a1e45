"""`python -m pdlib partition-curve`: the partition policy's k curve. A's decode on a slice of k SMs, B's
whole prefill on the rest (CUDA green contexts, engine/kernels/slices.py), to choose PDLIB_PARTITION_SMS.

    python -m pdlib partition-curve --prompts 4096 16384 --sms 16 32 48 64 --output curve.json

For each prompt length and each k: A's decode steps alone on its slice (median ms, tokens against the whole
device's), B's prefill alone on the rest (s, first token and logits against the whole device's), then both at
once as the `overlap` policy runs them (B's layers dispatched between A's steps), A's gaps while B's prefill
is in flight and B's time to its first output, B's layers one at a time (overlap.py). k = 0 is overlap
itself: both streams on the whole device. Every token is compared with the whole device's: on a slice the
decode's split count follows the slice's SMs, so logits move by rounding and a near tie could flip a token (a
mismatch is printed and recorded, not hidden).
Untimed by the gate: the partition policy's runs (`run --policies partition`) are the gated measurement.
"""

import json
import statistics
import time

import mlx.core as mx

from pdlib.engine import Engine, check_token
from pdlib.engine.kernels import BACKEND, slices
from pdlib.engine.model import drain
from pdlib.report.io import environment
from pdlib.run.overlap import StreamPrefill, second_stream
from pdlib.tools.timing import bench_prompt
from pdlib.weights import load_model


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


class Probe:
    MOST = 3000  # of A's decodes while B's prefill is in flight

    def __init__(self, model, prompt: int, steps: int):
        self.prompt, self.steps = prompt, steps
        self.engine = Engine(model, capacity=prompt + self.MOST + 64)
        vocab = model.config.vocab_size
        self.engine.add_request("A", bench_prompt(vocab, prompt, 1))
        self.engine.add_request("B", bench_prompt(vocab, prompt, 2))

    def prep_a(self) -> None:
        e = self.engine
        e.reset("A", logical=True)
        e.prefill_chunk("A", self.prompt).token.item()

    def a_alone(self, where=None) -> tuple[list[float], list[int]]:
        self.prep_a()
        times, tokens = [], []
        for _ in range(self.steps):
            t0 = time.perf_counter_ns()
            with where.active() if where else _nothing():
                out = self.engine.decode("A")
            tokens.append(check_token(out.observe()))
            times.append(_ms(t0))
        return times, tokens

    def b_alone(self, where=None) -> tuple[float, int, mx.array]:
        e = self.engine
        e.reset("B", logical=True)
        mx.synchronize()
        t0 = time.perf_counter_ns()
        with where.active() if where else _nothing():
            out = drain(e.prefill_stages("B", self.prompt))
        token = out.token.item()
        return _ms(t0) / 1e3, token, out.logits

    def together(self, a_where, b_stream) -> dict:
        e = self.engine
        self.prep_a()
        e.reset("B", logical=True)
        mx.synchronize()
        prefill = StreamPrefill("B", self.prompt, stream=b_stream)
        gaps, tokens, last = [], [], time.perf_counter_ns()
        prefill.start(e)
        while not prefill.ready() and len(tokens) < self.MOST:
            with a_where.active() if a_where else _nothing():
                out = e.decode("A")
            prefill.advance()
            tokens.append(check_token(out.observe()))
            t = time.perf_counter_ns()
            gaps.append((t - last) / 1e6)
            last = t
        out, record = prefill.receive(e, "B", self.prompt)
        return {
            "a_gaps_ms_max": max(gaps),
            "a_gaps_ms_median": statistics.median(gaps),
            "a_tokens_during": len(gaps),
            "b_ttft_s": (record["t_ready"] - record["t_dispatch"]) / 1e9,
            "b_token": out.token.item(),
            "a_tokens": tokens,
        }


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *_):
        return False


def same_prefix(runs: list[list[int]], alone: list[int]) -> tuple[bool, int]:
    """Whether every run's tokens start as `alone` does, over the tokens all of them have: (match, how many)."""
    n = min(len(alone), *(len(r) for r in runs))
    return all(r[:n] == alone[:n] for r in runs), n


def probe(model_spec: str, prompts: list[int], ks: list[int], steps: int, repeats: int) -> dict:
    model = load_model(model_spec)
    result = {
        "model": model.source,
        "environment": environment(BACKEND),
        "steps": steps,
        "repeats": repeats,
        "rows": [],
    }
    for prompt in prompts:
        p = Probe(model, prompt, steps)
        p.a_alone()  # compiles and warms
        p.b_alone()
        a_times, a_tokens = p.a_alone()
        b_times = [p.b_alone() for _ in range(repeats)]
        b_token, b_logits = b_times[0][1], b_times[0][2]
        solo = {"prompt": prompt, "k": "whole", "a_step_ms": statistics.median(a_times)}
        solo["b_prefill_s"] = statistics.median(t for t, _, _ in b_times)
        result["rows"].append(solo)
        print(f"{prompt}: whole device: A step {solo['a_step_ms']:.3f} ms, B prefill {solo['b_prefill_s']:.4f} s")
        for k in ks:
            row = {"prompt": prompt, "k": k}
            try:
                if k:
                    pair = slices.split(k)
                    row["a_sms"], row["b_sms"] = pair.a.sms, pair.b.sms
                    t, toks = p.a_alone(pair.a)
                    row["a_step_ms"], row["a_tokens_match"] = statistics.median(t), toks == a_tokens
                    runs = [p.b_alone(pair.b) for _ in range(repeats)]
                    row["b_prefill_s"] = statistics.median(r[0] for r in runs)
                    row["b_token_match"] = all(r[1] == b_token for r in runs)
                    row["b_logits_max_diff"] = max(float(mx.abs(r[2] - b_logits).max()) for r in runs)
                    a_where, b_stream = pair.a, pair.b.stream
                else:
                    a_where, b_stream = None, second_stream()
                both = [p.together(a_where, b_stream) for _ in range(repeats)]
                match, n = same_prefix([b["a_tokens"] for b in both], a_tokens)
                row["together"] = {
                    "a_max_gap_ms": statistics.median(b["a_gaps_ms_max"] for b in both),
                    "a_median_gap_ms": statistics.median(b["a_gaps_ms_median"] for b in both),
                    "a_tokens_during": statistics.median(b["a_tokens_during"] for b in both),
                    "b_ttft_s": statistics.median(b["b_ttft_s"] for b in both),
                    "b_token_match": all(b["b_token"] == b_token for b in both),
                    "a_tokens_match": match,
                    "a_tokens_compared": n,
                }
            except Exception as e:  # a probe row that fails says why and the others still run
                row["error"] = f"{type(e).__name__}: {e}"
            result["rows"].append(row)
            print(json.dumps(row, default=str), flush=True)
    return result


def format_rows(result: dict) -> str:
    """One line per (prompt, k): A's step alone, B's prefill alone, and both at once (B's layers one at a time;
    `together_1` in a file written when the probe also tried two)."""
    lines = [f"{'prompt':>6} {'k':>5} {'A step ms':>9} {'B prefill s':>11} {'A max gap ms':>12} {'B TTFT s':>8}  same"]
    for r in result["rows"]:
        both = r.get("together", r.get("together_1", {}))
        same = all(r.get(k, True) for k in ("a_tokens_match", "b_token_match")) and all(
            both.get(k, True) for k in ("a_tokens_match", "b_token_match")
        )
        cells = [r.get("a_step_ms"), r.get("b_prefill_s"), both.get("a_max_gap_ms"), both.get("b_ttft_s")]
        text = ["-" if c is None else f"{c:.4g}" for c in cells]
        lines.append(
            f"{r['prompt']:>6} {r['k']!s:>5} {text[0]:>9} {text[1]:>11} {text[2]:>12} {text[3]:>8}  "
            + ("error: " + r["error"] if "error" in r else "yes" if same else "NO")
        )
    return "\n".join(lines)


__all__ = ["probe", "format_rows", "same_prefix"]
