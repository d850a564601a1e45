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
    python -m pdlib profile-step --output profile.json                              # on a GPU

Every failure is one line on stderr starting "error: ": bad input exits with code 2, a failed validation
with 1. Ctrl-C stops any command within about a second (exit 130) and leaves no half-written file.
"""

import argparse
import sys

from pdlib.errors import InputError
from pdlib.interrupt import EXIT_CODE as INTERRUPTED
from pdlib.interrupt import MESSAGE as INTERRUPT_MESSAGE
from pdlib.interrupt import interruptible


class _Help(argparse.HelpFormatter):
    """Each flag's default after its help, unless the help already says it or there is none to say."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default:" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as for every other bad input
        raise InputError(f"{self.prog}: {message}")


def _defaults():
    from pdlib.config import RunParams

    return RunParams()


def _policies() -> str:
    from pdlib.config import POLICY_ALIASES
    from pdlib.scheduler import POLICIES  # pure step logic: no MLX

    aliases = ", ".join(f"{a} = {p}" for a, p in POLICY_ALIASES.items())
    return f"{' '.join(POLICIES)} ({aliases})"


def _run_options(p: argparse.ArgumentParser) -> None:
    """Flags that mirror RunParams; None means 'not given' so the params file, then RunParams' default, applies."""
    d = _defaults()

    def default(name):
        return f"default: the params file's, else {getattr(d, name)}"

    p.add_argument("--params", metavar="YAML", help="RunParams keys (params/*.yaml); flags override it")
    p.add_argument(
        "--model",
        help="preset (qwen3-0.6b, tiny), synthetic:PRESET[@SEED], HF repo id or a checkpoint "
        f"directory ({default('model')})",
    )
    p.add_argument("--prompt-tokens", type=int, metavar="N", help=f"each request's prompt ({default('prompt_tokens')})")
    p.add_argument(
        "--output-tokens",
        type=int,
        metavar="N",
        help=f"greedy outputs per request, at least 2 ({default('output_tokens')})",
    )
    p.add_argument(
        "--chunk-size",
        type=int,
        metavar="N",
        help=f"prompt tokens per prefill step, the same for every policy ({default('chunk_size')})",
    )
    p.add_argument(
        "--policies",
        nargs="+",
        metavar="POLICY",
        help=f"any of: {_policies()} (default: the params file's, else {' '.join(d.policies)})",
    )
    p.add_argument(
        "--logical-cache-reset",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="B's reset at t0 only rewinds its cache; --no-logical-cache-reset reallocates it "
        f"({default('logical_cache_reset')})",
    )
    p.add_argument(
        "--no-lossless-decode-weights",
        dest="lossless_decode_weights",
        action="store_false",
        default=None,
        help="decode reads the FP32 weights as they are, not bit-exact bf16 copies (for a checkpoint whose "
        "weights bf16 cannot hold exactly; slower) (default: the params file's, else bf16 copies)",
    )
    p.add_argument(
        "--validation-checkpoint-every",
        type=int,
        metavar="K",
        help=f"the gate compares the whole cache every K outputs ({default('validation_checkpoint_every')})",
    )
    p.add_argument(
        "--tbt-slo-ms",
        type=float,
        metavar="MS",
        help="A's gap target for slo-chunked / slo-mixed; their chunk sizes come from a step-cost fit, at "
        "most --chunk-size (default: the params file's, else 5x the fitted decode step)",
    )
    p.add_argument(
        "--pipeline-decodes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="issue a step of decodes before the tokens of the one before it are observed, so the "
        f"host's launch overlaps the device's work ({default('pipeline_decodes')})",
    )
    p.add_argument(
        "--poll-during-chunks",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with pipelined decodes, issue a prompt chunk before the decodes ahead of it are observed "
        "and look for their tokens between its layers, through the kernel's mailbox "
        f"({default('poll_during_chunks')})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _trial_options(p: argparse.ArgumentParser) -> None:
    d = _defaults()
    p.add_argument(
        "--trials",
        type=int,
        metavar="N",
        help=f"paired timed trials per policy (default: the params file's, else {d.trials})",
    )
    p.add_argument(
        "--warmups",
        type=int,
        metavar="N",
        help=f"untimed runs per policy before them (default: the params file's, else {d.warmups})",
    )


def _params(args):
    from pdlib.config import RunParams

    keys = (
        "model",
        "prompt_tokens",
        "output_tokens",
        "chunk_size",
        "policies",
        "trials",
        "warmups",
        "logical_cache_reset",
        "lossless_decode_weights",
        "validation_checkpoint_every",
        "tbt_slo_ms",
        "pipeline_decodes",
        "poll_during_chunks",
    )
    given = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    return RunParams.from_yaml(args.params, **given) if args.params else RunParams(**given)


def _worker_errors() -> tuple:
    """disagg's prefill worker failing (died, hung) is a run failure, exit 1, like a failed gate."""
    from pdlib.run.disagg.launch import WorkerError

    return (WorkerError,)


def cmd_validate(args) -> int:
    from pdlib.run.runner import run_experiment
    from pdlib.run.validate import ValidationError

    try:
        run_experiment(_params(args), validate_only=True, quiet=args.quiet)
    except (ValidationError, *_worker_errors()) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_run(args) -> int:
    from pdlib.report.metrics import overlap_line, slo_table, summary_table
    from pdlib.run.runner import run_experiment
    from pdlib.run.trial import TokenMismatch
    from pdlib.run.validate import ValidationError

    params = _params(args)
    if args.output is None and not args.validate_only:
        raise InputError("run needs --output PATH for the report (it is never overwritten)")
    try:
        report = run_experiment(
            params, output=args.output, params_file=args.params, validate_only=args.validate_only, quiet=args.quiet
        )
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
    from pdlib.run.sweep import reference_policies, run_sweep

    if args.policies is None:
        raise InputError("sweep needs --policies (the policies run at every chunk size)")
    params = _params(args)
    references = reference_policies(params.policies, args.reference_policies)
    index = run_sweep(
        params,
        chunk_sizes=args.chunk_sizes,
        references=references,
        output=args.output,
        params_file=args.params,
        quiet=args.quiet,
    )
    listed = f"{args.output}/index.json lists {len(index['points'])} completed points"
    if index["stopped"]:
        s = index["stopped"]
        print(f"error: sweep stopped at {s['policy']} c={s['chunk_size']} ({s['error']}); {listed}", file=sys.stderr)
        return 1
    print(f"done in {index['seconds']:.0f} s; {listed}")
    return 0


def cmd_render(args) -> int:
    from pdlib.analysis import bench_chart, plots, present
    from pdlib.report.bench import SCHEMA, check_result

    peek = _read_json(args.report)
    if isinstance(peek, dict) and peek.get("schema") == SCHEMA:  # bench-step's JSON: its chart and table
        paths = bench_chart.render_bench(check_result(peek, where=args.report), args.out)
        print(f"wrote {len(paths)} files into {args.out}: {', '.join(p.name for p in paths)}")
        return 0
    report = present.check_report_file(args.report)
    paths = plots.render_all(report, args.out, stall_threshold_ms=present.stall_threshold(report))
    print(f"wrote {len(paths)} files into {args.out}: {', '.join(p.name for p in paths)}")
    return 0


def _read_json(path):
    """The JSON in a file (.json or gzip-compressed .json.gz), or None when it is not JSON (the report checks
    then name the problem)."""
    import json

    from pdlib.report.io import read_text

    try:
        return json.loads(read_text(path))
    except (InputError, ValueError):
        return None


def cmd_notebooks(args) -> int:
    from pdlib.publish.notebooks import Interrupted, NotebookFailed, run_notebooks
    from pdlib.publish.runs import shown

    try:
        if args.report is not None and args.out is None:
            raise InputError("notebooks --report needs --out DIR (the report has no params file to name it)")
        if args.sweep is not None:
            from pdlib.publish.notebooks import run_sweep_notebook

            if args.out is None:
                raise InputError("notebooks --sweep needs --out DIR")
            run = run_sweep_notebook(args.sweep, out=args.out, quiet=args.quiet)
        else:
            run = run_notebooks(args.params, report=args.report, out=args.out, quiet=args.quiet)
    except NotebookFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except Interrupted as e:  # the folder is cleaned up; the message says what is left
        print(f"interrupted: {e}", file=sys.stderr)
        return INTERRUPTED
    print(f"done in {run['seconds']:.0f} s; open:")
    for path in run["html"]:
        print(f"  {shown(path)}")
    print(f"{'tables and figures' if args.sweep else 'report, tables and figures'}: {shown(run['out_dir'])}/")
    return 0


def cmd_check_kernels(args) -> int:
    from pdlib.tools.kernel_check import check_kernels, format_rows

    rows = check_kernels(seed=args.seed, progress=True)
    print(format_rows(rows))
    if args.output:
        from pdlib.engine.kernels import BACKEND
        from pdlib.report.io import claim_output, environment, source_hashes, write_report

        write_report(
            claim_output(args.output),
            {
                "schema": "pdlib.kernel-check/1",
                "environment": environment(BACKEND),
                "sources": source_hashes(),
                "seed": args.seed,
                "rows": rows,
            },
        )
    return 0 if all(r["passed"] for r in rows) else 1


def _gpu_only(command: str):
    from pdlib.engine.kernels import BACKEND

    if BACKEND == "cpu":
        raise InputError(
            f"{command} measures the GPU engine and needs a GPU backend (CUDA or Metal); "
            f"on the CPU it would run for many minutes and say nothing about hardware"
        )


def cmd_bench_step(args) -> int:
    from pdlib.errors import check_int
    from pdlib.report.io import claim_output

    if args.output:
        claim_output(args.output)
    for name, value, lo in [
        *(("contexts", c, 1) for c in args.contexts),
        ("--tokens", args.tokens, 1),
        ("--prefill-tokens", args.prefill_tokens, 1),
        ("--chunk-size", args.chunk_size, 1),
        ("--warmup", args.warmup, 0),
    ]:
        check_int(name, value, lo)
    _gpu_only("bench-step")
    from pdlib.report.bench import format_table
    from pdlib.tools.bench import bench_step, write_json
    from pdlib.weights import load_model

    model = load_model(args.model)
    result = bench_step(
        model,
        contexts=tuple(args.contexts),
        tokens=args.tokens,
        warmup=args.warmup,
        prefill_tokens=args.prefill_tokens,
        chunk=args.chunk_size,
        peers=args.peers,
    )
    print(format_table(result))
    if args.output:
        write_json(args.output, result)
        print(f"json: {args.output}")
    return 0


def cmd_profile_step(args) -> int:
    from pdlib.errors import check_int
    from pdlib.report.io import claim_output, write_report

    if args.output:
        claim_output(args.output)
    check_int("--context", args.context, 1)
    check_int("--steps", args.steps, 1)
    _gpu_only("profile-step")
    from pdlib.tools.profile import format_rows, profile_step

    result = profile_step(args.model, context=args.context, steps=args.steps)
    print(format_rows(result))
    if args.output:
        write_report(args.output, result)
        print(f"json: {args.output}")
    return 0


def _parser() -> argparse.ArgumentParser:
    from pdlib import __version__

    fmt = _Help
    parser = _Parser(
        prog="python -m pdlib",
        description=__doc__.split("\n")[0],
        formatter_class=fmt,
        epilog="python -m pdlib COMMAND --help says more; README.md has the quickstart",
    )
    parser.add_argument("--version", action="version", version=f"pdlib {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND", parser_class=_Parser)

    def command(name, func, help):
        c = sub.add_parser(name, help=help, description=help, formatter_class=fmt)
        c.set_defaults(func=func)
        return c

    v = command("validate", cmd_validate, "check every policy's steps against the FP32 reference, time nothing")
    _run_options(v)
    r = command("run", cmd_run, "validate every policy, then time paired trials and write the report")
    _run_options(r)
    _trial_options(r)
    r.add_argument(
        "--output", metavar="PATH", help="the report (JSON); must not exist (required unless --validate-only)"
    )
    r.add_argument("--validate-only", action="store_true", help="run the validation gate and nothing else")
    n = command(
        "notebooks",
        cmd_notebooks,
        "execute notebooks 01-03 (trials, or a given report) or 04 (a sweep) "
        "into a fresh folder, each with its offline HTML page",
    )
    source = n.add_mutually_exclusive_group(required=True)
    source.add_argument("--params", metavar="YAML", help="RunParams keys: run the trials")
    source.add_argument("--report", help="report.json from `run` (e.g. on another machine): render it, run nothing")
    source.add_argument(
        "--sweep", metavar="DIR", help="a folder written by `sweep`: notebook 04 only (the chunk-size frontier)"
    )
    n.add_argument(
        "--out",
        metavar="DIR",
        help="output folder (default: outputs/local/<params stem>; required with "
        "--report and --sweep; -2, -3, ... if it exists)",
    )
    n.add_argument("--quiet", action="store_true", help="no progress bar")
    d = command(
        "render", cmd_render, "rebuild every figure and table from a report (or bench-step's JSON) without rerunning"
    )
    d.add_argument("report", help="report.json written by run or the notebooks, or bench-step's JSON")
    d.add_argument(
        "--out", required=True, metavar="DIR", help="folder for the figures and tables; existing files are refused"
    )
    s = command("sweep", cmd_sweep, "one validated, timed run per (policy, chunk size), one report each, an index")
    _run_options(s)
    _trial_options(s)
    s.add_argument(
        "--chunk-sizes",
        type=int,
        nargs="+",
        required=True,
        metavar="N",
        help="each swept policy (--policies) runs at each",
    )
    s.add_argument(
        "--reference-policies",
        nargs="*",
        metavar="POLICY",
        help="run once at the params' chunk_size (default: eager fifo overlap slo-chunked slo-mixed, those "
        "registered and not swept)",
    )
    s.add_argument(
        "--output", required=True, metavar="DIR", help="folder for the reports and index.json; must be new or empty"
    )
    k = command("check-kernels", cmd_check_kernels, "every GPU kernel against its MLX-ops twin (GPU only)")
    k.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    k.add_argument("--output", metavar="PATH", help="JSON with every comparison; must not exist")
    b = command(
        "bench-step",
        cmd_bench_step,
        "decode and prefill times, pdlib next to mlx-lm (and transformers + "
        "torch.compile where torch sees CUDA), same device and weights (GPU only)",
    )
    b.add_argument("--model", default="qwen3-0.6b", help="as for run")
    b.add_argument(
        "--contexts",
        type=int,
        nargs="+",
        default=[1024, 4096, 5120],
        metavar="N",
        help="cache lengths a decode step is timed at",
    )
    b.add_argument("--tokens", type=int, default=200, help="timed decode tokens per context")
    b.add_argument("--warmup", type=int, default=20, help="untimed decode tokens before them")
    b.add_argument("--prefill-tokens", type=int, default=4096, help="the prompt prefilled whole and in chunks")
    b.add_argument("--chunk-size", type=int, default=128, help="the chunk of the chunked prefills")
    b.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        default=None,
        help="skip transformers' Qwen3 (FP32 and bf16, static cache, torch.compile); default: measure "
        "it where torch sees a CUDA device",
    )
    b.add_argument("--output", metavar="PATH", help="JSON; must not exist")
    f = command("profile-step", cmd_profile_step, "where one decode step's time goes, variant by variant (GPU only)")
    f.add_argument("--model", default="synthetic:qwen3-0.6b", help="as for run")
    f.add_argument("--context", type=int, default=4096, help="the cache length of the profiled step")
    f.add_argument("--steps", type=int, default=50, help="timed steps per variant")
    f.add_argument("--output", metavar="PATH", help="JSON; must not exist")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    try:
        with interruptible():
            args = parser.parse_args(argv)
            if args.command is None:  # `python -m pdlib` alone: what it can do
                parser.print_help()
                return 0
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
