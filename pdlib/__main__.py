"""pdlib's command line: validate, run trials, render, and measure kernels on a GPU.

    python -m pdlib validate --model synthetic:tiny --prompt-tokens 300 --output-tokens 40 --chunk-size 64 \\
        --policies eager chunked fifo
    python -m pdlib run --params params/smoke-cpu.yaml --output /tmp/report.json
    python -m pdlib notebooks --params params/smoke-cpu.yaml      # run + analyze + figures -> outputs/local/smoke-cpu/
    python -m pdlib render outputs/smoke-cpu/report.json --out /tmp/figs   # tables and figures, no rerun
    python -m pdlib notebooks --report gpu-report.json --out outputs/x      # render a report made elsewhere
    python -m pdlib sweep --params params/smoke-cpu.yaml --chunk-sizes 8 16 32 64 --policies chunked --output /tmp/s
    python -m pdlib notebooks --sweep /tmp/s --out /tmp/s-frontier         # the chunk-size frontier (notebook 04)
    python -m pdlib check-kernels; python -m pdlib bench-step --output bench.json   # on a GPU
    python -m pdlib profile-step --output profile.json                              # on a GPU, for notes/

Every failure is one line on stderr starting "error: ": bad input exits with code 2, a failed validation
with 1. Ctrl-C stops any command within about a second (exit 130) and leaves no half-written file.
"""

import argparse
import sys

from pdlib.errors import InputError
from pdlib.interrupt import EXIT_CODE as INTERRUPTED, MESSAGE as INTERRUPT_MESSAGE, interruptible


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as for every other bad input
        raise InputError(f"{self.prog}: {message}")


def _run_options(p: argparse.ArgumentParser) -> None:
    """Flags that mirror RunParams; None means 'not given' so params files and defaults apply."""
    p.add_argument("--params", help="YAML file with RunParams keys; flags override it")
    p.add_argument("--model", help="preset (qwen3-0.6b, tiny), synthetic:PRESET[@SEED], HF repo id or directory")
    p.add_argument("--prompt-tokens", type=int)
    p.add_argument("--output-tokens", type=int)
    p.add_argument("--chunk-size", type=int)
    p.add_argument("--policies", nargs="+")
    p.add_argument("--logical-cache-reset", action=argparse.BooleanOptionalAction, default=None,
                   help="B's reset at t0 only rewinds its cache (default: reallocate it)")
    p.add_argument("--no-lossless-decode-weights", dest="lossless_decode_weights", action="store_false", default=None)
    p.add_argument("--validation-checkpoint-every", type=int)
    p.add_argument("--tbt-slo-ms", type=float, help="A's gap target for slo-chunked / slo-mixed (ms; default 5x "
                                                      "the fitted decode step); their chunk sizes come from a "
                                                      "step-cost fit, at most --chunk-size")
    p.add_argument("--pipeline-decodes", action=argparse.BooleanOptionalAction, default=None,
                   help="issue a step of decodes before the tokens of the one before it are observed, so the "
                        "host's launch overlaps the device's work (the default; --no-pipeline-decodes "
                        "observes each step first)")
    p.add_argument("--poll-during-chunks", action=argparse.BooleanOptionalAction, default=None,
                   help="with pipelined decodes, issue a prompt chunk before the decodes ahead of it are observed "
                        "and look for their tokens between its layers, where the kernel's mailbox lets the host "
                        "look without waiting (the default; --no-poll-during-chunks observes them first)")
    p.add_argument("--quiet", action="store_true")


def _params(args):
    from pdlib.config import RunParams
    keys = ("model", "prompt_tokens", "output_tokens", "chunk_size", "policies", "trials", "warmups",
            "logical_cache_reset", "lossless_decode_weights", "validation_checkpoint_every", "tbt_slo_ms",
            "pipeline_decodes", "poll_during_chunks")
    given = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    return RunParams.from_yaml(args.params, **given) if args.params else RunParams(**given)


def _worker_errors() -> tuple:
    """disagg's prefill worker failing (died, hung) is a run failure, exit 1, like a failed gate."""
    from pdlib.disagg.launch import WorkerError
    return (WorkerError,)


def cmd_validate(args) -> int:
    from pdlib.runner import run_experiment
    from pdlib.validate import ValidationError
    try:
        run_experiment(_params(args), validate_only=True, quiet=args.quiet)
    except (ValidationError, *_worker_errors()) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_run(args) -> int:
    from pdlib.metrics import overlap_line, slo_table, summary_table
    from pdlib.runner import run_experiment
    from pdlib.trial import TokenMismatch
    from pdlib.validate import ValidationError
    params = _params(args)
    if args.output is None and not args.validate_only:
        raise InputError("run needs --output PATH for the report (it is never overwritten)")
    try:
        report = run_experiment(params, output=args.output, params_file=args.params,
                                validate_only=args.validate_only, quiet=args.quiet)
    except (ValidationError, TokenMismatch, *_worker_errors()) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if report["trials"]:
        print(summary_table(report["trials"], params.policies, stall_threshold_ms=params.stall_threshold_ms))
        if report.get("slo"):
            print(slo_table(report))
        if overlap_line(report["trials"]):
            print(overlap_line(report["trials"]))
    if args.output:
        print(f"report: {args.output}")
    return 0


def cmd_sweep(args) -> int:
    from pdlib.sweep import reference_policies, run_sweep
    if args.policies is None:
        raise InputError("sweep needs --policies (the policies run at every chunk size)")
    params = _params(args)
    references = reference_policies(params.policies, args.reference_policies)
    index = run_sweep(params, chunk_sizes=args.chunk_sizes, references=references, output=args.output,
                      params_file=args.params, quiet=args.quiet)
    listed = f"{args.output}/index.json lists {len(index['points'])} completed points"
    if index["stopped"]:
        s = index["stopped"]
        print(f"error: sweep stopped at {s['policy']} c={s['chunk_size']} ({s['error']}); {listed}", file=sys.stderr)
        return 1
    print(f"done in {index['seconds']:.0f} s; {listed}")
    return 0


def cmd_render(args) -> int:
    from pdlib import plots, present
    from pdlib.bench_result import SCHEMA, check_result
    peek = _read_json(args.report)
    if isinstance(peek, dict) and peek.get("schema") == SCHEMA:  # bench-step's JSON: its chart and table
        paths = plots.render_bench(check_result(peek, where=args.report), args.out)
        print(f"wrote {len(paths)} files into {args.out}: {', '.join(p.name for p in paths)}")
        return 0
    report = present.check_report_file(args.report)
    paths = plots.render_all(report, args.out, stall_threshold_ms=present.stall_threshold(report))
    print(f"wrote {len(paths)} files into {args.out}: {', '.join(p.name for p in paths)}")
    return 0


def _read_json(path):
    """The JSON in a file, or None when it is not JSON (the report checks then name the problem)."""
    import json
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def cmd_notebooks(args) -> int:
    from pdlib.notebooks import NotebookFailed, run_notebooks
    from pdlib.runs import shown
    try:
        if args.report is not None and args.out is None:
            raise InputError("notebooks --report needs --out DIR (the report has no params file to name it)")
        if args.sweep is not None:
            from pdlib.notebooks import run_sweep_notebook
            if args.out is None:
                raise InputError("notebooks --sweep needs --out DIR")
            run = run_sweep_notebook(args.sweep, out=args.out, quiet=args.quiet)
        else:
            run = run_notebooks(args.params, report=args.report, out=args.out, quiet=args.quiet)
    except NotebookFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("interrupted: the output folder keeps the notebooks finished so far", file=sys.stderr)
        return INTERRUPTED
    print(f"done in {run['seconds']:.0f} s; open:")
    for path in run["html"]:
        print(f"  {shown(path)}")
    print(f"{'tables and figures' if args.sweep else 'report, tables and figures'}: {shown(run['out_dir'])}/")
    return 0


def cmd_check_kernels(args) -> int:
    from pdlib.kernel_check import check_kernels, format_rows
    rows = check_kernels(seed=args.seed, progress=True)
    print(format_rows(rows))
    if args.output:
        from pdlib.engine.kernels import BACKEND
        from pdlib.report import claim_output, environment, source_hashes, write_report
        write_report(claim_output(args.output), {"schema": "pdlib.kernel-check/1", "environment": environment(BACKEND),
                                                 "sources": source_hashes(), "seed": args.seed, "rows": rows})
    return 0 if all(r["passed"] for r in rows) else 1


def _gpu_only(command: str):
    from pdlib.engine.kernels import BACKEND
    if BACKEND == "cpu":
        raise InputError(f"{command} measures the GPU engine and needs a GPU backend (CUDA or Metal); "
                         f"on the CPU it would run for many minutes and say nothing about hardware")


def cmd_bench_step(args) -> int:
    from pdlib.config import _check_int
    from pdlib.report import claim_output
    if args.output:
        claim_output(args.output)
    for name, value, lo in [*(("contexts", c, 1) for c in args.contexts), ("--tokens", args.tokens, 1),
                            ("--prefill-tokens", args.prefill_tokens, 1), ("--chunk-size", args.chunk_size, 1),
                            ("--warmup", args.warmup, 0)]:
        _check_int(name, value, lo)
    _gpu_only("bench-step")
    from pdlib.bench import bench_step, write_json
    from pdlib.bench_result import format_table
    from pdlib.weights import load_model
    model = load_model(args.model)
    result = bench_step(model, contexts=tuple(args.contexts), tokens=args.tokens, warmup=args.warmup,
                        prefill_tokens=args.prefill_tokens, chunk=args.chunk_size, peers=args.peers)
    print(format_table(result))
    if args.output:
        write_json(args.output, result)
        print(f"json: {args.output}")
    return 0


def cmd_profile_step(args) -> int:
    from pdlib.config import _check_int
    from pdlib.report import claim_output, write_report
    if args.output:
        claim_output(args.output)
    _check_int("--context", args.context, 1)
    _check_int("--steps", args.steps, 1)
    _gpu_only("profile-step")
    from pdlib.profile_step import format_rows, profile_step
    result = profile_step(args.model, context=args.context, steps=args.steps)
    print(format_rows(result))
    if args.output:
        write_report(args.output, result)
        print(f"json: {args.output}")
    return 0


def main(argv=None) -> int:
    parser = _Parser(prog="python -m pdlib", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    v = sub.add_parser("validate", help="check every policy against the FP32 reference")
    _run_options(v)
    v.set_defaults(func=cmd_validate)
    r = sub.add_parser("run", help="validate, then time paired trials and write the report")
    _run_options(r)
    r.add_argument("--trials", type=int)
    r.add_argument("--warmups", type=int)
    r.add_argument("--output", help="report path (JSON); must not exist")
    r.add_argument("--validate-only", action="store_true", help="run the validation gate and nothing else")
    r.set_defaults(func=cmd_run)
    k = sub.add_parser("check-kernels", help="every GPU kernel against its MLX-ops twin (GPU only)")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--output", help="JSON with every comparison; must not exist")
    k.set_defaults(func=cmd_check_kernels)
    b = sub.add_parser("bench-step", help="decode and prefill times, pdlib vs mlx-lm (and transformers + "
                                          "torch.compile where torch sees CUDA), same device and weights")
    b.add_argument("--model", default="qwen3-0.6b")
    b.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 5120])
    b.add_argument("--tokens", type=int, default=200, help="timed decode tokens per context")
    b.add_argument("--warmup", type=int, default=20)
    b.add_argument("--prefill-tokens", type=int, default=4096)
    b.add_argument("--chunk-size", type=int, default=128)
    b.add_argument("--no-peers", dest="peers", action="store_false", default=None,
                   help="skip transformers' Qwen3 (FP32 and bf16, static cache, torch.compile)")
    b.add_argument("--output", help="JSON path; must not exist")
    b.set_defaults(func=cmd_bench_step)
    f = sub.add_parser("profile-step", help="where one decode step's time goes, variant by variant (GPU only)")
    f.add_argument("--model", default="synthetic:qwen3-0.6b")
    f.add_argument("--context", type=int, default=4096)
    f.add_argument("--steps", type=int, default=50)
    f.add_argument("--output", help="JSON path; must not exist")
    f.set_defaults(func=cmd_profile_step)
    n = sub.add_parser("notebooks", help="execute the three notebooks (trials, or a given report) into a fresh folder")
    source = n.add_mutually_exclusive_group(required=True)
    source.add_argument("--params", help="YAML file with RunParams keys: run the trials")
    source.add_argument("--report", help="report.json from `run` (e.g. on another machine): render it, run nothing")
    source.add_argument("--sweep", help="a folder written by `sweep`: notebook 04 only (the chunk-size frontier)")
    n.add_argument("--out", help="output folder (default outputs/local/<params stem>; required with --report and "
                                 "--sweep; -2, -3, ... if it holds files)")
    n.add_argument("--quiet", action="store_true", help="no progress bar")
    n.set_defaults(func=cmd_notebooks)
    s = sub.add_parser("sweep", help="one validated, timed run per (policy, chunk size), one report each, an index")
    _run_options(s)
    s.add_argument("--chunk-sizes", type=int, nargs="+", required=True, help="each swept policy runs at each")
    s.add_argument("--reference-policies", nargs="*",
                   help="run once at the params' chunk_size (default: eager fifo overlap slo-chunked slo-mixed, those "
                        "registered and not swept)")
    s.add_argument("--trials", type=int)
    s.add_argument("--warmups", type=int)
    s.add_argument("--output", required=True, help="folder for the reports and index.json; must be new or empty")
    s.set_defaults(func=cmd_sweep)
    d = sub.add_parser("render", help="rebuild every figure and table from a report (or bench-step's JSON), "
                                      "without rerunning")
    d.add_argument("report", help="report.json written by run or the notebooks, or bench-step's JSON")
    d.add_argument("--out", required=True, help="folder for the figures and tables; existing files are refused")
    d.set_defaults(func=cmd_render)
    try:
        with interruptible():
            args = parser.parse_args(argv)
            return args.func(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. a full disk while writing the report
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(INTERRUPT_MESSAGE, file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
