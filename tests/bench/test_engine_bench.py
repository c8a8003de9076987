"""The engine bench subscribes its rules as ``tidewatch subscribe`` does (the text and its compiled
plan, which the engine rebuilds from JSON) or, with ``--text-rules``, as the text alone; either
way the engine reads the record as the same subscription with the same plan."""

from __future__ import annotations

import json

import pytest

from bench.engine_bench import subscription_value
from bench.spark_baseline import make_rules
from engine.messages import parse_subscription_change
from engine.rule_evaluator import rule_compiler
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings


@pytest.mark.parametrize("with_plan", [True, False])
def test_a_bench_subscription_is_the_rule_with_the_same_plan(with_plan: bool) -> None:
    s = get_settings()
    for r in make_rules(6, seed=3):
        value = subscription_value("s-1", r.name, r.text, s, with_plan)
        ch = parse_subscription_change(b"s-1", json.dumps(value).encode())
        assert (ch.subscription_id, ch.op, ch.name, ch.text) == ("s-1", "upsert", r.name, r.text)
        assert (ch.plan is not None) is with_plan
        plan, stream = rule_compiler(s)(ch.text, ch.plan)
        assert stream == "trades"
        assert plan.to_json() == compile_rule(r.text, s).to_json()


def test_the_check_finds_missing_extra_and_duplicated_alerts() -> None:
    from bench.engine_bench import compare_alerts

    a, b, c = ("r", "S1", "ENTER", 1000), ("r", "S2", "ENTER", 1000), ("r", "S1", "EXIT", 2000)
    assert compare_alerts([b, a], [a, b])["equal"]
    gone = compare_alerts([a], [a, b])
    assert (gone["equal"], gone["missing"], gone["extra"], gone["first_missing"]) == (False, 1, 0, [list(b)])
    more = compare_alerts([a, b, c], [a, b])
    assert (more["equal"], more["missing"], more["extra"]) == (False, 0, 1)
    twice = compare_alerts([a, a, b], [a, b])
    assert (twice["equal"], twice["duplicates"]) == (False, 1)


def test_the_expected_alerts_stop_at_the_last_lookup() -> None:
    """The bench's reference is the backtest up to ``until``: nothing after it, and the alerts
    up to it the same as with a later ``until``."""
    from bench.engine_bench import expected_alerts, make_trades

    s = get_settings()
    cols = make_trades(20_000, 50, 200.0, seed=5)
    rules = [(f"s{i}", r.text) for i, r in enumerate(make_rules(4, seed=2, data=cols))]
    last = int(cols["ts"].max()) // s.lookup_period_ms * s.lookup_period_ms
    full = expected_alerts(rules, cols, s, last)
    assert full, "the rules should fire on these trades"
    mid = sorted({a[3] for a in full})[len({a[3] for a in full}) // 2]
    cut = expected_alerts(rules, cols, s, mid)
    assert cut and all(a[3] <= mid for a in cut)
    assert cut == [a for a in full if a[3] <= mid]
