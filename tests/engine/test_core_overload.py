"""EngineCore with the overload policy (engine/overload.py): strides forced or decided by the
controller, the alerts equal to the backtest at the lookup times actually used; no services."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.core import EngineCore
from engine.evaluation.backtest import EventFile, iter_alerts
from engine.evaluation.evaluator import Evaluator
from engine.messages import SubscriptionChange
from engine.overload import Marks, schedule
from subscriptions.compiler import compile_rule
from tests.engine.test_core_backtest import RULES, _compile, kafka_records, trades
from tidewatch.settings import get_settings

G = 1000
BUDGETS = {"count": 8_000, "sum": 4_000, "ask": 3_000, "range": None, "drop": None, "quiet": None}


def _core(L: int = G) -> EngineCore:
    return EngineCore(
        pane_ms=G,
        allowed_lateness_ms=1500,
        max_future_ms=10**12,
        evaluator_factory=lambda: Evaluator("shared", ci_p=2, pane_ms=G),
        compile_rule=_compile,
        lookup_every_ms=L,
    )


def _changes(budgets: dict[str, int | None]) -> list[SubscriptionChange]:
    return [
        SubscriptionChange(n, "upsert", n, t, staleness_budget_ms=budgets.get(n)) for n, t in RULES.items()
    ]


def _expect(cols: dict[str, np.ndarray], L: int, skip: Any, until: int) -> list[tuple[int, str, str, str]]:
    rules = [(n, t, compile_rule(t, get_settings())) for n, t in RULES.items()]
    return [r for r in iter_alerts(rules, [EventFile("trades", cols)], L, ci_p=2, skip=skip) if r[0] <= until]


def _rows(out: Any) -> list[tuple[int, str, str, str]]:
    return [(a.as_of, a.subscription_id, a.key, a.kind) for a in out.alerts]


def test_forced_strides_equal_the_backtest_at_the_lookup_times_used() -> None:
    """Strides changing from batch to batch (a snapshot and restore half-way): the alert log is
    the backtest's with each subscription looked up only at its grid times, and it differs from
    the unstrided backtest (the schedule matters)."""
    cols = trades(3000, 7)
    rng = np.random.default_rng(7)
    core = _core()
    got: list[tuple[int, str, str, str]] = []
    batches: list[tuple[list[int], dict[str, int]]] = []
    bounds = np.linspace(0, len(cols["ts"]), 25).astype(int)
    for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        forced = {"count": int(rng.choice([1, 2, 4, 8])), "sum": int(rng.choice([1, 2, 3, 4])), "ask": 3}
        out = core.process(
            b, {"trades": kafka_records(cols, lo, hi)}, _changes(BUDGETS) if b == 0 else [], strides=forced
        )
        assert out.strides == {k: v for k, v in forced.items() if v > 1}
        assert out.degraded == {
            k: {"every_ms": v * G, "budget_ms": BUDGETS[k]} for k, v in out.strides.items()
        }
        got += _rows(out)
        batches.append((out.lookups, out.strides))
        if b == 11:
            core = EngineCore.from_bytes(core.to_bytes(), compile_rule=_compile)
    until = core.applied_until
    assert until is not None
    expect = _expect(cols, G, schedule(batches, G), until)
    assert len(expect) > 50
    assert sorted(got) == sorted(expect)
    assert sorted(got) != sorted(_expect(cols, G, None, until))


def test_first_lookup_after_being_added_is_never_skipped() -> None:
    """A subscription added mid-stream with a stride is looked up at the first lookup time after
    it was added (its PSoup result diffed there), then on its grid only."""
    cols = trades(3000, 3)
    steps: list[tuple[int, frozenset[str]]] = []

    class Spy(Evaluator):
        def step(self, now: int, skip: frozenset[str] = frozenset()) -> Any:
            steps.append((now, skip))
            return super().step(now, skip)

    core = EngineCore(
        pane_ms=G,
        allowed_lateness_ms=1500,
        max_future_ms=10**12,
        evaluator_factory=lambda: Spy("shared", ci_p=2, history_ms=60_000),
        compile_rule=_compile,
    )
    core.process(
        0,
        {"trades": kafka_records(cols, 0, 1000)},
        [SubscriptionChange("count", "upsert", "c", RULES["count"])],
    )
    add = [SubscriptionChange("sum", "upsert", "s", RULES["sum"], staleness_budget_ms=10_000)]
    n = len(steps)
    out = core.process(1, {"trades": kafka_records(cols, 1000, 2000)}, add, strides={"sum": 7})
    taus = [t for t, _ in steps[n:]]
    assert taus == out.lookups and len(taus) > 8
    first = [t for t, off in steps[n:] if "sum" not in off]
    assert first[0] == taus[0] and taus[0] % (7 * G)  # off its grid, looked up all the same
    assert first[1:] == [t for t in taus[1:] if t % (7 * G) == 0]


def test_controller_degrades_in_budget_order_and_restores_in_reverse() -> None:
    """Overloaded batches raise the loosest budget's stride first, up to budget // L; calm
    batches undo the steps in reverse; the budgets come from the subscription changes."""
    cols = trades(3000, 2)
    core = _core()
    marks = Marks(high=0.9, low=0.5, patience=1)
    seen: list[dict[str, int]] = []
    bounds = np.linspace(0, len(cols["ts"]), 25).astype(int)
    loads = [2.0] * 8 + [0.1] * 16
    batches: list[tuple[list[int], dict[str, int]]] = []
    got: list[tuple[int, str, str, str]] = []
    for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        out = core.process(b, {"trades": kafka_records(cols, lo, hi)}, _changes(BUDGETS) if b == 0 else [])
        core.observe_load(loads[b], marks)
        seen.append(out.strides)
        batches.append((out.lookups, out.strides))
        got += _rows(out)
    assert (
        core.rules["count"].staleness_budget_ms == 8_000 and core.rules["range"].staleness_budget_ms is None
    )
    ladder = [
        {},
        {"count": 2},
        {"count": 4},
        {"count": 8},
        {"count": 8, "sum": 2},
        {"count": 8, "sum": 4},
        {"count": 8, "sum": 4, "ask": 3},  # 3 s: stride 3 at once (engine.overload.chain)
    ]
    assert seen[:9] == [*ladder, ladder[-1], ladder[-1]]  # up a step per overloaded batch, to the top
    assert seen[9:15] == ladder[-2::-1]  # down one step per calm batch (patience 1), in reverse
    assert all(s == {} for s in seen[15:])
    until = core.applied_until
    assert until is not None
    assert sorted(got) == sorted(_expect(cols, G, schedule(batches, G), until))


def test_no_budgets_no_policy() -> None:
    """Without budgets, overload changes nothing: no strides, the alerts of the plain engine."""
    cols = trades(2000, 4)
    plain, policed = _core(), _core()
    bounds = np.linspace(0, len(cols["ts"]), 9).astype(int)
    for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        ch = _changes({}) if b == 0 else []
        a = plain.process(b, {"trades": kafka_records(cols, lo, hi)}, ch)
        c = policed.process(b, {"trades": kafka_records(cols, lo, hi)}, ch)
        policed.observe_load(50.0, Marks())
        assert c.strides == {} and c.degraded == {} and policed.overload.level == 0
        assert _rows(a) == _rows(c)


def test_replay_uses_the_recorded_strides() -> None:
    """A replay after a restore re-runs each batch with the strides it recorded, whatever the
    controller's state: the same alerts and state."""
    cols = trades(2400, 5)
    bounds = np.linspace(0, len(cols["ts"]), 13).astype(int)
    parts = [kafka_records(cols, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    core = _core()
    snap = b""
    live, recorded = [], []
    for b, part in enumerate(parts):
        out = core.process(b, {"trades": part}, _changes(BUDGETS) if b == 0 else [])
        core.observe_load(2.0 if b < 6 else 0.0, Marks(patience=1))
        live.append(_rows(out))
        recorded.append(out.strides)
        if b == 3:
            snap = core.to_bytes()
    assert any(recorded)
    again = EngineCore.from_bytes(snap, compile_rule=_compile)
    for b in range(4, len(parts)):
        out = again.process(b, {"trades": parts[b]}, [], strides=recorded[b])
        assert _rows(out) == live[b] and out.strides == recorded[b]
