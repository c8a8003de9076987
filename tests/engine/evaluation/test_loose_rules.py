"""``engine.evaluation.rules.loose_rules``: the rules a lookup walks one by one (those of no
group), kept per rule set -- against a filter of the evaluator's rules after every change, and
``Evaluator.step``'s changes of such rules against a brute force of their results."""

from __future__ import annotations

import numpy as np

from engine.evaluation.evaluator import Evaluator
from engine.evaluation.rules import loose_rules
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings

HEAD = "SELECT symbol FROM trades GROUP BY symbol HAVING "
GROUPED = HEAD + "COUNT(*) OVER LAST 10 SECONDS > {n}"  # one threshold atom: a group's member
LOOSE = HEAD + "COUNT(*) OVER LAST 10 SECONDS > {n} OR SUM(size) OVER LAST 10 SECONDS < 0"


def _trades(symbols: list[str], ts: list[int]) -> dict[str, np.ndarray]:
    n = len(symbols)
    return {
        "symbol": np.array(symbols, dtype=object),
        "ts": np.array(ts, dtype=np.int64),
        "price": np.ones(n),
        "size": np.ones(n, dtype=np.int64),
        "side": np.array(["BID"] * n, dtype=object),
        "exchange": np.array(["NASDAQ"] * n, dtype=object),
    }


def _expected(ev: Evaluator) -> list[str]:
    return [r.name for r in ev.rules.values() if r.group is None]


def test_the_loose_rules_follow_every_change_of_the_rule_set() -> None:
    s = get_settings()
    ev = Evaluator("shared", ci_p=2)
    # each row: the changes made before the next check
    steps: list[list[tuple[str, str, str | None]]] = [
        [("add", "g1", GROUPED.format(n=1))],
        [("add", "l1", LOOSE.format(n=1))],
        [("add", "l2", LOOSE.format(n=2)), ("add", "g2", GROUPED.format(n=2))],
        [("remove", "l1", None), ("add", "l3", LOOSE.format(n=3))],  # as many rules: the uid tells
        [("remove", "g1", None)],
        [("remove", "l3", None), ("add", "l1", LOOSE.format(n=0))],  # a name again, last in order
    ]
    seen: list[list[str]] = []
    for changes in steps:
        for op, name, text in changes:
            if op == "add":
                assert text is not None
                ev.add_rule(name, compile_rule(text, s))
            else:
                ev.remove_rule(name)
        got = [r.name for r in loose_rules(ev, ev.rules, ev._uid)]
        assert got == _expected(ev)
        seen.append(got)
    assert seen[1] == ["l1"] and seen[3] == ["l2", "l3"] and seen[-1] == ["l2", "l1"]
    assert {r.name for r in ev.rules.values() if r.group is not None} == {"g2"}  # the mix is real


def test_a_lookup_reports_the_changes_of_loose_rules_added_and_removed_between_lookups() -> None:
    s = get_settings()
    ev = Evaluator("shared", ci_p=2)
    ev.add_rule("g", compile_rule(GROUPED.format(n=1), s))
    ev.add_rule("l2", compile_rule(LOOSE.format(n=2), s))
    ev.apply("trades", _trades(["A", "A", "A", "B", "B", "C"], [100, 200, 300, 400, 500, 600]))
    assert {(n, k, kind) for _, n, k, kind in ev.step(1000).rows()} == {
        ("g", "A", "ENTER"),
        ("g", "B", "ENTER"),
        ("l2", "A", "ENTER"),
    }
    ev.add_rule("l1", compile_rule(LOOSE.format(n=1), s))  # a loose rule added after a lookup
    ev.remove_rule("l2")
    ev.apply("trades", _trades(["C", "C"], [1100, 1200]))
    got = {(n, k, kind) for _, n, k, kind in ev.step(2000).rows()}
    # l1's result is new to it (A, B, C: more than one trade); l2 is gone; g gains C
    assert got == {("g", "C", "ENTER"), ("l1", "A", "ENTER"), ("l1", "B", "ENTER"), ("l1", "C", "ENTER")}
