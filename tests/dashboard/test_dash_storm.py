"""Unit tests of the alert-storm rule (:mod:`dashboard.storm`): no services."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dashboard import queries, storm

A, B, C = (f"{c * 8}-0000-4000-8000-000000000000" for c in "abc")
T0 = 1_800_000_000.0  # epoch seconds: the first batch


def _batches(
    minutes: float, per_batch: int, *, start: float = T0, every_s: float = 5.0, top: str = B
) -> list[tuple[float, int, dict[str, int]]]:
    """Batches every ``every_s`` for ``minutes``, ``per_batch`` alerts each (most from ``top``)."""
    n = round(minutes * 60 / every_s)
    return [(start + i * every_s, per_batch, {top: per_batch // 2}) for i in range(n)]


def _detect(
    rows: list[tuple[float, int, Any]], factor: float = 10.0, floor: float = 100.0
) -> storm.Storm | None:
    return storm.detect(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], factor=factor, floor_per_s=floor
    )


def _calm_then_storm(calm_per_batch: int = 25, storm_per_batch: int = 1000) -> list[tuple[float, int, Any]]:
    """15 min at ``calm_per_batch`` per 5 s batch, then a minute at ``storm_per_batch``, mostly A."""
    calm = _batches(15, calm_per_batch)
    end = calm[-1][0] + 5.0
    hot = [(end + 5.0 * i, storm_per_batch, {A: storm_per_batch * 9 // 10, C: 3}) for i in range(13)]
    return calm + hot


def test_a_storm_is_far_above_the_usual_minute_and_above_the_floor() -> None:
    rows = _calm_then_storm()
    s = _detect(rows)
    assert s is not None
    assert s.alerts_per_s == pytest.approx(200.0)  # 12 batches of 1,000 after the first, over 60 s
    assert s.usual_per_s == pytest.approx(5.0)  # 25 alerts every 5 s
    assert s.threshold_per_s == 100.0  # max(floor 100, 10 x 5)
    assert s.subscription_id == A and s.subscription_alerts == 12 * 900 and s.alerts == 12_000
    assert s.share == pytest.approx(0.9)
    assert "10×" in s.rule and "5.0/s" in s.rule and "100" in s.rule
    # the same rows in any order
    assert _detect(random.Random(7).sample(rows, len(rows))) == s


def test_no_storm_below_the_factor_or_below_the_floor() -> None:
    assert _detect(_calm_then_storm(), factor=50.0) is None  # 200/s < 50 x 5/s
    assert _detect(_calm_then_storm(calm_per_batch=150)) is None  # usual 30/s: 200 < 300
    assert _detect(_calm_then_storm(calm_per_batch=1, storm_per_batch=400)) is None  # 80/s < floor 100
    s = _detect(_calm_then_storm(calm_per_batch=1, storm_per_batch=400), floor=50.0)
    assert s is not None and s.threshold_per_s == 50.0 and s.alerts_per_s == pytest.approx(80.0)


def test_a_calm_engine_has_no_storm() -> None:
    assert _detect(_batches(20, 25)) is None
    assert _detect([]) is None and _detect([(T0, 10**6, {A: 10**6})]) is None


def test_with_no_earlier_minute_only_the_floor_applies() -> None:
    """The engine just started (windows filling): no usual rate, the floor decides."""
    fresh = [(T0 + 5.0 * i, 1000, {C: 600, A: 400}) for i in range(7)]  # 30 s of batches
    s = _detect(fresh)
    assert s is not None and s.usual_per_s is None and s.threshold_per_s == 100.0
    assert s.alerts_per_s == pytest.approx(200.0) and s.subscription_id == C
    assert "no earlier minute" in s.rule
    assert _detect([(t, 400, top) for t, _, top in fresh]) is None  # 80/s


def test_the_usual_rate_is_the_median_of_the_minutes_that_hold_batches() -> None:
    # batches in 3 of the 15 minutes before the window only: 5/s, 6/s and a 100/s burst
    rows = _batches(1, 25, start=T0) + _batches(1, 30, start=T0 + 300) + _batches(1, 500, start=T0 + 600)
    rows += _batches(1, 600, start=T0 + 905, top=A)  # the window from T0 + 900: 12 x 600 over 55 s
    s = _detect(rows)
    assert s is not None and s.usual_per_s == pytest.approx(6.0)  # not the mean (37/s)
    assert s.alerts_per_s == pytest.approx(11 * 600 / 55)
    # minutes of the history older than 15 min before the window are not counted
    old: list[tuple[float, int, Any]] = [(T0 - 3600 + 5.0 * i, 10_000, {}) for i in range(12)]
    assert _detect(old + rows) == s


def test_the_rate_is_the_input_rate_and_survives_batches_slower_than_the_window() -> None:
    t = [T0 + 0.5 * i for i in range(200)]
    counts = [random.Random(i).randrange(1000) for i in range(200)]
    assert storm.rate_per_s(t, counts) == pytest.approx(queries.input_rate(t, counts))
    # a batch that took 90 s: alone in the window, its span starts at the batch before
    assert storm.rate_per_s([T0, T0 + 90.0], [5, 9000]) == pytest.approx(100.0)
    assert queries.input_rate([T0, T0 + 90.0], [5, 9000]) is None
    assert storm.rate_per_s([T0], [5]) is None and storm.rate_per_s([T0, T0], [1, 2]) is None
    s = _detect([(T0, 5, {}), (T0 + 90.0, 18_000, {A: 18_000})])
    assert s is not None and s.alerts_per_s == pytest.approx(200.0)


def test_the_subscription_is_the_one_with_most_alerts_summed_over_the_window() -> None:
    """A tops two batches by a little, B is second in all of them: B has the most in the window."""
    t = [T0 + 10.0 * i for i in range(4)]
    tops = [{C: 1}, {A: 500, B: 450}, {A: 500, B: 450}, {B: 700, C: 10}]
    s = _detect([(x, 2000, top) for x, top in zip(t, tops, strict=True)])
    assert s is not None and s.subscription_id == B and s.subscription_alerts == 1600
    assert s.share == pytest.approx(1600 / 6000)
    # the first batch starts the span: its alerts (and top subscriptions) are not the window's
    late = _detect([(T0, 10**6, {C: 10**6}), *[(T0 + 10.0 * i, 2000, {A: 9}) for i in (1, 2)]])
    assert late is not None and late.subscription_id == A and late.alerts == 4000
    nameless = _detect([(x, 2000, None) for x in t])
    assert nameless is not None and nameless.subscription_id is None and nameless.share == 0.0


def test_the_banner_names_only_the_users_subscription_and_says_if_the_engine_keeps_up() -> None:
    s = _detect(_calm_then_storm())
    assert s is not None
    mine = s.banner("vol \\*spike\\*", "ok", 1200.0)
    assert mine.startswith("Alert storm: 200 alerts/s over the last 60 s, 40× the usual 5.0/s")
    assert "'vol \\*spike\\*' (aaaaaaaa): at least 90% of the alerts" in mine
    assert mine.endswith("The engine is keeping up (lag 1.2 s).")
    theirs = s.banner(None, "behind", 45_000.0)
    assert "another user's subscription (aaaaaaaa)" in theirs and "vol" not in theirs
    assert theirs.endswith("The engine is not keeping up (lag 45.0 s).")
    assert s.banner(None, "down", None).endswith(
        "The engine is down: these are its last batches' figures (see the status above)."
    )
    fresh = _detect([(T0 + 5.0 * i, 1000, {}) for i in range(7)])
    assert fresh is not None and "no usual rate yet" in fresh.banner(None, "ok", None)
    assert "Most of it" not in fresh.banner(None, "ok", None)
