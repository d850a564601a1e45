"""A chunk-size sweep: one ordinary run (gate, warmups, timed trials, report) per (policy, chunk size) point.

    python -m pdlib sweep --params params/qwen3-0.6b-4096x1024.yaml --chunk-sizes 32 64 128 256 512 1024 4096 \\
        --policies chunked mixed --output sweeps/h200          # + eager and fifo once, at the file's chunk_size
    index = run_sweep(params, chunk_sizes=[16, 32], policies=["chunked"], references=["eager"], output="/tmp/s")

The swept policies run at every chunk size; the reference policies run once, at params.chunk_size. Every point
is `runner.run_experiment` with one policy, its report written as soon as it finishes (`chunked-c0128.json`,
never overwritten). index.json is written last and lists the completed points only: a point that fails the
gate (or a token check) stops the sweep, and the index says where and why. A folder without index.json was
interrupted (Ctrl-C): its reports are whole, but nothing lists them. The weights are loaded once for all
points; each point builds its own engine (weight packing, compilation) and reference, as a run does.
Reading a sweep (pandas only, no MLX) is pdlib/analysis/frontier.py.
"""

import datetime
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from pdlib.config import RunParams
from pdlib.errors import InputError, check_int
from pdlib.report.io import claim_output, write_report
from pdlib.report.schema import SWEEP_INDEX as INDEX
from pdlib.report.schema import SWEEP_SCHEMA
from pdlib.report.schema import sweep_report_name as report_name

DEFAULT_REFERENCES = ("eager", "fifo", "overlap", "slo-chunked", "slo-mixed")  # those registered and not swept


@dataclass(frozen=True)
class Point:
    policy: str
    chunk_size: int
    role: str  # "swept" or "reference"
    params: RunParams

    @property
    def report(self) -> str:
        return report_name(self.policy, self.chunk_size)

    @property
    def label(self) -> str:
        return f"{self.policy} c={self.chunk_size}"


def reference_policies(policies, references=None) -> tuple[str, ...]:
    """`references` as given (each must be registered and not swept), or the registered defaults not swept."""
    from pdlib.scheduler import POLICIES

    if references is None:
        return tuple(p for p in DEFAULT_REFERENCES if p in POLICIES and p not in policies)
    for p in references:
        if p not in POLICIES:
            raise InputError(f"reference policies: unknown policy {p!r}; expected one of: {', '.join(POLICIES)}")
        if p in policies:
            raise InputError(f"policy {p!r} is both swept (--policies) and a reference (--reference-policies)")
    if len(set(references)) != len(references):
        raise InputError(f"reference policies must not repeat, got {' '.join(references)}")
    return tuple(references)


def plan_points(params: RunParams, *, chunk_sizes, references=()) -> list[Point]:
    """Reference points first (a broken baseline stops the sweep early), then each chunk size, smallest first,
    with every swept policy (params.policies) at it."""
    if not chunk_sizes:
        raise InputError("chunk sizes: give at least one")
    for c in chunk_sizes:
        check_int("chunk sizes", c, 1)
    if len(set(chunk_sizes)) != len(chunk_sizes):
        raise InputError(f"chunk sizes must not repeat, got {' '.join(map(str, chunk_sizes))}")
    points = [Point(p, params.chunk_size, "reference", replace(params, policies=(p,))) for p in references]
    points += [
        Point(p, c, "swept", replace(params, policies=(p,), chunk_size=c))
        for c in sorted(chunk_sizes)
        for p in params.policies
    ]
    return points


def claim_dir(path) -> Path:
    """The sweep folder must not exist or be empty: refused (InputError) before any work, nothing created."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"output {str(path)!r} exists and is not an empty folder; a sweep writes into a new one")
    claim_output(path / INDEX)  # a writable place, checked now
    return path


def _medians(report: dict) -> str:
    import numpy as np

    from pdlib.report.metrics import trial_metrics

    m = [trial_metrics(t, stall_threshold_ms=report["params"]["stall_threshold_ms"]) for t in report["trials"]]
    med = {k: float(np.median([x[k] for x in m])) for k in ("a_gap_max_ms", "b_ttft_ms", "makespan_ms")}
    return (
        f"A max gap {med['a_gap_max_ms']:.3g} ms, B TTFT {med['b_ttft_ms']:.4g} ms, "
        f"makespan {med['makespan_ms']:.4g} ms (medians of {len(m)})"
    )


def run_sweep(
    params: RunParams, *, chunk_sizes, references=(), output, params_file=None, quiet: bool = False, log=tqdm.write
) -> dict:
    """Run every point (see the module docstring) and write the index; returns it. index["stopped"] is None
    when every point passed, else {policy, chunk_size, role, report, error} of the point that failed (its
    report is not written). InputError, before any work, for bad input or an unusable output folder."""
    from pdlib.run.disagg.launch import WorkerError  # disagg's prefill worker failed
    from pdlib.run.runner import run_experiment
    from pdlib.run.trial import TokenMismatch
    from pdlib.run.validate import ValidationError
    from pdlib.weights import load_model

    out = claim_dir(output)
    points = plan_points(params, chunk_sizes=chunk_sizes, references=references)
    t_start = time.perf_counter()
    model = load_model(params.model)
    load_s = time.perf_counter() - t_start
    done, stopped = [], None
    traces = {}  # the reference runs once for every point (same weights and prompts)
    with tqdm(
        total=len(points), desc="sweep", unit="point", file=sys.stderr, disable=quiet or None, mininterval=2
    ) as bar:
        for i, pt in enumerate(points):
            bar.set_postfix_str(pt.label, refresh=False)
            lines = []
            t0 = time.perf_counter()
            try:
                report = run_experiment(
                    pt.params,
                    output=out / pt.report,
                    params_file=params_file,
                    quiet=True,
                    log=lines.append,
                    model=model,
                    traces=traces,
                )
            except (ValidationError, TokenMismatch, WorkerError) as e:
                stopped = {
                    "policy": pt.policy,
                    "chunk_size": pt.chunk_size,
                    "role": pt.role,
                    "report": pt.report,
                    "error": f"{type(e).__name__}: {str(e).splitlines()[0]}",
                }
                break
            if i == 0:
                log(lines[0])  # the run line: model, backend, sizes (the same for every point)
            log(f"{pt.label} ({pt.role}): gate passed, {_medians(report)} -> {pt.report}")
            done.append(
                {
                    "policy": pt.policy,
                    "chunk_size": pt.chunk_size,
                    "role": pt.role,
                    "report": pt.report,
                    "passed": all(v["passed"] for v in report["validation"].values()),
                    "trials": len(report["trials"]),
                    "seconds": round(time.perf_counter() - t0, 3),
                }
            )
            bar.update()
    index = {
        "schema": SWEEP_SCHEMA,
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "params": params.to_dict(),
        "params_file": str(params_file) if params_file else None,
        "policies": list(params.policies),
        "reference_policies": list(references),
        "chunk_sizes": sorted(chunk_sizes),
        "reference_chunk_size": params.chunk_size,
        "complete": stopped is None,
        "stopped": stopped,
        "note": (
            "every planned point completed"
            if stopped is None
            else f"stopped at {stopped['policy']} c={stopped['chunk_size']}: only the {len(done)} points "
            f"before it are listed; {len(points) - len(done) - 1} more were not run"
        ),
        "model_load_s": round(load_s, 3),
        "seconds": round(time.perf_counter() - t_start, 3),
        "points": done,
    }
    write_report(out / INDEX, index)
    return index
