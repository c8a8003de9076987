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
