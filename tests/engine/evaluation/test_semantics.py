"""Hand-computed semantics of RULES.md: NULLs, empty windows, ties, historical and ROWS windows,
the key domain -- checked with both strategies (which must agree)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.evaluation.evaluator import Evaluator
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings

HEAD = "SELECT symbol FROM trades GROUP BY symbol HAVING "
ASK_HEAD = "SELECT symbol FROM trades WHERE side = 'ASK' GROUP BY symbol HAVING "


def ev_batch(rows: list[tuple]) -> dict[str, np.ndarray]:
    """rows: (symbol, ts, price, size, side[, exchange])."""
    cols = {
        "symbol": np.array([r[0] for r in rows], dtype=object),
        "ts": np.array([r[1] for r in rows], dtype=np.int64),
        "price": np.array([float(r[2]) for r in rows]),
        "size": np.array([r[3] for r in rows], dtype=np.int64),
        "side": np.array([r[4] for r in rows], dtype=object),
        "exchange": np.array([r[5] if len(r) > 5 else "NASDAQ" for r in rows], dtype=object),
    }
    return cols


def results(rule: str, rows: list[tuple], taus: list[int], batches: int = 1) -> list[set[str]]:
    """Result set of the rule at each tau (events with ts <= tau applied), for both strategies."""
    out: dict[str, list[set[str]]] = {}
    for strategy in ("shared", "naive"):
        ev = Evaluator(strategy, ci_p=2)
        ev.add_rule("r", compile_rule(rule, get_settings()))
        got = []
        applied = 0
        rows_sorted = sorted(range(len(rows)), key=lambda i: rows[i][1])
        for tau in taus:
            todo = [rows[i] for i in rows_sorted[applied:] if rows[i][1] <= tau]
            # keep arrival order within equal ts: rows_sorted is a stable sort
            if todo:
                for part in np.array_split(np.arange(len(todo)), min(batches, len(todo))):
                    if len(part):
                        ev.apply("trades", ev_batch([todo[i] for i in part]))
                applied += len(todo)
            got.append(ev.lookup(tau)["r"])
        out[strategy] = got
    assert out["shared"] == out["naive"]
    return out["shared"]


# ---------------------------------------------------------------- empty windows and NULLs
ROWS_AB = [("A", 1000, 10, 100, "BID"), ("B", 2000, 20, 50, "ASK")]


def test_count_and_sum_over_an_empty_filtered_window_are_zero() -> None:
    r = results(HEAD + "COUNT(*) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS = 0", ROWS_AB, [5000])
    assert r == [{"A"}]
    r = results(HEAD + "SUM(size) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS < 1", ROWS_AB, [5000])
    assert r == [{"A"}]


def test_keys_without_events_in_the_window_are_not_in_the_domain() -> None:
    rule = HEAD + "COUNT(*) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS = 0"
    # at 11500 the window is (1500, 11500]: A's only event (1000) is out, B's (2000) is in
    # at 12000 the window is (2000, 12000]: both are out -- the domain is empty
    assert results(rule, ROWS_AB, [5000, 11000, 11500, 12000]) == [{"A"}, set(), set(), set()]


def test_domain_is_taken_before_where() -> None:
    r = results(ASK_HEAD + "COUNT(*) OVER LAST 10 SECONDS = 0", ROWS_AB, [5000])
    assert r == [{"A"}]  # A has a BID event in the window: in the domain, with no ASK event


def test_domain_uses_the_longest_window() -> None:
    rows = [("A", 1000, 10, 1, "BID"), ("B", 14_000, 10, 1, "BID")]
    rule = HEAD + "COUNT(*) OVER LAST 5 SECONDS = 0 AND SUM(size) OVER LAST 20 SECONDS >= 0"
    # 15000: A is in (-5000, 15000] with no event in (10000, 15000]; B has one there
    # 20999: (999, 20999] holds both; neither has an event in (15999, 20999]
    # 21000: A's event (1000) left the 20 s domain window
    assert results(rule, rows, [15_000, 20_999, 21_000]) == [{"A"}, {"A", "B"}, {"B"}]


def test_avg_of_an_empty_set_is_null() -> None:
    base = "AVG(size) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS"
    assert results(HEAD + f"{base} > 5", ROWS_AB, [5000]) == [{"B"}]
    assert results(HEAD + f"{base} <= 5", ROWS_AB, [5000]) == [set()]
    # two-valued NOT: NOT of a NULL comparison is true
    assert results(HEAD + f"NOT ({base} > 5)", ROWS_AB, [5000]) == [{"A"}]
    assert results(HEAD + f"NOT ({base} <= 5)", ROWS_AB, [5000]) == [{"A", "B"}]


@pytest.mark.parametrize("func", ["AVG", "MIN", "MAX", "FIRST", "LAST"])
def test_null_aggregates_make_comparisons_false(func: str) -> None:
    agg = f"{func}(price) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS"
    assert results(HEAD + f"{agg} = {agg}", ROWS_AB, [5000]) == [{"B"}]
    assert results(HEAD + f"{agg} != 1000", ROWS_AB, [5000]) == [{"B"}]
    assert results(HEAD + f"NOT ({agg} = {agg})", ROWS_AB, [5000]) == [{"A"}]


def test_arithmetic_with_null_is_null() -> None:
    agg = "MAX(price) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS"
    assert results(HEAD + f"{agg} - 1 < 100", ROWS_AB, [5000]) == [{"B"}]
    assert results(HEAD + f"0 * {agg} = 0", ROWS_AB, [5000]) == [{"B"}]
    assert results(HEAD + f"NOT (-{agg} < 100)", ROWS_AB, [5000]) == [{"A"}]


def test_division_by_zero_is_null() -> None:
    ask = "COUNT(*) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS"
    rule = HEAD + f"SUM(size) OVER LAST 10 SECONDS / {ask} > 0"
    assert results(rule, ROWS_AB, [5000]) == [{"B"}]
    assert results(HEAD + f"NOT (SUM(size) OVER LAST 10 SECONDS / {ask} > 0)", ROWS_AB, [5000]) == [{"A"}]
    assert results(HEAD + "COUNT(*) OVER LAST 10 SECONDS > 1 / 0", ROWS_AB, [5000]) == [set()]
    assert results(HEAD + "NOT (COUNT(*) OVER LAST 10 SECONDS > 1 / 0)", ROWS_AB, [5000]) == [{"A", "B"}]


# ---------------------------------------------------------------- windows
def test_time_window_is_open_on_the_left_closed_on_the_right() -> None:
    rows = [("A", 0, 1, 1, "BID"), ("A", 10_000, 1, 1, "BID"), ("A", 10_001, 1, 1, "BID")]
    rule = HEAD + "COUNT(*) OVER LAST 10 SECONDS = 1"
    # 10000: (0, 10000] holds only ts 10000; 10001: (1, 10001] holds 10000 and 10001;
    # 20000: (10000, 20000] holds 10001 only; 20001: nothing left, A is out of the domain
    assert results(rule, rows, [10_000, 10_001, 20_000, 20_001]) == [{"A"}, set(), {"A"}, set()]


def test_historical_window() -> None:
    rows = [
        ("A", 1000, 1, 1, "BID"),
        ("A", 5000, 1, 2, "BID"),
        ("A", 12_000, 1, 4, "BID"),
        ("A", 15_000, 1, 8, "BID"),
    ]
    hist = "SUM(size) OVER 20 SECONDS TO 10 SECONDS AGO"
    # tau 21000: (1000, 11000] -> 2; tau 25000: (5000, 15000] -> 12; tau 30000: (10000, 20000] -> 12
    assert results(HEAD + f"{hist} = 2", rows, [21_000, 25_000]) == [{"A"}, set()]
    assert results(HEAD + f"{hist} = 12", rows, [21_000, 25_000, 30_000]) == [set(), {"A"}, {"A"}]
    # events only in the recent part: in the domain, historical sum 0, historical AVG NULL
    recent = [("B", 29_000, 1, 5, "BID")]
    assert results(HEAD + f"{hist} = 0", recent, [30_000]) == [{"B"}]
    assert results(HEAD + "AVG(size) OVER 20 SECONDS TO 10 SECONDS AGO >= 0", recent, [30_000]) == [set()]


def test_rows_window_counts_events_after_where_and_filter() -> None:
    rows = [
        ("A", 1000, 1, 10, "ASK"),
        ("A", 2000, 1, 100, "BID"),
        ("A", 3000, 1, 20, "ASK"),
        ("A", 4000, 1, 30, "ASK"),
        ("A", 5000, 1, 1000, "BID"),
    ]
    avg2 = "AVG(size) FILTER (WHERE side = 'ASK') OVER LAST 2 ROWS"
    assert results(HEAD + f"{avg2} = 25", rows, [5000]) == [{"A"}]
    assert results(ASK_HEAD + "SUM(size) OVER LAST 3 ROWS = 60", rows, [5000]) == [{"A"}]
    assert results(HEAD + "SUM(size) OVER LAST 3 ROWS = 1050", rows, [5000]) == [{"A"}]
    # fewer rows than n: the window holds what there is
    assert results(HEAD + "COUNT(*) OVER LAST 10 ROWS = 5", rows, [5000]) == [{"A"}]
    assert results(
        HEAD + "FIRST(size) OVER LAST 2 ROWS = 30 AND LAST(size) OVER LAST 2 ROWS = 1000", rows, [5000]
    ) == [{"A"}]
    assert results(
        HEAD + "MIN(size) OVER LAST 4 ROWS = 20 AND MAX(size) OVER LAST 4 ROWS = 1000", rows, [5000]
    ) == [{"A"}]


def test_rows_only_rule_considers_every_key_seen_so_far() -> None:
    rows = [("A", 1000, 1, 10, "ASK"), ("B", 2000, 1, 10, "BID")]
    rule = HEAD + "COUNT(*) FILTER (WHERE side = 'ASK') OVER LAST 3 ROWS = 0"
    assert results(rule, rows, [2000, 10**9]) == [{"B"}, {"B"}]
    assert results(HEAD + "SUM(size) OVER LAST 1 ROW = 10", rows, [10**9]) == [{"A", "B"}]


# ---------------------------------------------------------------- ties and order
def test_first_last_ties_keep_arrival_order() -> None:
    rows = [("A", 1000, 10, 1, "BID"), ("A", 1000, 20, 1, "BID"), ("A", 1000, 30, 1, "BID")]
    rule = HEAD + "FIRST(price) OVER LAST 10 SECONDS = 10 AND LAST(price) OVER LAST 10 SECONDS = 30"
    assert results(rule, rows, [1000]) == [{"A"}]
    assert results(rule, rows, [1000], batches=3) == [{"A"}]


def test_batch_in_any_order_is_applied_in_ts_order() -> None:
    ev = Evaluator("shared", ci_p=2)
    ev.add_rule(
        "r",
        compile_rule(
            HEAD + "FIRST(price) OVER LAST 10 SECONDS = 10 AND LAST(price) OVER LAST 10 SECONDS = 5",
            get_settings(),
        ),
    )
    ev.apply(
        "trades", ev_batch([("A", 2000, 5, 1, "BID"), ("A", 1000, 10, 1, "BID"), ("A", 1000, 20, 1, "BID")])
    )
    assert ev.lookup(2000)["r"] == {"A"}
    with pytest.raises(ValueError):  # older than what the key already has
        ev.apply("trades", ev_batch([("A", 1500, 1, 1, "BID")]))


# ---------------------------------------------------------------- aggregates
def test_count_distinct_min_max() -> None:
    rows = [
        ("A", 1000, 10, 1, "BID", "NYSE"),
        ("A", 2000, 30, 1, "BID", "NASDAQ"),
        ("A", 3000, 20, 1, "ASK", "NYSE"),
        ("B", 3000, 5, 1, "ASK", "ARCA"),
    ]
    assert results(HEAD + "COUNT(DISTINCT exchange) OVER LAST 10 SECONDS = 2", rows, [5000]) == [{"A"}]
    assert results(HEAD + "COUNT(DISTINCT exchange) OVER LAST 2 SECONDS = 2", rows, [3000]) == [{"A"}]
    assert results(HEAD + "COUNT(DISTINCT exchange) OVER LAST 2 SECONDS = 1", rows, [4000]) == [{"A", "B"}]
    assert results(HEAD + "COUNT(DISTINCT price) OVER LAST 10 SECONDS = 3", rows, [5000]) == [{"A"}]
    assert results(
        HEAD + "MAX(price) OVER LAST 10 SECONDS - MIN(price) OVER LAST 10 SECONDS = 20", rows, [5000]
    ) == [{"A"}]
    assert results(HEAD + "MAX(price) OVER LAST 2500 MILLISECONDS = 30", rows, [3000]) == [{"A"}]
    assert results(HEAD + "MAX(price) OVER LAST 2500 MILLISECONDS = 30", rows, [4500]) == [set()]


def test_thresholds_exact_at_the_boundary() -> None:
    rows = [("A", t, 1, 100, "BID") for t in range(1000, 11_000, 1000)]  # 10 events, sum 1000
    assert results(HEAD + "COUNT(*) OVER LAST 10 SECONDS >= 10", rows, [10_000]) == [{"A"}]
    assert results(HEAD + "COUNT(*) OVER LAST 10 SECONDS > 10", rows, [10_000]) == [set()]
    assert results(HEAD + "SUM(size) OVER LAST 10 SECONDS = 1000", rows, [10_000]) == [{"A"}]
    assert results(HEAD + "SUM(size) OVER LAST 10 SECONDS > 999.5", rows, [10_000]) == [{"A"}]
    assert results(
        HEAD + "COUNT(*) OVER LAST 10 SECONDS BETWEEN 9 AND 10", rows, [10_000, 10_999, 11_000]
    ) == [
        {"A"},
        {"A"},
        {"A"},
    ]


def test_or_with_a_disjunct_satisfied_by_zero() -> None:
    rows = [("A", 1000, 1, 1, "BID"), ("B", 1000, 1, 1, "ASK")] + [
        ("C", 1000 + i, 1, 1, "ASK") for i in range(10)
    ]
    rule = (
        HEAD
        + "COUNT(*) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS > 5 OR COUNT(*) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS = 0"
    )
    assert results(rule, rows, [5000]) == [{"A", "C"}]


# ---------------------------------------------------------------- PSoup and rule changes
def test_new_rule_is_evaluated_against_state_already_held() -> None:
    rows = [("A", t, 1, 100, "ASK") for t in range(1000, 9000, 1000)] + [("B", 5000, 1, 1, "BID")]
    old = HEAD + "COUNT(*) OVER LAST 10 SECONDS > 0"
    new = ASK_HEAD + "SUM(size) OVER LAST 10 SECONDS >= 700 AND MAX(price) OVER LAST 3 ROWS = 1"
    for strategy in ("shared", "naive"):
        ev = Evaluator(strategy, ci_p=2)
        ev.add_rule("old", compile_rule(old, get_settings()))
        ev.apply("trades", ev_batch(rows))
        assert ev.lookup(9000)["old"] == {"A", "B"}
        ev.add_rule(
            "new", compile_rule(new, get_settings())
        )  # needs structures nobody had: built from history
        assert ev.evaluate_now("new", 9000) == {"A"}
        assert ev.lookup(9000)["new"] == {"A"}
        ev.remove_rule("new")
        assert set(ev.lookup(9000)) == {"old"}


def test_structures_are_shared_between_rules() -> None:
    ev = Evaluator("shared", ci_p=2)
    for i in range(50):
        ev.add_rule(
            f"c{i}", compile_rule(HEAD + f"COUNT(*) OVER LAST {10 + i} SECONDS > {i}", get_settings())
        )
        ev.add_rule(
            f"s{i}", compile_rule(ASK_HEAD + f"SUM(size) OVER LAST 1 MINUTE > {100 * i}", get_settings())
        )
    counts = ev.structure_counts()
    # one R-INT + one CI-COUNT for COUNT(*), one R-INT + one CI-SUM for SUM(size) WHERE side = 'ASK'
    assert counts == {"count": 1, "ci_count": 1, "values": 1, "ci_sum": 1}
    for i in range(50):
        ev.remove_rule(f"c{i}")
    assert ev.structure_counts() == {"values": 1, "ci_sum": 1}


def test_lookup_reports_enter_and_exit_changes() -> None:
    rows = [("A", 1000, 1, 1, "BID"), ("A", 2000, 1, 1, "BID"), ("B", 5000, 1, 1, "BID")]
    ev = Evaluator("shared", ci_p=2)
    ev.add_rule("r", compile_rule(HEAD + "COUNT(*) OVER LAST 3 SECONDS >= 2", get_settings()))
    ev.apply("trades", ev_batch(rows[:2]))
    ch = ev.step(2000)
    assert ch.rows() == [(2000, "r", "A", "ENTER")]
    ev.apply("trades", ev_batch(rows[2:]))
    assert ev.step(5000).rows() == [(5000, "r", "A", "EXIT")]
    assert ev.step(6000).rows() == []


def test_count_is_served_by_the_value_rint_of_the_same_predicate() -> None:
    ev = Evaluator("shared", ci_p=2)
    ev.add_rules(
        [
            ("c", compile_rule(ASK_HEAD + "COUNT(*) OVER LAST 10 SECONDS > 1", get_settings())),
            ("s", compile_rule(ASK_HEAD + "SUM(size) OVER LAST 10 SECONDS > 10", get_settings())),
        ]
    )
    assert ev.structure_counts() == {"values": 1, "ci_count": 1, "ci_sum": 1}
    ev.apply(
        "trades", ev_batch([("A", 1000, 1, 10, "ASK"), ("A", 2000, 1, 5, "ASK"), ("B", 2000, 1, 50, "ASK")])
    )
    assert ev.lookup(2000) == {"c": {"A"}, "s": {"A", "B"}}
    ev.remove_rule("s")  # the value R-INT still serves the COUNT
    assert ev.structure_counts() == {"values": 1, "ci_count": 1}
    assert ev.lookup(3000) == {"c": {"A"}}


def test_rule_over_the_key_domain_added_after_index_driven_rules() -> None:
    """The domain R-INT starts being kept when a rule needs it, filled from history (PSoup)."""
    rows = [("A", 1000, 1, 100, "ASK"), ("B", 4000, 1, 1, "BID"), ("C", 9000, 1, 7, "BID")]
    driven = HEAD + "COUNT(*) OVER LAST 10 SECONDS > 0"
    domain = HEAD + "NOT (AVG(size) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS > 5)"
    ev = Evaluator("shared", ci_p=2)
    ev.add_rule("driven", compile_rule(driven, get_settings()))
    ev.apply("trades", ev_batch(rows))
    assert ev.lookup(9000)["driven"] == {"A", "B", "C"}
    ev.add_rule("domain", compile_rule(domain, get_settings()))
    assert ev.evaluate_now("domain", 9000) == {"B", "C"}
    assert ev.lookup(10_500)["domain"] == {"B", "C"}  # A's event left (500, 10500]


@pytest.mark.parametrize("strategy", ["shared", "naive"])
def test_rows_rule_added_late_reads_events_a_time_window_had_expired(strategy: str) -> None:
    """A ROWS window reads the key's last n events however old. A rule added late that shares a
    structure kept (and expired) for a 1 s window alone gets it rebuilt from history (found by
    Hypothesis in ``test_eval_panes``: the raw path said COUNT = 0 where brute force says 1)."""
    ev = Evaluator(strategy, ci_p=2, history_ms=10**9)
    ev.add_rule("time", compile_rule(HEAD + "COUNT(*) OVER LAST 1 SECONDS > 0", get_settings()))
    ev.apply("trades", ev_batch([("A", 0, 1, 1, "BID")]))
    for now in (0, 500, 1000):
        ev.step(now)  # the 1 s horizon expires A's event from the shared structure
    ev.add_rule("rows", compile_rule(HEAD + "COUNT(*) OVER LAST 1 ROWS BETWEEN 1 AND 3", get_settings()))
    assert ev.values("rows", ["A"], 1500)["A"] == {"COUNT(*) OVER LAST 1 ROWS": 1}
    assert ev.step(1500).rows() == [(1500, "rows", "A", "ENTER")]
