"""pdlib's command line: validate, run trials, render, and measure kernels on a GPU.

    python -m pdlib validate --model synthetic:tiny --prompt-tokens 300 --output-tokens 40 --chunk-size 64 \\
        --policies eager chunked fifo
    python -m pdlib run --params params/smoke-cpu.yaml --output /tmp/report.json
    python -m pdlib notebooks --params params/smoke-cpu.yaml      # run + analyze + figures -> outputs/local/smoke-cpu/
    python -m pdlib render outputs/smoke-cpu/report.json --out /tmp/figs   # tables and figures, no rerun
    python -m pdlib notebooks --report gpu-report.json --out outputs/x      # render a report made elsewhere
    python -m pdlib sweep --params params/smoke-cpu.yaml --chunk-sizes 8 16 32 64 --policies chunked --output /tmp/s
    python -m pdlib notebooks --sweep /tmp/s --out /tmp/s-frontier         # the chunk-size frontier (notebook 04)
    python -m pdlib notebooks --serve /tmp/serve.json.gz --out /tmp/serve  # a serving report (notebook 05)
    python -m pdlib check-kernels; python -m pdlib bench-step --output bench.json   # on a GPU
    python -m pdlib profile-step --output profile.json                              # on a GPU

Every failure is one line on stderr starting "error: ": bad input exits with code 2, a failed validation
with 1. Ctrl-C stops any command within about a second (exit 130) and leaves no half-written file.
"""

import os
import sys

from pdlib.cli import params_from, parser
from pdlib.errors import InputError, RunFailure, out_of_memory
from pdlib.interrupt import EXIT_CODE as INTERRUPTED
from pdlib.interrupt import MESSAGE as INTERRUPT_MESSAGE
from pdlib.interrupt import interruptible


def _worker_errors() -> tuple:
    """disagg's prefill worker failing (died, hung) is a run failure, exit 1, like a failed gate."""
    from pdlib.run.disagg.launch import WorkerError

    return (WorkerError,)


def cmd_validate(args) -> int:
    from pdlib.run.runner import run_experiment
    from pdlib.run.validate import ValidationError

    try:
        run_experiment(params_from(args), validate_only=True, quiet=args.quiet)
    except (ValidationError, *_worker_errors()) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_run(args) -> int:
    from pdlib.config import peer_name
    from pdlib.report.metrics import goal_table, overlap_line, slo_table, summary_table
    from pdlib.run.runner import run_experiment
    from pdlib.run.trial import TokenMismatch
    from pdlib.run.validate import ValidationError

    params = params_from(args)
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
        names = [*params.policies, *(peer_name(*params.peer_config(p)) for p in params.peers)]
        print(summary_table(report["trials"], names, stall_threshold_ms=params.stall_threshold_ms))
        if report.get("slo"):
            print(slo_table(report))
        for policy in ("overlap", "partition"):
            if line := overlap_line(report["trials"], policy):
                print(line)
        if goal := goal_table(report, names):
            print(goal)
    if args.output:
        print(f"report: {args.output}")
    return 0


def cmd_serve(args) -> int:
    from pdlib.run.search_report import search_table
    from pdlib.run.serve import serve_params_file, summary_table
    from pdlib.run.serve_search import search_params_file

    if args.search != (args.log is not None):
        raise InputError("serve: --search and --log go together (the log is where a search resumes from)")
    if args.budget_s is not None and not args.search:
        raise InputError(f"serve: --budget-s {args.budget_s:g} bounds a search: give it with --search and --log")
    if args.start_from is not None and not args.search:
        raise InputError(f"serve: --start-from {args.start_from} sets where searches begin: give it with --search")
    if args.from_log and not args.search:
        raise InputError("serve: --from-log reports a search's log: give it with --search and --log")
    if args.search and args.output is not None and os.path.realpath(args.log) == os.path.realpath(args.output):
        raise InputError(f"serve: --log and --output are both {args.log!r}: the log and the report need two paths")
    try:
        chosen = {"policies": args.policies, "peers": args.peers}
        if args.search:
            report = search_params_file(
                args.params,
                output=args.output,
                log=args.log,
                budget_s=args.budget_s,
                from_log=args.from_log,
                start_from=args.start_from,
                **chosen,
            )
        else:
            report = serve_params_file(args.params, output=args.output, **chosen)
    except RunFailure as e:  # a token that differs, a failed replay check
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(search_table(report) if args.search else summary_table(report))
    if args.output:
        print(f"report: {args.output}")
    return 0


def cmd_sweep(args) -> int:
    from pdlib.run.sweep import reference_policies, run_sweep

    if args.policies is None:
        raise InputError("sweep needs --policies (the policies run at every chunk size)")
    params = params_from(args)
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
        if not (args.params or args.report or args.sweep or args.serve or args.search_report):
            raise InputError("notebooks needs one of --params, --report, --sweep, --serve or --search-report")
        if args.search_report is not None and (args.params is not None or args.report is not None or args.sweep):
            raise InputError("notebooks --search-report is for notebook 05: alone or with --serve REPORT")
        if args.sweep is not None:
            from pdlib.publish.notebooks import run_sweep_notebook

            if args.out is None:
                raise InputError("notebooks --sweep needs --out DIR")
            run = run_sweep_notebook(args.sweep, out=args.out, quiet=args.quiet)
        elif args.serve is not None or args.search_report is not None:
            from pdlib.publish.notebooks import run_serve_notebook

            if args.out is None:
                raise InputError(f"notebooks {'--serve' if args.serve else '--search-report'} needs --out DIR")
            run = run_serve_notebook(args.serve, out=args.out, search=args.search_report, quiet=args.quiet)
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
    from pdlib.errors import check_int
    from pdlib.report.io import claim_output
    from pdlib.tools.kernel_check import check_kernels, format_rows

    check_int("--jobs", args.jobs, 1)
    check_int("--seed", args.seed, 0, 2**32 - 1)  # seed * 100 + i stays within mx.random.seed's uint64
    out = claim_output(args.output) if args.output else None  # before minutes of kernels, not after
    rows = check_kernels(seed=args.seed, progress=True, jobs=args.jobs)
    print(format_rows(rows))
    if out is not None:
        from pdlib.engine.kernels import BACKEND
        from pdlib.report.io import environment, source_hashes, write_report

        write_report(
            out,
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
        *(("--rounds", n, 1) for n in args.rounds),
        ("--round-context", args.round_context, 1),
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
        rounds=tuple(args.rounds),
        round_context=args.round_context,
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
    for r in args.rounds or ():
        check_int("--rounds", r, 3)  # fewer decodes go out as single launches, not as a step
    modes = [
        flag
        for flag, given in (("--rounds", args.rounds), ("--chunk", args.chunk), ("--groups", args.groups))
        if given is not None
    ]
    if len(modes) > 1:
        raise InputError(f"profile-step takes one of --rounds, --chunk and --groups, got {' and '.join(modes)}")
    if args.chunk is not None:
        check_int("--chunk", args.chunk, 1)
    for r in args.rows:  # read with --chunk only, checked always
        check_int("--rows", r, 0)
    if args.groups:
        from pdlib.engine.kernels.persistent_decode import MAX_GROUP

        for n in args.groups:
            check_int("--groups", n, 1)
            if n > MAX_GROUP:
                raise InputError(f"--groups: a persistent launch decodes 1 to {MAX_GROUP} requests, got {n}")
    _gpu_only("profile-step")
    if args.groups or args.chunk is not None or args.rounds:  # each on a loaded model, its report with the machine
        from pdlib.engine.kernels import BACKEND
        from pdlib.report.io import environment
        from pdlib.weights import load_model

        model = load_model(args.model)
        if args.groups:
            from pdlib.tools.profile_group import format_groups, profile_groups

            result = profile_groups(model, requests=args.groups, context=args.context, steps=args.steps)
            text = format_groups(result)
        elif args.chunk is not None:
            from pdlib.tools.profile_serve_step import format_serve_steps, profile_serve_steps

            kw = dict(chunk=args.chunk, rows=args.rows, context=args.context, steps=args.steps)
            result = profile_serve_steps(model, **kw)
            text = format_serve_steps(result)
        else:
            from pdlib.tools.profile_round import format_rounds, profile_rounds

            rounds = profile_rounds(model, args.rounds, context=args.context, steps=args.steps)
            result = {"context": args.context, "rounds": rounds}
            text = format_rounds(rounds)
        result["environment"] = environment(BACKEND)
        print(text)
    else:
        from pdlib.tools.profile import format_rows, profile_step

        result = profile_step(args.model, context=args.context, steps=args.steps)
        print(format_rows(result))
    if args.output:
        write_report(args.output, result)
        print(f"json: {args.output}")
    return 0


def cmd_partition_curve(args) -> int:
    from pdlib.errors import check_int
    from pdlib.report.io import claim_output, write_report

    if args.output:
        claim_output(args.output)
    for name, values, lo in (("--prompts", args.prompts, 1), ("--sms", args.sms, 0)):
        for v in values:
            check_int(name, v, lo)
    check_int("--steps", args.steps, 1)
    check_int("--repeats", args.repeats, 1)
    _gpu_only("partition-curve")
    from pdlib.engine.kernels import BACKEND

    if BACKEND != "cuda":
        raise InputError(f"partition-curve splits the SMs with CUDA green contexts; here the backend is {BACKEND}")
    from pdlib.tools.partition_curve import format_rows, probe

    result = probe(args.model, args.prompts, args.sms, args.steps, args.repeats)
    print(format_rows(result))
    if args.output:
        write_report(args.output, result)
        print(f"json: {args.output}")
    return 0


COMMANDS = {
    "validate": cmd_validate,
    "run": cmd_run,
    "serve": cmd_serve,
    "notebooks": cmd_notebooks,
    "render": cmd_render,
    "sweep": cmd_sweep,
    "check-kernels": cmd_check_kernels,
    "bench-step": cmd_bench_step,
    "profile-step": cmd_profile_step,
    "partition-curve": cmd_partition_curve,
}


def main(argv=None) -> int:
    cli = parser(COMMANDS, description=__doc__.split("\n")[0])
    try:
        with interruptible():
            args = cli.parse_args(argv)
            if args.command is None:  # `python -m pdlib` alone: what it can do
                cli.print_help()
                return 0
            return COMMANDS[args.command](args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, RunFailure) as e:  # a full disk while writing the report; a failed check or device
        print(f"error: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        if not out_of_memory(e):
            raise
        print(f"error: the device ran out of memory: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(INTERRUPT_MESSAGE, file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
