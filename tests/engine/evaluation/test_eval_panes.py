"""Pane rows into the evaluator: identical results to raw events for lookups at pane boundaries.

Random rules (the generators of ``test_property``: every aggregate, FILTERs, historical, ROWS and
millisecond windows, which panes cannot serve) x random trade and packet streams:

* ``Evaluator(pane_ms=g).apply`` (pre-aggregating internally) == the brute-force reference;
* the engine's path -- ``pane_spec`` -> :func:`engine.evaluation.panes.aggregate` -> ``apply_panes`` (+ the
  raw events when ``needs_raw``) -- == raw events, lookup by lookup, also for a rule added
  half-way (PSoup backfill from the retained pane rows / raw events);
* ``values`` returns the aggregates each rule's atoms compare.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.evaluation.backtest import EventFile, iter_alerts, lookup_times
from engine.evaluation.evaluator import Evaluator
from engine.evaluation.panes import aggregate
from subscriptions.compiler import compile_rule
from tests.engine.evaluation.test_property import (
    Reference,
    packet_events,
    reference_alerts,
    rules,
    to_file,
    trade_events,
)
from tidewatch.settings import get_settings


def _run_backtest(
    strategy: str,
    named: list[tuple[str, str]],
    files: list[EventFile],
    every: int,
    p: int,
    pane_ms: int | None,
) -> list[tuple]:
    plans = [(n, t, compile_rule(t, get_settings())) for n, t in named]
    ev = Evaluator(strategy, ci_p=p, pane_ms=pane_ms)
    return list(iter_alerts(plans, files, every, evaluator=ev))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    rule_texts=st.lists(rules(), min_size=1, max_size=4),
    trades=trade_events(),
    packets=packet_events(),
    every=st.sampled_from([500, 1000, 1500]),
    p=st.sampled_from([1, 2, 8]),
    strategy=st.sampled_from(["shared", "naive"]),
)
def test_pane_fed_evaluator_equals_brute_force(
    rule_texts: list[str],
    trades: list[dict[str, Any]],
    packets: list[dict[str, Any]],
    every: int,
    p: int,
    strategy: str,
) -> None:
    named = [(f"r{i}", t) for i, t in enumerate(rule_texts)]
    files = [to_file("trades", trades), to_file("packets", packets)]
    expect = reference_alerts(named, {"trades": trades, "packets": packets}, every)
    assert _run_backtest(strategy, named, files, every, p, pane_ms=every) == expect


def _drive_panes(
    ev: Evaluator,
    files: list[EventFile],
    taus: np.ndarray,
    g: int,
    add_at: int | None,
    late: list[tuple[str, str]],
    keep_raw: bool,
) -> list[Any]:
    """The engine's loop: per pane, per stream and key field, spec -> aggregate -> apply_panes
    (raw events given when the spec needs them, or always with ``keep_raw``: PSoup backfill of
    predicates that no column set aggregated yet needs them)."""
    out: list[Any] = []
    starts = {f.stream: 0 for f in files}
    for j, tau in enumerate(taus):
        if add_at is not None and j == add_at:
            for name, text in late:
                ev.add_rule(name, compile_rule(text, get_settings()))
        for f in files:
            a = starts[f.stream]
            b = int(np.searchsorted(f.cols["ts"], tau, side="right"))
            starts[f.stream] = b
            if b == a:
                continue
            batch = {k: v[a:b] for k, v in f.cols.items()}
            specs = ev.pane_specs(f.stream)
            if not specs:  # no rule reads the stream: nothing to feed, history kept for later rules
                ev.apply(f.stream, batch)
            for spec in specs:
                assert spec.pane_ms == g
                rows = aggregate(batch, spec, g)
                assert set(np.asarray(rows.pane).tolist()) <= {int(tau)}  # one pane per lookup
                ev.apply_panes(
                    f.stream, rows, key=spec.key, raw=batch if spec.needs_raw or keep_raw else None
                )
        out.append(ev.step(int(tau)).rows())
        out.append({n: sorted(ev.current_ids(n)) for n, _ in late if n in ev.rules})
    return out


def _drive_raw(
    ev: Evaluator, files: list[EventFile], taus: np.ndarray, add_at: int | None, late: list[tuple[str, str]]
) -> list[Any]:
    out: list[Any] = []
    starts = {f.stream: 0 for f in files}
    for j, tau in enumerate(taus):
        if add_at is not None and j == add_at:
            for name, text in late:
                ev.add_rule(name, compile_rule(text, get_settings()))
        for f in files:
            a = starts[f.stream]
            b = int(np.searchsorted(f.cols["ts"], tau, side="right"))
            starts[f.stream] = b
            if b > a:
                ev.apply(f.stream, {k: v[a:b] for k, v in f.cols.items()})
        out.append(ev.step(int(tau)).rows())
        out.append({n: sorted(ev.current_ids(n)) for n, _ in late if n in ev.rules})
    return out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    rule_texts=st.lists(rules(), min_size=1, max_size=4),
    late_texts=st.lists(rules(), min_size=0, max_size=2),
    trades=trade_events(),
    packets=packet_events(),
    g=st.sampled_from([500, 1000]),
    add_frac=st.floats(0.0, 1.0),
    strategy=st.sampled_from(["shared", "naive"]),
)
def test_apply_panes_equals_raw_events_at_pane_boundaries(
    rule_texts: list[str],
    late_texts: list[str],
    trades: list[dict[str, Any]],
    packets: list[dict[str, Any]],
    g: int,
    add_frac: float,
    strategy: str,
) -> None:
    files = [to_file("trades", trades), to_file("packets", packets)]
    taus = lookup_times(files, g)
    early = [(f"r{i}", compile_rule(t, get_settings())) for i, t in enumerate(rule_texts)]
    late = [(f"late{i}", t) for i, t in enumerate(late_texts)]
    add_at = int(add_frac * len(taus)) if late else None
    history = 10**9  # rules added half-way see the whole past (PSoup)
    raw_ev = Evaluator(strategy, ci_p=2, history_ms=history)
    raw_ev.add_rules(early)
    pane_ev = Evaluator(strategy, ci_p=2, history_ms=history, pane_ms=g)
    pane_ev.add_rules(early)
    want = _drive_raw(raw_ev, files, taus, add_at, late)
    got = _drive_panes(pane_ev, files, taus, g, add_at, late, keep_raw=bool(late))
    assert got == want
    # and the rules added half-way have, from then on, the brute-force result
    events = {"trades": trades, "packets": packets}
    for name, text in late:
        ref = Reference(text)
        for j in range(add_at or 0, len(taus)):
            assert got[2 * j + 1][name] == sorted(ref.result(events[ref.rule.stream], int(taus[j]))), (
                name,
                j,
            )


def _ev_with(rule: str, events: list[dict[str, Any]], pane_ms: int | None) -> Evaluator:
    ev = Evaluator("shared", ci_p=2, pane_ms=pane_ms)
    ev.add_rule("r", compile_rule(rule, get_settings()))
    f = to_file("trades", events)
    for tau in lookup_times([f], 1000):
        sel = (f.cols["ts"] <= tau) & (f.cols["ts"] > tau - 1000)
        if sel.any():
            ev.apply("trades", {k: v[sel] for k, v in f.cols.items()})
        ev.step(int(tau))
    return ev


@pytest.mark.parametrize("pane_ms", [None, 1000])
def test_values_are_the_aggregates_of_the_atoms(pane_ms: int | None) -> None:
    rule = (
        "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 2 SECONDS > 1 "
        "AND SUM(size) OVER LAST 2 SECONDS >= 10 AND (AVG(price) FILTER (WHERE side = 'ASK') "
        "OVER LAST 5 SECONDS > 100 OR LAST(price) OVER LAST 3 ROWS < 5)"
    )
    base = {"price": 4.0, "side": "BID", "exchange": "X"}
    events = [
        {**base, "symbol": "A", "ts": 1000, "size": 7},
        {**base, "symbol": "A", "ts": 1500, "size": 5, "price": 3.0},
        {**base, "symbol": "A", "ts": 2000, "size": 1, "price": 2.0, "side": "ASK"},
        {**base, "symbol": "B", "ts": 2000, "size": 1},
    ]
    ev = _ev_with(rule, events, pane_ms)
    assert ev.current_ids("r") == ["A"]
    vals = ev.values("r", ["A", "B", "nobody"], 2000)
    assert vals["A"] == {
        "COUNT(*) OVER LAST 2 SECONDS": 3,
        "SUM(size) OVER LAST 2 SECONDS": 13.0,
        "AVG(price) FILTER (WHERE side = 'ASK') OVER LAST 5 SECONDS": 2.0,
        "LAST(price) OVER LAST 3 ROWS": 2.0,
    }
    assert vals["B"]["COUNT(*) OVER LAST 2 SECONDS"] == 1
    assert vals["B"]["AVG(price) FILTER (WHERE side = 'ASK') OVER LAST 5 SECONDS"] is None  # NULL
    assert vals["nobody"]["COUNT(*) OVER LAST 2 SECONDS"] == 0
    assert vals["nobody"]["LAST(price) OVER LAST 3 ROWS"] is None


def test_pane_spec_lists_column_sets_and_raw_needs() -> None:
    ev = Evaluator("shared", ci_p=2, pane_ms=1000)
    ev.add_rule(
        "a",
        compile_rule(
            "SELECT symbol FROM trades WHERE side = 'ASK' GROUP BY symbol HAVING SUM(size) OVER LAST 5 SECONDS > 3 "
            "AND MAX(price) OVER LAST 2 SECONDS < 9 AND COUNT(DISTINCT exchange) OVER LAST 2 SECONDS >= 2",
            get_settings(),
        ),
    )
    spec = ev.pane_spec("trades")
    assert spec.key == "symbol" and not spec.needs_raw and spec.pane_ms == 1000
    (cs,) = spec.column_sets
    assert cs.name == "side = 'ASK'" and cs.predicate is not None
    assert cs.sums == ("size",) and cs.minmax == ("price",) and cs.distinct == ("exchange",)
    ev.add_rule(
        "b",
        compile_rule(
            "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 3 ROWS > 1", get_settings()
        ),
    )
    assert ev.pane_spec("trades").needs_raw  # ROWS windows are served from raw events
    ev.add_rule(
        "c",
        compile_rule(
            "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(*) OVER LAST 1500 MILLISECONDS > 1",
            get_settings(),
        ),
    )
    assert ev.pane_spec("packets").needs_raw  # 1.5 s is not a whole number of 1 s panes
    with pytest.raises(KeyError):
        ev.pane_spec("packets", "dst_ip")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    rule_texts=st.lists(rules(), min_size=1, max_size=3),
    trades=trade_events(),
    packets=packet_events(),
    panes_per_lookup=st.sampled_from([2, 3]),
)
def test_batches_spanning_several_panes(
    rule_texts: list[str], trades: list[dict[str, Any]], packets: list[dict[str, Any]], panes_per_lookup: int
) -> None:
    """Lookups every 2-3 panes: each batch spans several panes (engine.evaluation.panes.aggregate path)."""
    named = [(f"r{i}", t) for i, t in enumerate(rule_texts)]
    files = [to_file("trades", trades), to_file("packets", packets)]
    g = 500
    every = g * panes_per_lookup
    want = _run_backtest("shared", named, files, every, 2, pane_ms=None)
    assert _run_backtest("shared", named, files, every, 2, pane_ms=g) == want
    assert _run_backtest("naive", named, files, every, 2, pane_ms=g) == want


def _with_codes(f: EventFile) -> EventFile:
    """The file with its string columns factorized over the whole file (as load_events does)."""
    import pandas as pd

    codes = {}
    for k, v in f.cols.items():
        if v.dtype == object:
            c, u = pd.factorize(v, sort=False)
            codes[k] = (c.astype(np.int64), np.asarray(u, dtype=object))
    return EventFile(f.stream, f.cols, [], codes)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    rule_texts=st.lists(rules(), min_size=1, max_size=3),
    trades=trade_events(),
    packets=packet_events(),
    every=st.sampled_from([500, 1000]),
)
def test_prefactorized_string_columns_give_the_same_alerts(
    rule_texts: list[str], trades: list[dict[str, Any]], packets: list[dict[str, Any]], every: int
) -> None:
    named = [(f"r{i}", t) for i, t in enumerate(rule_texts)]
    files = [to_file("trades", trades), to_file("packets", packets)]
    want = reference_alerts(named, {"trades": trades, "packets": packets}, every)
    coded = [_with_codes(f) for f in files]
    for strategy in ("shared", "naive"):
        assert _run_backtest(strategy, named, coded, every, 2, pane_ms=every) == want
        assert _run_backtest(strategy, named, coded, every, 2, pane_ms=None) == want
