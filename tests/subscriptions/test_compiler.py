"""The compiler: indexable atoms, the driving atom and why, shared structures, plan JSON."""

from __future__ import annotations

import pytest

from subscriptions.compiler import Plan, compile_rule, explain
from tidewatch.settings import get_settings

HEAD = "SELECT symbol FROM trades GROUP BY symbol HAVING "


def plan(cond: str, where: str = "") -> Plan:
    w = f" WHERE {where}" if where else ""
    return compile_rule(f"SELECT symbol FROM trades{w} GROUP BY symbol HAVING {cond}", get_settings())


@pytest.mark.parametrize(
    "cond",
    [
        "COUNT(*) OVER LAST 10 SECONDS > 5",
        "COUNT(*) OVER LAST 10 SECONDS > 0",
        "COUNT(size) OVER LAST 10 SECONDS >= 1",
        "COUNT(*) OVER LAST 10 SECONDS = 3",
        "COUNT(*) OVER LAST 10 SECONDS BETWEEN 2 AND 4",
        "5 < COUNT(*) OVER LAST 10 SECONDS",
        "SUM(size) OVER LAST 1 MINUTE > 1000",
        "SUM(size) OVER LAST 1 MINUTE > 0",
        "SUM(size) FILTER (WHERE side = 'ASK') OVER LAST 1 MINUTE >= 2 * 50",
        "NOT (COUNT(*) OVER LAST 10 SECONDS <= 5)",
        "NOT (COUNT(*) OVER LAST 10 SECONDS < 1 OR AVG(price) OVER LAST 5 ROWS > 3)",
    ],
)
def test_indexable_rules_have_a_driver(cond: str) -> None:
    p = plan(cond)
    assert p.driver, explain(p)
    assert all(p.atoms[i].indexable for i in p.driver)


@pytest.mark.parametrize(
    ("cond", "reason"),
    [
        ("COUNT(*) OVER LAST 10 SECONDS < 5", "= 0"),
        ("COUNT(*) OVER LAST 10 SECONDS >= 0", "= 0"),
        ("COUNT(*) OVER LAST 10 SECONDS != 3", "!="),
        ("SUM(size) OVER LAST 1 MINUTE >= 0", "= 0"),
        ("NOT (AVG(size) OVER LAST 1 MINUTE > 5)", "NULL"),
        ("NOT (COUNT(*) OVER LAST 10 SECONDS > 5)", "= 0"),
        ("SUM(price) OVER LAST 1 MINUTE > 100", "negative"),
        ("AVG(size) OVER LAST 1 MINUTE > 100", "no collective index"),
        ("COUNT(DISTINCT exchange) OVER LAST 1 MINUTE > 2", "no collective index"),
        ("COUNT(*) OVER LAST 5 ROWS > 2", "suffix time window"),
        ("COUNT(*) OVER 2 MINUTES TO 1 MINUTE AGO > 2", "suffix time window"),
        ("COUNT(*) OVER LAST 10 SECONDS > COUNT(*) OVER LAST 5 SECONDS", "not a threshold"),
        ("COUNT(*) OVER LAST 10 SECONDS > 1 / 0", "NULL"),
    ],
)
def test_non_indexable_rules_run_over_the_key_domain(cond: str, reason: str) -> None:
    p = plan(cond)
    assert not p.driver, explain(p)
    assert reason in " ".join(a.reason for a in p.atoms)
    assert "key domain" in explain(p)


def test_or_needs_every_disjunct_indexable() -> None:
    p = plan("COUNT(*) OVER LAST 10 SECONDS > 5 OR SUM(size) OVER LAST 1 MINUTE > 1000")
    assert sorted(p.driver) == [0, 1]
    assert "disjunction" in p.why
    p = plan("COUNT(*) OVER LAST 10 SECONDS > 5 OR AVG(size) OVER LAST 1 MINUTE > 1000")
    assert p.driver == []
    p = plan(
        "(COUNT(*) OVER LAST 10 SECONDS > 5 AND AVG(size) OVER LAST 1 MINUTE > 10) "
        "OR (SUM(size) OVER LAST 1 MINUTE > 1000 AND MAX(price) OVER LAST 1 MINUTE > 1)"
    )
    assert sorted(p.atoms[i].text for i in p.driver) == [
        "COUNT(*) OVER LAST 10 SECONDS > 5",
        "SUM(size) OVER LAST 1 MINUTE > 1000",
    ]


def test_driver_is_the_most_selective_conjunct() -> None:
    # COUNT > 50 in 10 s needs 5 events/s; COUNT > 60 in 60 s needs 1 event/s
    p = plan("COUNT(*) OVER LAST 60 SECONDS > 60 AND COUNT(*) OVER LAST 10 SECONDS > 50")
    assert [p.atoms[i].text for i in p.driver] == ["COUNT(*) OVER LAST 10 SECONDS > 50"]
    assert "selectivity" in p.why
    # SUM(size) > 100000 in 60 s: ~16.7 events/s at a typical size of 100
    p = plan("COUNT(*) OVER LAST 10 SECONDS > 50 AND SUM(size) OVER LAST 60 SECONDS > 100000")
    assert [p.atoms[i].text for i in p.driver] == ["SUM(size) OVER LAST 1 MINUTE > 100000"]


def test_single_atom_rules_are_flagged() -> None:
    assert plan("COUNT(*) OVER LAST 10 SECONDS > 5").single_atom
    assert not plan("COUNT(*) OVER LAST 10 SECONDS > 5 AND MAX(price) OVER LAST 1 MINUTE > 1").single_atom
    assert not plan("AVG(size) OVER LAST 1 MINUTE > 1").single_atom


def test_where_and_filter_make_the_index_predicate() -> None:
    p = plan("SUM(size) FILTER (WHERE side = 'ASK') OVER LAST 1 MINUTE > 1000", where="exchange = 'NASDAQ'")
    atom = p.atoms[p.driver[0]]
    assert atom.index == ("sum", "exchange = 'NASDAQ' AND side = 'ASK'", "size")
    # the same predicate written in another order shares the structure
    q = compile_rule(
        "SELECT symbol FROM trades WHERE side = 'ASK' GROUP BY symbol "
        "HAVING SUM(size) FILTER (WHERE exchange = 'NASDAQ') OVER LAST 1 MINUTE > 1000",
        get_settings(),
    )
    assert q.atoms[q.driver[0]].index == atom.index


def test_duplicate_aggregates_are_computed_once() -> None:
    p = compile_rule(
        HEAD + "LAST(price) OVER LAST 20 MINUTES BETWEEN 20 AND 200 "
        "AND LAST(price) OVER LAST 20 MINUTES < 0.98 * FIRST(price) OVER LAST 20 MINUTES",
        get_settings(),
    )
    assert [a.text for a in p.aggs] == [
        "LAST(price) OVER LAST 20 MINUTES",
        "FIRST(price) OVER LAST 20 MINUTES",
    ]
    assert {a.structure for a in p.aggs} == {("values", "TRUE", "price")}


def test_count_of_a_field_is_count_star() -> None:
    p = plan("COUNT(size) OVER LAST 10 SECONDS > 1 AND COUNT(*) OVER LAST 10 SECONDS < 9")
    assert len(p.aggs) == 1


def test_key_domain_window() -> None:
    assert (
        plan("AVG(size) OVER 5 MINUTES TO 1 MINUTE AGO > 1 AND COUNT(*) OVER LAST 1 MINUTE > 1").domain_ms
        == 300_000
    )
    assert plan("AVG(size) OVER LAST 3 ROWS > 1").domain_ms is None
    assert "every key seen so far" in explain(plan("AVG(size) OVER LAST 3 ROWS > 1"))


def test_explain_mentions_index_driver_and_post_check() -> None:
    text = explain(plan("COUNT(*) OVER LAST 10 SECONDS > 5 AND MAX(price) OVER LAST 1 MINUTE > 10"))
    assert "CI-COUNT" in text and "driver" in text and "post-check" in text
    assert "MIN/MAX structure" in text


def test_plan_json_round_trip_keeps_everything() -> None:
    p = plan(
        "COUNT(*) OVER LAST 10 SECONDS > 5 OR NOT (AVG(price) OVER LAST 3 ROWS > 2)", where="side = 'ASK'"
    )
    q = Plan.from_json(p.to_json())
    assert q.to_json() == p.to_json()
    assert q.cond == p.cond and q.driver == p.driver
    with pytest.raises(ValueError):
        Plan.from_json({**p.to_json(), "version": 99})
