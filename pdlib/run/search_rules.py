"""Which of a search log's points a search takes (run/serve_search.py): each run's points keep the rule they were
measured under (a point made under another is measured again), and a point logged before summaries counted a
peer's lost requests takes its gate's count (search_log.lost_counted). Also the note a log begun with other search
settings gets: its points serve where they lie on this search's grid.
"""

import json

from pdlib.config import PEER_SYSTEM
from pdlib.run.search_log import first_difference, lost_counted
from pdlib.run.serve_replicas import parse_replicated
from pdlib.run.serve_slo import BUDGET_RULE

RULES = {"slo-mixed": BUDGET_RULE}  # each point keeps its policy's rule: a log's points made under another are redone
PEER_RULE = "pdlib.serve-search.peer/2: the engine's memory released and collected before a peer's point"


def counts_under(rule: str | None, record: dict) -> bool:
    """Whether a log's point counts under `rule`: made under it, or a peer's made before PEER_RULE that ran (one
    that ran out of memory may have failed for the engine's memory, held then: it is measured again)."""
    if record.get("rule") == rule:
        return True
    return rule == PEER_RULE and "rule" not in record and "out_of_memory" not in record.get("gate", {})


def policy_rule(name: str) -> str | None:
    """The rule a point of `name` (a policy, its replicas, or a peer) is measured under, where it has one."""
    if name.startswith(f"{PEER_SYSTEM}-"):
        return PEER_RULE
    replicated = parse_replicated(name)
    return RULES.get(replicated[0] if replicated else name)


def usable_points(records: list[dict], name: str, note, *, from_log: bool) -> list[dict]:
    """`name`'s points of the log that count (its rule's, each summary with n_lost), noting those that do not."""
    rule = policy_rule(name)
    ruled = [r for r in records if r["policy"] == name and counts_under(rule, r)]
    mine = [c for r in ruled if (c := lost_counted(r)) is not None]
    stale = sum(r["policy"] == name for r in records) - len(ruled)
    redo = "not used (a search command measures them again)" if from_log else "measuring again"
    if len(mine) < len(ruled):
        note(f"{name}: {len(ruled) - len(mine)} points of the log left lost requests out of their summaries; {redo}")
    if stale:
        note(f"{name}: {stale} points of the log were measured under another rule; {redo} ({rule})")
    return mine


def settings_note(header: dict, settings: dict, note) -> None:
    """A note where the log's first command searched with other settings (lo, hi, start, precision, ...)."""
    moved = first_difference(header.get("search", settings), json.loads(json.dumps(settings)))
    if moved is not None:
        note(f"the log's searches began with other settings ({moved}): its points serve where they lie on this grid")


class Touched(dict):
    """A search's `known` cache that remembers every key a search asked for (report.serving.search asks `key in
    known` before each point), so a command counts the log's points its searches went through."""

    def __init__(self, *args):
        super().__init__(*args)
        self.touched: set = set()

    def __contains__(self, key) -> bool:
        self.touched.add(key)
        return super().__contains__(key)
