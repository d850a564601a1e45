"""The whole experiment as one call, shared by `python -m pdlib run` and notebooks/01_run_trials.ipynb.

    report = run_experiment(RunParams.from_yaml("params/smoke-cpu.yaml"), output="outputs/x/report.json")

Order: claim the output path (refuse before any work), set up, validate every policy (the gate), each request
alone on the device (the solo references: run/solo.py), warmups, paired timed trials, the peers' warmups and
trials (pdlib/run/peer.py: timed, never gated), then write the report atomically.
"""

import sys
from functools import partial

from tqdm import tqdm

from pdlib.config import RunParams
from pdlib.report.io import build_report, claim_output, write_report
from pdlib.run.experiment import REQUESTS, Experiment
from pdlib.run.solo import solo_references
from pdlib.run.trial import run_trials
from pdlib.scheduler import needs_chunk_rule
from pdlib.text import run_line, validation_table

SOLO_DECODES = 64  # A's decode steps alone, for the solo reference (run/solo.py)


def run_experiment(
    params: RunParams,
    *,
    output=None,
    params_file=None,
    validate_only: bool = False,
    quiet: bool = False,
    log=print,
    model=None,
    traces: dict | None = None,
) -> dict:
    """Returns the report dict (also written to `output` when given). Raises ValidationError or TokenMismatch
    on a numerical mismatch, InputError on bad input, disagg's WorkerError when its prefill worker fails;
    writes nothing in those cases. `model`: weights already loaded for params.model, and `traces`: reference
    traces on them (a sweep shares both among its runs)."""
    out = claim_output(output) if output else None
    exp = Experiment(params, model=model, traces=traces)
    d = exp.describe()
    log(
        run_line(
            {
                "model": d["model"],
                "environment": {"backend": d["backend"]},
                "params": params.to_dict(),
                "prompts": d["prompts"],
            }
        )
    )
    disable = quiet or None  # None: quiet when stderr is not a terminal, unless running under Jupyter
    bar = dict(file=sys.stderr, disable=disable, mininterval=2)
    if any(needs_chunk_rule(p) for p in params.policies):
        cost = exp.step_cost  # timed chunks of several sizes, before the gate: the plans depend on it
        whence = "" if params.tbt_slo_ms is not None else " (5x decode: no --tbt-slo-ms given)"
        probe = [
            f"{m} {g['a']:.3g} ms + {g['b']:.3g} ms/token + {g['c']:.3g} ms/token/position (spread "
            f"{g['spread_ms']:.2g} ms)"
            for m, g in cost.gap_fit.items()
        ]
        probe += [f"{m} too few gaps to fit: the step cost {v:+.3g} ms" for m, v in cost.overhead_ms.items()]
        log(
            f"step cost fitted: {cost.a:.3g} ms + {cost.b:.3g} ms/row + {cost.c:.3g} ms/row/position; "
            f"decode {cost.decode_ms:.3g} ms; A's gap in probe runs: {'; '.join(probe)}; "
            f"A's gap target {exp.tbt_slo_ms:.3g} ms{whence}"
        )
    steps = sum(exp.steps_per_run(p) for p in params.policies)
    with tqdm(total=steps, desc="validate", unit="step", **bar) as progress:
        validation = exp.validate(on_step=progress.update)
    log(validation_table({p: v.to_dict() for p, v in validation.items()}))
    reference = {r: validation[params.policies[0]].tokens[r] for r in REQUESTS}
    trials, solo = [], None
    if not validate_only:
        solo = solo_references(
            exp.engine, prompt_tokens=params.prompt_tokens, decodes=min(SOLO_DECODES, params.output_tokens - 1)
        )
        log(
            f"alone on the device: A's decode step {solo['a_decode_ms']:.3g} ms, "
            f"B's whole prefill {solo['b_prefill_s']:.3g} s"
        )
        runs = (len(params.policies) + len(params.peers)) * (params.warmups + params.trials)
        with tqdm(total=runs, desc="warmups+trials", unit="run", **bar) as progress:
            walks = {p: partial(exp.walk, p) for p in params.policies}
            trials = run_trials(
                exp.engine,
                walks=walks,
                trials=params.trials,
                warmups=params.warmups,
                logical_reset=params.logical_cache_reset,
                reference_tokens=reference,
                on_run=progress.update,
                pipeline=params.pipeline_decodes,
                poll=params.poll_during_chunks,
            )
            if params.peers:  # timed beside the policies, never gated: each trial carries its agreement
                from pdlib.run.peer import pair_trials

                trials += pair_trials(
                    exp.model,
                    {r: exp.prompts[r].token_ids for r in REQUESTS},
                    params.output_tokens,
                    [params.peer_config(p) for p in params.peers],
                    trials=params.trials,
                    warmups=params.warmups,
                    reference_tokens=reference,
                    first_position=len(params.policies),
                    on_run=progress.update,
                )
    report = build_report(
        params=params.to_dict(),
        model=d["model"],
        prompts=d["prompts"],
        backend=d["backend"],
        validation={p: v.to_dict() for p, v in validation.items()},
        reference_tokens=reference,
        trials=trials,
        params_file=params_file,
        slo=exp.slo_details(),
        workers=exp.workers(),
        settings=exp.engine.settings,
        solo=solo,
    )
    if out:
        write_report(out, report)
    return report
