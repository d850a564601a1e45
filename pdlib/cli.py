"""The command line's parser: every command's flags with their help and defaults (`python -m pdlib` runs it).

Flags that mirror RunParams default to None ("not given"), so a params file's value, then RunParams' default,
applies; the help shows which. A bad flag is one InputError line, exit 2, like every other bad input.
"""

import argparse

from pdlib.errors import InputError


class _Help(argparse.HelpFormatter):
    """Each flag's default after its help, unless the help already says it or there is none to say."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default:" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


PATH_FLAGS = (
    "params",
    "output",
    "out",
    "log",
    "report",
    "sweep",
    "serve",
    "search_report",
    "start_from",
)  # an empty one is no path


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --out must not stand for --output-tokens
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2, as for every other bad input
        raise InputError(f"{self.prog}: {message}")

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        empty = [k for k in PATH_FLAGS if getattr(ns, k, None) == ""]
        if empty:  # '' would silently mean "not given" or the current folder
            flag = "--" + empty[0].replace("_", "-")
            flag = flag if flag in self._option_string_actions else empty[0]  # render's REPORT is positional
            self.error(f"{flag} is an empty path: give a file or folder name")
        return ns, rest


def _defaults():
    from pdlib.config import RunParams

    return RunParams()


def _serving_policies() -> str:
    from pdlib.batching import BATCH_POLICIES  # pure step logic: no MLX

    return ", ".join(BATCH_POLICIES)


def _policies() -> str:
    from pdlib.config import POLICY_ALIASES
    from pdlib.scheduler import POLICIES  # pure step logic: no MLX

    aliases = ", ".join(f"{a} = {p}" for a, p in POLICY_ALIASES.items())
    return f"{' '.join(POLICIES)} ({aliases})"


def run_options(p: argparse.ArgumentParser) -> None:
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


def trial_options(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--peers",
        nargs="*",
        metavar="PEER",
        help="systems timed beside the policies, never gated: mlx-lm's own continuous batching as "
        "mlx-lm-<fp32|bf16>@<prefill_step_size|chunk>, e.g. mlx-lm-fp32@2048 (default: the params file's, else none)",
    )


def params_from(args):
    """RunParams from the run options: the params file's values, then the flags given over them."""
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
        "peers",
    )
    given = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    return RunParams.from_yaml(args.params, **given) if args.params is not None else RunParams(**given)


def parser(commands: dict, *, description: str) -> argparse.ArgumentParser:
    """Every command's flags, help and defaults; `commands` maps each name to its handler (checked complete)."""
    from pdlib import __version__

    fmt = _Help
    parser = _Parser(
        prog="python -m pdlib",
        description=description,
        formatter_class=fmt,
        epilog="python -m pdlib COMMAND --help says more; README.md has the quickstart",
    )
    parser.add_argument("--version", action="version", version=f"pdlib {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND", parser_class=_Parser)

    def command(name, help):
        if name not in commands:
            raise ValueError(f"no handler for command {name!r}")
        return sub.add_parser(name, help=help, description=help, formatter_class=fmt)

    v = command("validate", "check every policy's steps against the FP32 reference, time nothing")
    run_options(v)
    r = command("run", "validate every policy, then time paired trials and write the report")
    run_options(r)
    trial_options(r)
    r.add_argument(
        "--output", metavar="PATH", help="the report (JSON); must not exist (required unless --validate-only)"
    )
    r.add_argument("--validate-only", action="store_true", help="run the validation gate and nothing else")
    s = command(
        "serve",
        "serve a workload of N requests with arrivals (an Azure trace, Poisson, the pair) under each policy, "
        "every request's tokens checked against the FP32 reference",
    )
    s.add_argument("--params", metavar="YAML", required=True, help="a serving params file (params/serve-*.yaml)")
    s.add_argument("--output", metavar="PATH", help="the report (JSON, .json.gz compressed); must not exist")
    s.add_argument(
        "--search",
        action="store_true",
        help="search each policy's and peer's capacity and goodput over the rate (the params' search: section)",
    )
    s.add_argument(
        "--log", metavar="PATH", help="with --search: the JSONL log of measured points; a search resumes from it"
    )
    s.add_argument(
        "--budget-s",
        type=float,
        metavar="SECONDS",
        help="with --search: start no point that is not expected to end within SECONDS of the start, then write the "
        "report of the searches finished (the log goes on from there)",
    )
    s.add_argument(
        "--start-from",
        metavar="REPORT",
        help="with --search: begin each run's searches at its values in REPORT (another search's report, e.g. "
        "another machine's); kept in the log, so a resumed or --from-log command takes the same path",
    )
    s.add_argument(
        "--from-log",
        action="store_true",
        help="with --search: measure nothing, on any machine: the report of the searches --log completes (the "
        "log's device and switches are the report's)",
    )
    s.add_argument(
        "--policies",
        nargs="+",
        metavar="NAME",
        help=f"run these instead of the params file's: {_serving_policies()}, or <policy>-x<K> replicas",
    )
    s.add_argument(
        "--peers",
        nargs="*",
        metavar="NAME",
        help="these mlx-lm peers instead of the params file's, as mlx-lm-<fp32|bf16>@<size|chunk> (none: no peer)",
    )
    n = command(
        "notebooks",
        "execute notebooks 01-03 (trials, or a given report), 04 (a sweep) or 05 (a serving or search report) "
        "into a fresh folder, each with its offline HTML page",
    )
    source = n.add_mutually_exclusive_group()  # one of them, or --search-report alone (cmd_notebooks checks)
    source.add_argument("--params", metavar="YAML", help="RunParams keys: run the trials")
    source.add_argument("--report", help="report.json from `run` (e.g. on another machine): render it, run nothing")
    source.add_argument(
        "--sweep", metavar="DIR", help="a folder written by `sweep`: notebook 04 only (the chunk-size frontier)"
    )
    source.add_argument(
        "--serve", metavar="REPORT", help="a report written by `serve`: notebook 05 only (latency, timeline, SLOs)"
    )
    n.add_argument(
        "--search-report",
        metavar="REPORT",
        help="a report of `serve --search`: notebook 05's capacity and goodput charts (alone, or with --serve)",
    )
    n.add_argument(
        "--out",
        metavar="DIR",
        help="output folder (default: outputs/local/<params stem>; required with "
        "--report, --sweep, --serve and --search-report; -2, -3, ... if it exists)",
    )
    n.add_argument("--quiet", action="store_true", help="no progress bar")
    d = command("render", "rebuild every figure and table from a report (or bench-step's JSON) without rerunning")
    d.add_argument("report", help="report.json written by run or the notebooks, or bench-step's JSON")
    d.add_argument(
        "--out", required=True, metavar="DIR", help="folder for the figures and tables; existing files are refused"
    )
    s = command("sweep", "one validated, timed run per (policy, chunk size), one report each, an index")
    run_options(s)
    trial_options(s)
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
    k = command("check-kernels", "every GPU kernel against its MLX-ops twin (GPU only)")
    k.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    k.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="kernel families checked at once, each in its own process (on a fresh machine most of the run is "
        "compiling kernels, one at a time in a process)",
    )
    k.add_argument("--output", metavar="PATH", help="JSON with every comparison; must not exist")
    b = command(
        "bench-step",
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
        "--rounds",
        type=int,
        nargs="*",
        default=[1, 8, 32],
        help="requests in a decode round timed in each PDLIB_DECODE_ROUND mode (none: skip the rounds)",
    )
    b.add_argument("--round-context", type=int, default=2048, help="the cache length of every round's requests")
    b.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        default=None,
        help="skip transformers' Qwen3 (FP32 and bf16, static cache, torch.compile); default: measure "
        "it where torch sees a CUDA device",
    )
    b.add_argument("--output", metavar="PATH", help="JSON; must not exist")
    f = command("profile-step", "where one decode step's time goes, variant by variant (GPU only)")
    f.add_argument("--model", default="synthetic:qwen3-0.6b", help="as for run")
    f.add_argument("--context", type=int, default=4096, help="the cache length of the profiled step")
    f.add_argument("--steps", type=int, default=50, help="timed steps per variant")
    f.add_argument(
        "--rounds",
        type=int,
        nargs="+",
        metavar="R",
        help="instead: where a round of R decodes as one step goes (its host part, its matmuls, its attention, "
        "its LM head), at --context positions each",
    )
    f.add_argument(
        "--chunk",
        type=int,
        metavar="C",
        help="instead: a serving step of a C-token prompt chunk beside each of --rows decode rows at --context "
        "positions, in each PDLIB_STEP_DISPATCH mode: the step, its host part and that part's Python profile",
    )
    f.add_argument("--rows", type=int, nargs="+", default=[0, 8, 32], metavar="R", help="decode rows for --chunk")
    f.add_argument(
        "--groups",
        type=int,
        nargs="+",
        metavar="N",
        help="instead: where a persistent launch of N requests (1 to 8) at --context positions spends its time, "
        "phase by phase, from the kernel's own clock stamps",
    )
    f.add_argument("--output", metavar="PATH", help="JSON; must not exist")
    c = command(
        "partition-curve",
        "the partition policy's k curve: A's decode on k SMs, B's prefill on the rest, alone and together (CUDA only)",
    )
    c.add_argument("--model", default="qwen3-0.6b", help="as for run")
    c.add_argument("--prompts", type=int, nargs="+", default=[4096, 16384], help="prompt lengths (A's and B's)")
    c.add_argument("--sms", type=int, nargs="+", default=[0, 16, 32, 48, 64, 80], help="A's SMs (0: overlap, no split)")
    c.add_argument("--steps", type=int, default=64, help="A's timed decode steps alone")
    c.add_argument("--repeats", type=int, default=3, help="runs of B's prefill and of both together (median)")
    c.add_argument("--output", metavar="PATH", help="JSON; must not exist")
    if set(sub.choices) != set(commands):
        raise ValueError(f"commands without a parser: {sorted(set(commands) - set(sub.choices))}")
    return parser
