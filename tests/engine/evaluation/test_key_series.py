"""The key page's series (:func:`engine.evaluation.key_series.key_series`) against brute force.

The evaluator is driven as the engine drives it (pane rows per micro-batch with their span,
a lookup at every pane boundary, retention = the longest window in use), then one key's series
is compared, point by point, with a plain loop over the events: for every lookup time the
events of the key in the aggregate's window satisfying WHERE and FILTER, aggregated in Python.
Points whose window reaches before the retained history must be marked partial; the others
must be exact.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.evaluation.evaluator import Evaluator
from engine.evaluation.key_series import NEEDS_RAW, chart_times, key_series
from engine.evaluation.panes import aggregate
from subscriptions import rule_ast as A
from subscriptions.compiler import AggSpec, Plan, compile_rule
from tests.engine.evaluation.test_property import _row_ok
from tidewatch.settings import get_settings

G = 1000
RULE_WHERE = (
    "SELECT symbol FROM trades WHERE exchange = 'X' GROUP BY symbol"
    " HAVING COUNT(*) OVER LAST 60 SECONDS > 3 AND SUM(size) OVER LAST 30 SECONDS > 10"
    " AND AVG(size) FILTER (WHERE side = 'ASK') OVER LAST 60 SECONDS > 1"
    " AND MIN(price) OVER LAST 20 SECONDS > 0 AND MAX(price) OVER 60 SECONDS TO 10 SECONDS AGO > 0"
)
RULE_ALL = (
    "SELECT symbol FROM trades GROUP BY symbol HAVING FIRST(price) OVER LAST 40 SECONDS > 0"
    " AND LAST(price) OVER LAST 40 SECONDS > 0 AND COUNT(DISTINCT side) OVER LAST 30 SECONDS > 1"
)


def _events(seed: int, seconds: int = 240, n: int = 3000) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(1, seconds * 1000, n))
    return [
        {
            "symbol": str(rng.choice(["AAA", "BBB", "CCC"])),
            "ts": int(t),
            "price": int(rng.integers(50, 1000)) / 100,
            "size": int(rng.integers(0, 500)),
            "side": str(rng.choice(["BID", "ASK", "UNKNOWN"])),
            "exchange": str(rng.choice(["X", "Y"])),
        }
        for t in ts
    ]


def _cols(events: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    names = ["symbol", "ts", "price", "size", "side", "exchange"]
    out = {k: np.array([e[k] for e in events], dtype=object) for k in names}
    out["ts"] = out["ts"].astype(np.int64)
    out["price"] = out["price"].astype(np.float64)
    out["size"] = out["size"].astype(np.int64)
    return out


def _run_engine_like(
    plans: dict[str, Plan], events: list[dict[str, Any]], mode: str, history_ms: int | None = None
) -> tuple[Evaluator, int]:
    """The evaluator fed one micro-batch per second as the engine feeds it; its last lookup time."""
    ev = Evaluator("shared", ci_p=2, pane_ms=G, history_ms=history_ms)
    for name, plan in plans.items():
        ev.add_rule(name, plan)
    cols = _cols(events)
    ts = cols["ts"]
    end = int(ts.max()) // G * G + G
    prev = -(2**62)
    for tau in range(G, end + G, G):
        sel = np.flatnonzero((ts > tau - G) & (ts <= tau))
        batch = {k: v[sel] for k, v in cols.items()}
        if sel.shape[0]:
            if mode == "panes":
                rows = aggregate(batch, ev.pane_spec("trades"), G)
                ev.apply_panes("trades", rows, span=(prev, tau))
            else:
                ev.apply("trades", batch)
        prev = tau
        ev.step(tau)
    return ev, end


def _brute(agg: AggSpec, events: list[dict[str, Any]], key: str, tau: int) -> float:
    """One aggregate at one lookup time, by a plain loop over the events (RULES.md semantics;
    the aggregate's predicate is its WHERE AND FILTER)."""
    rows = [e for e in events if e["symbol"] == key and _row_ok(agg.predicate, e)]
    w = agg.window
    assert isinstance(w, A.TimeWindow)
    vals = [e for e in rows if tau - w.start_ms < e["ts"] <= tau - w.end_ms]
    f = agg.func
    if f == "COUNT":
        return float(len(vals))
    if f == "DISTINCT":
        return float(len({e[str(agg.field)] for e in vals}))
    xs = [float(e[str(agg.field)]) for e in vals]
    if f == "SUM":
        return math.fsum(xs)
    if not xs:
        return math.nan
    return {
        "AVG": lambda: math.fsum(xs) / len(xs),
        "MIN": lambda: min(xs),
        "MAX": lambda: max(xs),
        "FIRST": lambda: xs[0],
        "LAST": lambda: xs[-1],
    }[f]()


def _check(ev: Evaluator, plan: Plan, events: list[dict[str, Any]], key: str, until: int) -> int:
    """Compare every whole point with brute force; the number of partial points."""
    got = key_series(ev.retained("trades"), plan, key, until, G)
    assert got.held_from is not None
    n_partial = 0
    for a, series in zip(plan.aggs, got.aggregates, strict=True):
        assert series.text == a.text and series.reason is None
        assert isinstance(a.window, A.TimeWindow)
        expect_partial = got.times - a.window.start_ms < got.held_from
        assert (series.partial == expect_partial).all(), a.text
        for t, v, part in zip(
            got.times.tolist(), series.values.tolist(), series.partial.tolist(), strict=True
        ):
            if part:
                n_partial += 1
                continue
            b = _brute(a, events, key, t)
            assert (math.isnan(v) and math.isnan(b)) or v == b, (a.text, t, v, b)
    return n_partial


@pytest.mark.parametrize("mode", ["panes", "raw"])
@pytest.mark.parametrize("text", [RULE_WHERE, RULE_ALL])
def test_series_equals_a_loop_over_the_events_and_marks_partial_points(mode: str, text: str) -> None:
    plan = compile_rule(text, get_settings())
    events = _events(seed=7)
    ev, until = _run_engine_like({"r": plan}, events, mode)
    # retention: the rule's longest window, so the oldest points' windows reach before it
    n_partial = _check(ev, plan, events, "AAA", until)
    assert n_partial > 0
    got = key_series(ev.retained("trades"), plan, "AAA", until, G)
    assert got.times[-1] == until and (np.diff(got.times) == G).all()
    assert not any(a.partial[-1] for a in got.aggregates)  # the last lookup's windows are held


def test_a_longer_retention_makes_every_point_whole() -> None:
    """With ``history_ms`` >= twice the rule's window (the engine's ``engine_history_ms``), no
    point of the chart is partial."""
    plan = compile_rule(RULE_WHERE, get_settings())
    events = _events(seed=3)
    ev, until = _run_engine_like({"r": plan}, events, "panes", history_ms=2 * 60_000)
    assert _check(ev, plan, events, "BBB", until) == 0


def test_a_key_never_seen_reads_as_empty_windows_and_rows_windows_need_raw_events() -> None:
    plan = compile_rule(
        "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 10 SECONDS > 1"
        " AND SUM(size) OVER LAST 5 ROWS > 3",
        get_settings(),
    )
    events = _events(seed=1, seconds=30, n=200)
    ev, until = _run_engine_like({"r": plan}, events, "panes")
    got = key_series(ev.retained("trades"), plan, "ZZZ", until, G)
    count, rows = got.aggregates
    assert (count.values == 0).all() and rows.reason == NEEDS_RAW and rows.values.shape[0] == 0
    ev, until = _run_engine_like({"r": plan}, events, "raw")
    got = key_series(ev.retained("trades"), plan, "AAA", until, G)
    assert got.aggregates[1].reason is None and got.aggregates[1].values.shape == got.times.shape


def test_lookup_times_are_pane_aligned_thinned_and_end_at_until() -> None:
    t = chart_times(1, 1_800_000, G, max_points=600)
    assert t[-1] == 1_800_000 and len(t) <= 600 and (t % G == 0).all() and t[0] >= 1
    assert chart_times(5, 900, G).shape == (0,)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    func=st.sampled_from(
        [
            "COUNT(*)",
            "SUM(size)",
            "AVG(size)",
            "MIN(price)",
            "MAX(price)",
            "FIRST(price)",
            "LAST(price)",
            "COUNT(DISTINCT exchange)",
        ]
    ),
    n=st.sampled_from([5, 10, 30]),
    m=st.sampled_from([0, 2]),
    where=st.sampled_from(["", "WHERE side = 'ASK' ", "WHERE size > 200 "]),
)
def test_property_random_events_and_aggregates(seed: int, func: str, n: int, m: int, where: str) -> None:
    window = f"OVER LAST {n} SECONDS" if m == 0 else f"OVER {n} SECONDS TO {m} SECONDS AGO"
    plan = compile_rule(
        f"SELECT symbol FROM trades {where}GROUP BY symbol HAVING {func} {window} > 1", get_settings()
    )
    events = _events(seed, seconds=60, n=300)
    ev, until = _run_engine_like({"r": plan}, events, "panes")
    _check(ev, plan, events, "CCC", until)
