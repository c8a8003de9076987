"""EngineCore with the real evaluator equals the backtest (same events, same lookup times); no services."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine.core import EngineCore
from engine.evaluation.backtest import EventFile, iter_alerts
from engine.evaluation.evaluator import Evaluator
from engine.messages import SubscriptionChange
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings
from tidewatch.wire.avro import encode_batch

G = 1000
RULES = {
    "count": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 10 SECONDS > 12",
    "sum": "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 20 SECONDS >= 900",
    "ask": "SELECT symbol FROM trades WHERE side = 'ASK' GROUP BY symbol "
    "HAVING SUM(size) OVER LAST 5 SECONDS > 200 AND AVG(price) OVER LAST 30 SECONDS < 55",
    "range": "SELECT symbol FROM trades GROUP BY symbol HAVING MAX(price) OVER LAST 15 SECONDS "
    "- MIN(price) OVER LAST 15 SECONDS > 20",
    "drop": "SELECT symbol FROM trades GROUP BY symbol HAVING LAST(price) OVER LAST 8 SECONDS "
    "< FIRST(price) OVER LAST 8 SECONDS",
    "quiet": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 6 SECONDS BETWEEN 1 AND 3",
}


def trades(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ts = 1_700_000_000_000 + np.sort(rng.integers(0, 120_000, n))
    return {
        "symbol": np.array([f"S{i}" for i in rng.integers(0, 12, n)], dtype=object),
        "ts": ts.astype(np.int64),
        "price": np.round(rng.uniform(30, 80, n), 2),
        "size": rng.integers(0, 100, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n),
        "exchange": np.array(["NASDAQ"] * n, dtype=object),
    }


def kafka_records(cols: dict[str, np.ndarray], lo: int, hi: int) -> pa.Table:
    part = {k: v[lo:hi] for k, v in cols.items()}
    vals = encode_batch("trades", part).messages()
    return pa.table(
        {
            "partition": pa.array(np.zeros(hi - lo, np.int32)),
            "offset": pa.array(np.arange(lo, hi, dtype=np.int64)),
            "value": pa.array(vals, pa.binary()),
        }
    )


def _compile(text: str, plan: object) -> tuple[object, str]:
    p = compile_rule(text, get_settings())
    return p, p.stream


def _evaluator(panes: bool, **kw: object) -> object:
    if panes:
        kw["pane_ms"] = G
    return Evaluator("shared", ci_p=2, **kw)  # type: ignore[arg-type]


def _window_value(cols: dict[str, np.ndarray], key: str, now: int, T: int, field: str | None) -> float:
    m = (cols["symbol"] == key) & (cols["ts"] > now - T) & (cols["ts"] <= now)
    return float(m.sum()) if field is None else float(cols[field][m].sum())


@pytest.mark.parametrize("panes", [False, True], ids=["raw", "panes"])
@pytest.mark.parametrize("seed", [1, 2])
def test_engine_core_equals_backtest(seed: int, panes: bool) -> None:
    cols = trades(3000, seed)
    core = EngineCore(
        pane_ms=G,
        allowed_lateness_ms=1500,
        max_future_ms=10**12,
        evaluator_factory=lambda: _evaluator(panes),  # type: ignore[arg-type, return-value]
        compile_rule=_compile,
    )
    changes = [SubscriptionChange(n, "upsert", n, t) for n, t in RULES.items()]
    got, alerts = [], []
    bounds = np.linspace(0, len(cols["ts"]), 25).astype(int)
    for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        out = core.process(b, {"trades": kafka_records(cols, lo, hi)}, changes if b == 0 else [])
        assert len(out.dead) == 0
        got += [(a.as_of, a.subscription_id, a.key, a.kind) for a in out.alerts]
        alerts += out.alerts
        if b == 11:  # snapshot / restore half-way: nothing changes
            core = EngineCore.from_bytes(core.to_bytes(), compile_rule=_compile)
    rules = [(n, t, compile_rule(t, get_settings())) for n, t in RULES.items()]
    until = core.applied_until
    assert until is not None
    expect = [r for r in iter_alerts(rules, [EventFile("trades", cols)], G, ci_p=2) if r[0] <= until]
    assert len(expect) > 50
    assert sorted(got) == sorted(expect)
    assert {r[1] for r in expect} == set(RULES)
    # every alert carries the values that made it fire, equal to brute force over the raw events
    checked = 0
    for a in alerts:
        if a.subscription_id == "count":
            v = a.values["COUNT(*) OVER LAST 10 SECONDS"]
            assert v == _window_value(cols, a.key, a.as_of, 10_000, None)
            assert (v > 12) == (a.kind == "ENTER")
            checked += 1
        elif a.subscription_id == "sum":
            v = a.values["SUM(size) OVER LAST 20 SECONDS"]
            assert v == _window_value(cols, a.key, a.as_of, 20_000, "size")
            assert (v >= 900) == (a.kind == "ENTER")
            checked += 1
        elif a.subscription_id == "range":
            assert set(a.values) == {"MAX(price) OVER LAST 15 SECONDS", "MIN(price) OVER LAST 15 SECONDS"}
    assert checked > 20


def test_rule_added_mid_stream_gets_results_from_old_data() -> None:
    cols = trades(3000, 3)
    # the evaluator keeps 60 s of raw history, so a new 20 s rule sees all it needs (PSoup)
    core = EngineCore(
        pane_ms=G,
        allowed_lateness_ms=1500,
        max_future_ms=10**12,
        evaluator_factory=lambda: Evaluator("shared", ci_p=2, history_ms=60_000),
        compile_rule=_compile,
    )
    core.process(
        0,
        {"trades": kafka_records(cols, 0, 1500)},
        [SubscriptionChange("count", "upsert", "c", RULES["count"])],
    )
    tau = core.applied_until
    assert tau is not None
    out = core.process(
        1,
        {"trades": kafka_records(cols, 1500, 1500)},
        [SubscriptionChange("sum", "upsert", "s", RULES["sum"])],
    )
    first = {a.key for a in out.alerts if a.subscription_id == "sum" and a.as_of == tau and a.kind == "ENTER"}
    rules = [("sum", RULES["sum"], compile_rule(RULES["sum"], get_settings()))]
    ref: set[str] = set()
    for as_of, _, key, kind in iter_alerts(rules, [EventFile("trades", cols)], G, ci_p=2):
        if as_of > tau:
            break
        ref = ref | {key} if kind == "ENTER" else ref - {key}
    assert ref and first == ref
    # and from then on it is exact: continue both and compare
    got = [(a.as_of, a.subscription_id, a.key, a.kind) for a in out.alerts if a.as_of > tau]
    out = core.process(2, {"trades": kafka_records(cols, 1500, 3000)}, [])
    got += [(a.as_of, a.subscription_id, a.key, a.kind) for a in out.alerts if a.subscription_id == "sum"]
    until = core.applied_until
    assert until is not None
    expect = [r for r in iter_alerts(rules, [EventFile("trades", cols)], G, ci_p=2) if tau < r[0] <= until]
    assert sorted(got) == sorted(expect)


def test_snapshot_of_every_structure_kind() -> None:
    """COUNT DISTINCT, MIN/MAX, CI indexes: the snapshot round-trips and continuing is exact."""
    rules = {
        **RULES,
        "distinct": "SELECT symbol FROM trades GROUP BY symbol HAVING "
        "COUNT(DISTINCT size) OVER LAST 10 SECONDS > 10",
    }
    cols = trades(2000, 5)

    def run(split: int | None) -> list[tuple[int, str, str, str]]:
        core = EngineCore(
            pane_ms=G,
            allowed_lateness_ms=1500,
            max_future_ms=10**12,
            evaluator_factory=lambda: Evaluator("shared", ci_p=2),
            compile_rule=_compile,
        )
        got = []
        for b in range(10):
            lo, hi = b * 200, (b + 1) * 200
            ch = [SubscriptionChange(n, "upsert", n, t) for n, t in rules.items()] if b == 0 else []
            got += [
                (a.as_of, a.subscription_id, a.key, a.kind)
                for a in core.process(b, {"trades": kafka_records(cols, lo, hi)}, ch).alerts
            ]
            if b == split:
                core = EngineCore.from_bytes(core.to_bytes(), compile_rule=_compile)
        return got

    whole = run(None)
    assert any(r[1] == "distinct" for r in whole)
    assert run(4) == whole


def test_lookups_every_L_equal_backtest_every_L() -> None:
    """``lookup_every_ms = 3 g``: lookups at multiples of 3 s only, alerts = backtest --every 3 s."""
    cols = trades(3000, 4)
    L = 3 * G
    core = EngineCore(
        pane_ms=G,
        allowed_lateness_ms=1500,
        max_future_ms=10**12,
        evaluator_factory=lambda: _evaluator(True),  # type: ignore[arg-type, return-value]
        compile_rule=_compile,
        lookup_every_ms=L,
    )
    changes = [SubscriptionChange(n, "upsert", n, t) for n, t in RULES.items()]
    got, lookups = [], []
    bounds = np.linspace(0, len(cols["ts"]), 13).astype(int)
    for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        out = core.process(b, {"trades": kafka_records(cols, lo, hi)}, changes if b == 0 else [])
        got += [(a.as_of, a.subscription_id, a.key, a.kind) for a in out.alerts]
        lookups += out.lookups
    assert lookups and all(t % L == 0 for t in lookups) and np.all(np.diff(lookups) == L)
    rules = [(n, t, compile_rule(t, get_settings())) for n, t in RULES.items()]
    until = core.applied_until
    assert until is not None
    expect = [r for r in iter_alerts(rules, [EventFile("trades", cols)], L, ci_p=2) if r[0] <= until]
    assert len(expect) > 30
    assert sorted(got) == sorted(expect)
