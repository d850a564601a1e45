"""pdlib's best policy against mlx-lm, per searched criterion: the issue's headline ("the best policy at least 3x
mlx-lm's FP32 capacity at each SLO, or a capacity where mlx-lm has none"), from rate searches' results.

    rows = versus({"chunked": [...], "mixed": [...], "mlx-lm-fp32@2048": [...]})   # {run: search results}
    print("\\n".join(versus_line(r) for r in rows))

A run is a peer when its name is mlx-lm's (`mlx-lm-fp32@2048`, as `serve` names it, or `mlx-lm fp32 @2048`, as the
analysis labels it); the peer compared is the best of the given dtype's (its default prefill step and the chunk
size), so the ratio is against the stronger mlx-lm configuration. Per criterion (capacity_strict, ...): the
policy with the highest value (the first of equals), the peer likewise, the ratio of their values and an interval
for it from their CIs, [policy's low / peer's high, policy's high / peer's low] (the low end 0 where the peer's
CI has no upper end, the high end None where the policy's has none or the peer's low is 0): where both CIs hold
their median thresholds, it holds the ratio of the two medians, so its coverage is at least 1 - (1 - c1) -
(1 - c2) for the two searches' stated coverages (`ratio_ci_level`; nothing at 2 reps, whose CIs claim 50%
each: then it only shows the spread, printed as a range, not a CI). `meets` reads the ratio of the values: at
least `target`, or the peer has no rate (0: none at the search's lo) where the policy has one.
"""

import re

from pdlib.report.serving import ci_text

TARGET = 3.0
_PEER = re.compile(r"^mlx-lm[- ](fp32|bf16) ?@(\d+)$")


def peer_kind(name: str) -> tuple[str, int] | None:
    """(dtype, prefill step) of an mlx-lm run's name, None for a pdlib policy."""
    m = _PEER.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def _best(runs: list[tuple[str, dict]]) -> tuple[str, dict] | None:
    return max(runs, key=lambda nr: nr[1]["value"], default=None)  # max keeps the first of equals


def _joint(c1, c2):
    """The coverage two intervals' ratio keeps (Bonferroni), None where either's is unknown."""
    return None if c1 is None or c2 is None else max(0.0, c1 + c2 - 1)


def _div(a, b):
    return None if a is None or b is None or not b else a / b


def versus(searches: dict, *, dtype: str = "fp32", target: float = TARGET) -> list[dict]:
    """One row per criterion present for both a policy and a `dtype` peer (module docstring): criterion, policy,
    policy_value, policy_ci, peer, peer_value, peer_ci, ratio (None where the peer has no rate), ratio_ci, meets."""
    by: dict = {}
    for run, results in searches.items():
        kind = peer_kind(run)
        if kind is not None and kind[0] != dtype:
            continue
        for r in results:
            by.setdefault(r["criterion"], ([], []))[kind is not None].append((run, r))
    rows = []
    for criterion, (policies, peers) in by.items():
        if not policies or not peers:
            continue
        (pol, p), (peer, q) = _best(policies), _best(peers)
        ratio = _div(p["value"], q["value"])
        rows.append(
            {
                "criterion": criterion,
                "policy": pol,
                "policy_value": p["value"],
                "policy_ci": list(p["ci"]),
                "peer": peer,
                "peer_value": q["value"],
                "peer_ci": list(q["ci"]),
                "ratio": ratio,
                "ratio_ci": [0.0 if q["ci"][1] is None else _div(p["ci"][0], q["ci"][1]), _div(p["ci"][1], q["ci"][0])],
                "policy_ci_level": p.get("ci_level"),
                "peer_ci_level": q.get("ci_level"),
                "ratio_ci_level": _joint(p.get("ci_level"), q.get("ci_level")),
                "meets": (ratio is not None and ratio >= target) or (not q["value"] and p["value"] > 0),
                "target": target,
            }
        )
    return rows


def side_text(row: dict, side: str) -> str:
    """A versus row's policy or peer (`side`): its name, value and CI."""
    return f"{row[side]} {row[f'{side}_value']:.4g} {ci_text(row[f'{side}_ci'], row.get(f'{side}_ci_level'))}"


def ratio_text(row: dict) -> str:
    """A versus row's ratio with its interval, or why it has none."""
    if row["ratio"] is None:
        return "mlx-lm has none" if row["policy_value"] else "neither has a rate"
    return f"{row['ratio']:.3g}x {ci_text(row['ratio_ci'], row.get('ratio_ci_level'), fmt='.3g')}"


def versus_line(row: dict) -> str:
    """One line: the criterion, both values with their CIs, the ratio with its interval and the target."""
    return (
        f"{row['criterion']}: {side_text(row, 'policy')} vs {side_text(row, 'peer')}: {ratio_text(row)}; "
        f"{row['target']:g}x target {'met' if row['meets'] else 'not met'}"
    )


__all__ = ["TARGET", "peer_kind", "ratio_text", "side_text", "versus", "versus_line"]
