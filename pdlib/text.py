"""Plain-text lines and tables for terminals and notebook stream output, with no dependencies (the GPU path
prints them too; the notebooks' Markdown tables use DataFrame.to_markdown instead). The run line and the
validation table read report-shaped dicts, so a run prints and a notebook repeats the very same text.

    print(text_table(["policy", "ms"], [["eager", "1.5"]], right_from=1))
    print(run_line(report)); print(validation_table(report["validation"]))
"""


def text_table(head, rows, *, right_from: int | None = None) -> str:
    """Columns padded to their widest cell, a dashed rule under the header; columns from `right_from` on
    are right-aligned (numbers), the others left-aligned."""
    head = [str(x) for x in head]
    rows = [[str(x) for x in row] for row in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]

    def line(row):
        cells = (
            x.rjust(w) if right_from is not None and i >= right_from else x.ljust(w)
            for i, (x, w) in enumerate(zip(row, widths))
        )
        return "  ".join(cells)

    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def run_line(report: dict) -> str:
    """The first line a run prints: model and its weights' source, backend (and what the prefill's matmuls and
    attention ran as, where the report says), sizes, what made the prompts, and whether decodes were
    pipelined (and polled while a chunk was issued: only where tokens came by the mailbox). Needs the report's
    model, environment.backend and params (prompts optional)."""
    model, params = report["model"], report["params"]
    fallback = f", {model['fallback_from']}" if model.get("fallback_from") else ""
    tokenizers = sorted({p["tokenizer"] for p in (report.get("prompts") or {}).values()})
    made_by = (
        ""
        if not tokenizers
        else " (byte ids, no tokenizer)"
        if tokenizers == ["bytes"]
        else f" (tokenizer {', '.join(tokenizers)})"
    )
    env = report["environment"]
    sums = f", split sums {env['prefill_split_sums']}" if "prefill_split_sums" in env else ""
    qk = f", q/k {env['prefill_qk']}" if "prefill_qk" in env else ""
    dispatch = f", steps by {env['step_dispatch']}" if "step_dispatch" in env else ""
    prefill = (
        f" (prefill matmuls {env['prefill_matmuls']}{sums}, attention {env['prefill_attention']}{qk}{dispatch})"
        if "prefill_matmuls" in env
        else ""
    )
    by_mailbox = env.get("token_read") == "mailbox"
    mailbox = ", tokens read from the kernel's mailbox" if by_mailbox else ""
    if env.get("pair_decode") == "pair":
        mailbox += ", a step's two decodes in one launch"
    piped = (
        ""
        if not params.get("pipeline_decodes")
        else "; decodes pipelined"
        + (", polled during chunks" if by_mailbox and params.get("poll_during_chunks") else "")
    )
    return (
        f"model {model['spec']} ({model['source']}{fallback}), backend {env['backend']}{prefill}{mailbox}; "
        f"prompts {params['prompt_tokens']} tokens{made_by}, {params['output_tokens']} outputs, "
        f"chunk {params['chunk_size']}{piped}"
    )


def validation_table(validation: dict) -> str:
    """The gate's per-policy table (pass/fail, worst |x - ref| per check, exact tokens, smallest reference
    top-1 margin) from ValidationResult.to_dict() forms, as a report stores them. KeyError/TypeError/ValueError
    when they are malformed."""
    head = rows = None
    for policy, r in validation.items():
        checks = {k: c for k, c in r["checks"].items() if k != "token"}
        if head is None:
            head = ["policy", "result", *(f"{k} max|err|" for k in checks), "tokens", "min margin"]
            rows = []
        rows.append(
            [
                policy,
                "pass" if r["passed"] else "FAIL",
                *(f"{c['worst_abs']:.2e}" if c["count"] else "none run" for c in checks.values()),
                f"{r['checks']['token']['count']} exact",
                f"{r['min_margin']:.3g}",
            ]
        )
    if head is None:
        raise ValueError("no policy")
    return text_table(head, rows)
