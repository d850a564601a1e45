"""The words of an analysis: markdown tables of the metrics and paired ratios, and the findings' prose.

from pdlib.analysis import findings
print(findings.metrics_markdown(summary, ratios=ratios))
print(findings.findings(metrics, summary, stall_threshold_ms=100.0))
"""

import numpy as np
import pandas as pd

from pdlib.analysis import frames as an


def _fmt(v) -> str:
    if pd.isna(v):
        return "-"
    if float(v).is_integer():
        return f"{v:.0f}"  # counts, and times that happen to be whole ms
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"


def _ci(r) -> str:
    return "-" if pd.isna(r["ci_low"]) else f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}]"


def metrics_markdown(summary: pd.DataFrame, *, ratios: pd.DataFrame | None = None) -> str:
    """Markdown tables (DataFrame.to_markdown): each metric's median [min, max] per policy; then the
    paired ratios' medians and CIs."""
    policies = list(summary["policy"].unique())
    cells = summary.assign(
        cell=[
            f"{_fmt(r['median'])} [{_fmt(r['min'])}, {_fmt(r['max'])}] n={int(r['n'])}" for _, r in summary.iterrows()
        ]
    )
    wide = cells.pivot(index="metric", columns="policy", values="cell")
    wide = wide.loc[list(summary["metric"].unique()), policies].rename_axis(columns=None)
    text = wide.to_markdown(stralign="left", disable_numparse=True)
    if ratios is not None and not ratios.empty:
        r0 = ratios.iloc[0]
        table = pd.DataFrame(
            {
                "metric": ratios["metric"],
                f"{r0['numerator']} / {r0['denominator']} (median)": [f"{v:.3f}" for v in ratios["median_ratio"]],
                f"{r0['ci_level']:.0%} CI": [_ci(r) for _, r in ratios.iterrows()],
                "n": ratios["n"],
                "note": ratios["ci_note"],
            }
        )
        text += "\n\n" + table.to_markdown(index=False, stralign="left", disable_numparse=True)
    return text + "\n"


# ---- prose -----------------------------------------------------------------------------------------
def _ms(v) -> str:
    if pd.isna(v):
        return "-"
    if abs(v) >= 1000:
        return f"{v / 1000:.2f} s"
    return f"{v:.1f} ms" if abs(v) >= 10 else f"{v:.3g} ms"


def _x(r) -> str:
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}x" if r >= 2 else f"{r:.2f}x"


def verdict(ratio: pd.Series) -> str:
    """'higher' or 'lower' when the ratio's CI excludes 1, 'same' when it spans 1 (no measurable
    difference), 'unknown' without a CI (too few paired trials)."""
    if pd.isna(ratio["ci_low"]):
        return "unknown"
    if ratio["ci_low"] > 1:
        return "higher"
    return "lower" if ratio["ci_high"] < 1 else "same"


def _evidence(ratio: pd.Series) -> str:
    """The paired ratio's median and CI, or why there is no CI."""
    if verdict(ratio) == "unknown":
        return f"{ratio['n']} paired trials, too few for a CI"
    return f"{ratio['ci_level']:.0%} CI {_ci(ratio)}"


def _compare(label: str, p: str, vp, q: str, vq, ratio: pd.Series) -> str:
    """One metric, p against q, read from the paired ratio p/q and its CI: a CI that spans 1 is 'no
    measurable difference'; the 'Nx' quoted is the median paired ratio, as in the ratio table."""
    r = ratio["median_ratio"]
    medians = f"medians {p} {_ms(vp)}, {q} {_ms(vq)}"
    v = verdict(ratio)
    if v == "same":
        return f"- **{label}:** no measurable difference ({p}/{q} {r:.3g}, {_evidence(ratio)}; {medians})."
    if not (np.isfinite(r) and r > 0):
        return f"- **{label}:** {medians} ({_evidence(ratio)})."
    big, small, x = (p, q, r) if r >= 1 else (q, p, 1 / r)
    return f"- **{label}:** {big}'s is {_x(x)} {small}'s ({p}/{q} {r:.3g}, {_evidence(ratio)}; {medians})."


def findings(metrics: pd.DataFrame, summary: pd.DataFrame, *, stall_threshold_ms: float = 100.0) -> str:
    """A short Markdown reading: eager against chunked (else the first two policies) on A's worst and p99
    gap, B's first token and makespan, each from the paired ratio's bootstrap CI (a CI that spans 1 is
    reported as no measurable difference; without a CI, medians are quoted as such); one line per other
    policy; the stall counts. Values are medians over trials from `summary`."""
    policies = list(summary["policy"].unique())
    if not policies:  # how the library is called, not bad input
        raise ValueError("findings: the summary is empty")
    med = summary.set_index(["policy", "metric"])["median"]
    n = metrics.groupby("policy", sort=False)["trial"].nunique()
    peers = set(metrics.loc[metrics["peer"], "policy"]) if "peer" in metrics else set()
    gated = [r for r in policies if r not in peers]
    lines = []
    if {"eager", "chunked"} <= set(policies):
        p, q = "eager", "chunked"
    elif len(gated) >= 2:
        p, q = gated[:2]
    else:
        p = q = None
    if p:
        _, ratios = an.paired_ratios(metrics, numerator=p, denominator=q)
        ratio = ratios.set_index("metric")
        phase = metrics[metrics["policy"] == p]["a_max_gap_phase"]
        lines.append(
            _compare("A's worst gap", p, med[p, "a_gap_max_ms"], q, med[q, "a_gap_max_ms"], ratio.loc["a_gap_max_ms"])
        )
        lines.append(f"  It falls during B's prefill in {(phase == 'b_prefill').sum()} of {phase.size} {p} trials.")
        for key, label in (
            ("a_gap_p99_ms", "A's p99 gap"),
            ("b_ttft_ms", "B's first token"),
            ("makespan_ms", "Makespan"),
        ):
            lines.append(_compare(label, p, med[p, key], q, med[q, key], ratio.loc[key]))
        lines.append("\n**Reading:** " + _reading(p, q, med, ratio))
    others = [r for r in policies if r not in (p, q)]
    if others:
        lines.append("")
    for r in others:
        base = f" ({_x(med[r, 'b_ttft_ms'] / med[p, 'b_ttft_ms'])} {p}'s)" if p and med[p, "b_ttft_ms"] > 0 else ""
        line = (
            f"- **{r}:** A's worst gap {_ms(med[r, 'a_gap_max_ms'])}, B's first token at "
            f"{_ms(med[r, 'b_ttft_ms'])}{base}, makespan {_ms(med[r, 'makespan_ms'])} (medians)."
        )
        if r in peers:  # its trials ran after the policies': medians only, no pairing
            line += " A peer, never gated: its trials ran after the policies', so it is compared by medians."
        elif "chunked" in policies:  # the baseline every newer policy is measured against, paired by trial
            _, ratios = an.paired_ratios(metrics, numerator=r, denominator="chunked")
            ratio = ratios.set_index("metric")
            line += (
                " Against chunked, paired: "
                + "; ".join(
                    _against(label, r, "chunked", ratio.loc[key])
                    for key, label in (
                        ("a_gap_max_ms", "A's worst gap"),
                        ("b_ttft_ms", "B's first token"),
                        ("makespan_ms", "makespan"),
                    )
                )
                + "."
            )
        lines.append(line)
    stalls = ", ".join(f"{r} {med[r, 'stalls']:g}" for r in policies)
    trials = ", ".join(f"{r} {n.get(r, 0)}" for r in policies)
    lines.append(
        f"\nGaps in A's stream longer than {stall_threshold_ms:g} ms (median per trial): {stalls}. "
        f"Medians over trials ({trials}); CIs are 95% bootstrap intervals of the median paired "
        f"ratio, {an.MIN_BOOT_TRIALS} or more paired trials needed."
    )
    return "\n".join(lines).strip() + "\n"


def _against(label: str, p: str, q: str, ratio: pd.Series) -> str:
    """One metric of p against q in a few words, from the paired ratio p/q and its CI."""
    r, v = ratio["median_ratio"], verdict(ratio)
    if v == "same":
        return f"{label} no measurable difference ({p}/{q} {r:.3g}, {_evidence(ratio)})"
    return f"{label} {p}/{q} {r:.3g} ({_evidence(ratio)})"


def _reading(p, q, med, ratio) -> str:
    gap, ttft, span = (ratio.loc[k] for k in ("a_gap_max_ms", "b_ttft_ms", "makespan_ms"))
    shrink = gap["median_ratio"]
    if not (shrink >= 2 and verdict(gap) in ("higher", "unknown")):
        return (
            f"{q} does not measurably halve A's worst gap here ({_ms(med[q, 'a_gap_max_ms'])} vs "
            f"{_ms(med[p, 'a_gap_max_ms'])} under {p})."
        )
    steps = (
        f" (A's stream has {med[q, 'b_prefill_gaps']:g} gaps during B's prefill under {q}, "
        f"{med[p, 'b_prefill_gaps']:g} under {p})"
    )
    cut = f"{q} trades one long stall for many short ones{steps}: A's worst gap shrinks {_x(shrink)}"
    if verdict(ttft) == "lower":
        cut += f", B waits {_x(1 / ttft['median_ratio'])} as long for its first token"
    elif verdict(ttft) == "same":
        cut += ", B's first token shows no measurable difference"
    v = verdict(span)
    if v == "same":
        return cut + ", and the makespans show no measurable difference: it is not a throughput win."
    if v == "unknown":
        return cut + (
            f". With {span['n']} paired trials there are no CIs: these ratios are indications, "
            f"and whether the makespan differs is not measured."
        )
    longer = "shorter" if v == "higher" else "longer"  # ratio p/q > 1: q's makespan is shorter
    return cut + f"; {q}'s makespan is measurably {longer} ({p}/{q} {span['median_ratio']:.3g}, {_evidence(span)})."
