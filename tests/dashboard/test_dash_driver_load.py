"""The driver's load on the Health view (:mod:`dashboard.driver_load`): concrete cases and
property tests against a plain loop over the rows, one engine and several."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.driver_load import DriverLoad, driver_load, driver_loads


def test_share_per_event_and_ceiling() -> None:
    # the first row starts the span: its CPU (spent before it) is not counted
    d = driver_load([100.0, 110.0], [999.0, 500.0], [50.0, 10_000.0], 60.0)
    assert d is not None
    assert d.seconds == 10.0 and d.share == pytest.approx(0.05)
    assert d.us_per_event == pytest.approx(50.0) and d.ceiling_per_s == pytest.approx(20_000.0)


def test_rows_before_the_window_do_not_count() -> None:
    d = driver_load([0.0, 50.0, 100.0, 110.0], [1e6, 1e6, 10.0, 20.0], [1.0, 1.0, 1.0, 100.0], 15.0)
    assert d is not None and d.seconds == 10.0 and d.share == pytest.approx(0.002)


def test_a_row_without_a_figure_starts_the_span_again() -> None:
    # a restart between the rows at 0 and 5: the CPU before it is unknown, the row at 5 starts
    d = driver_load([0.0, 5.0, 10.0], [100.0, None, 200.0], [10.0, 10.0, 400.0], 60.0)
    assert d is not None and d.seconds == 5.0 and d.share == pytest.approx(0.04)
    assert d.us_per_event == pytest.approx(500.0)


def test_no_span_or_no_events() -> None:
    assert driver_load([], [], [], 60.0) is None
    assert driver_load([5.0], [10.0], [1.0], 60.0) is None
    assert driver_load([5.0, 5.0], [10.0, 10.0], [1.0, 1.0], 60.0) is None  # no time between
    assert driver_load([0.0, 1.0, 2.0], [10.0, 10.0, None], [1.0, 1.0, 1.0], 60.0) is None  # newest: none
    idle = driver_load([0.0, 1.0], [None, 3.0], [None, 0.0], 60.0)
    assert idle == DriverLoad(share=pytest.approx(0.003), us_per_event=None, seconds=1.0)
    assert idle is not None and idle.ceiling_per_s is None


def _loop(
    times: list[float], cpu: list[float | None], events: list[float | None], window: float
) -> DriverLoad | None:
    """The same figures by walking the rows one by one, newest first, back to the window's start
    or the newest row without a CPU figure."""
    rows = sorted(zip(times, cpu, events, strict=True), key=lambda r: r[0])
    if len(rows) < 2:
        return None
    newest = rows[-1][0]
    counted_cpu, counted_events, start = 0.0, 0.0, None
    for i in range(len(rows) - 1, -1, -1):
        t, c, e = rows[i]
        if t < newest - window:
            break
        start = t
        if c is None:
            break
        if i > 0 and rows[i - 1][0] >= newest - window:
            counted_cpu += c
            counted_events += e or 0.0
    if start is None or newest - start <= 0:
        return None
    cpu_s = counted_cpu / 1000
    return DriverLoad(
        cpu_s / (newest - start), cpu_s * 1e6 / counted_events if counted_events > 0 else None, newest - start
    )


rows_st = st.lists(
    st.tuples(
        st.integers(0, 300).map(float),
        st.one_of(st.none(), st.integers(0, 5000).map(float)),
        st.one_of(st.none(), st.integers(0, 100_000).map(float)),
    ),
    max_size=12,
    unique_by=lambda r: r[0],
)


@settings(max_examples=300, deadline=None)
@given(rows_st, st.sampled_from([10.0, 60.0, 1000.0]))
def test_matches_a_loop_over_the_rows(
    rows: list[tuple[float, float | None, float | None]], window: float
) -> None:
    times, cpu, events = ([r[i] for r in rows] for i in range(3))
    got, want = driver_load(times, cpu, events, window), _loop(times, cpu, events, window)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert got.seconds == want.seconds and math.isclose(got.share, want.share, abs_tol=1e-12)
    if want.us_per_event is None:
        assert got.us_per_event is None
    else:
        assert got.us_per_event is not None and math.isclose(
            got.us_per_event, want.us_per_event, rel_tol=1e-9
        )


def test_engines_sharing_a_database_are_measured_apart() -> None:
    # a at 0, 10, 20 (100 ms of CPU per row); b at 5, 15 (900 ms), then b restarts at 18
    ids = ["a", "b", "a", "b", "a", "b", "b"]
    times = [0.0, 5.0, 10.0, 15.0, 20.0, 18.0, 19.0]
    cpu: list[float | None] = [100.0, 900.0, 100.0, 900.0, 100.0, None, 50.0]
    events: list[float | None] = [1000.0, 10.0, 1000.0, 10.0, 1000.0, 10.0, 100.0]
    got = driver_loads(ids, times, cpu, events, 60.0)
    # b's restart does not cut a's span, and no share sums the two processes' CPU
    assert list(got) == ["b", "a"]  # the busiest driver first
    assert got["a"] == DriverLoad(share=pytest.approx(0.01), us_per_event=pytest.approx(100.0), seconds=20.0)
    assert got["b"] == DriverLoad(share=pytest.approx(0.05), us_per_event=pytest.approx(500.0), seconds=1.0)
    # the window ends at the newest row of all: a has one row in the last 3 s (no span); without
    # b's last two rows only a's at 20 is in the last 4 s, and b's at 15 is left out with the rest
    assert list(driver_loads(ids, times, cpu, events, 3.0)) == ["b"]
    assert driver_loads(ids[:5], times[:5], cpu[:5], events[:5], 4.0) == {}
    assert driver_loads([], [], [], [], 60.0) == {}


engines_st = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 300).map(float),
        st.one_of(st.none(), st.integers(0, 5000).map(float)),
        st.one_of(st.none(), st.integers(0, 100_000).map(float)),
    ),
    max_size=16,
    unique_by=lambda r: (r[0], r[1]),
)


@settings(max_examples=300, deadline=None)
@given(engines_st, st.sampled_from([10.0, 60.0, 1000.0]))
def test_each_engine_matches_a_loop_over_its_own_rows(
    rows: list[tuple[str, float, float | None, float | None]], window: float
) -> None:
    ids, times, cpu, events = ([r[i] for r in rows] for i in range(4))
    got = driver_loads(ids, times, cpu, events, window)
    newest = max(times, default=0.0)
    want: dict[str, DriverLoad] = {}
    for engine in sorted(set(ids)):
        mine = [r for r in rows if r[0] == engine and r[1] >= newest - window]
        d = _loop([r[1] for r in mine], [r[2] for r in mine], [r[3] for r in mine], window)
        if d is not None:
            want[engine] = d
    assert set(got) == set(want)
    assert [d.share for d in got.values()] == sorted((d.share for d in got.values()), reverse=True)
    for engine, d in want.items():
        assert got[engine].seconds == d.seconds and math.isclose(got[engine].share, d.share, abs_tol=1e-12)


# ---------------------------------------------------------------- the fit: fixed and per-event CPU


def test_the_fit_recovers_fixed_and_per_event_cpu() -> None:
    # 21 batches, one a second, 1,000-50,000 events each: 20 ms fixed + 0.5 µs per event, +-0.2 ms
    events = [1000.0 + 2450.0 * ((7 * i) % 21) for i in range(21)]
    cpu = [20.0 + 0.0005 * e + (0.2 if i % 2 else -0.2) for i, e in enumerate(events)]
    d = driver_load([float(i) for i in range(21)], cpu, events, 60.0)
    assert d is not None and d.fixed_ms_per_batch is not None and d.marginal_us_per_event is not None
    assert d.fixed_ms_per_batch == pytest.approx(20.0, abs=0.5)
    assert d.marginal_us_per_event == pytest.approx(0.5, rel=0.02)
    assert d.batches_per_s == pytest.approx(1.0)
    # one core less the fixed 2 % of it, over 0.5 µs per event; the bound counts the 20 ms per event
    assert d.fit_ceiling_per_s == pytest.approx(0.98 / 0.5e-6, rel=0.03)
    assert d.ceiling_per_s is not None and d.ceiling_per_s < 0.5 * d.fit_ceiling_per_s


def test_no_fit_where_the_sizes_do_not_tell_fixed_from_per_event() -> None:
    times = [float(i) for i in range(30)]
    even = driver_load(times, [20.0 + (i % 3) for i in range(30)], [800.0] * 30, 60.0)
    # sizes vary, but the CPU's noise (+-10 ms) drowns the 0.4 ms the events cost
    noisy = driver_load(
        times, [20.0 + (10.0 if i % 2 else -10.0) for i in range(30)], [800.0 + i for i in range(30)], 60.0
    )
    few = driver_load(times[:5], [20.0, 21.0, 22.0, 23.0, 24.0], [0.0, 1.0, 2.0, 3.0, 4.0], 60.0)  # 4 counted
    for d in (even, noisy, few):
        assert d is not None and d.us_per_event is not None and d.ceiling_per_s is not None
        assert d.fixed_ms_per_batch is None and d.marginal_us_per_event is None and d.batches_per_s is None
        assert d.fit_ceiling_per_s is None


def test_fixed_costs_that_take_the_whole_core_leave_no_ceiling() -> None:
    events = [float(100 * (i % 7)) for i in range(10)]
    d = driver_load([0.1 * i for i in range(10)], [150.0 + 0.01 * e for e in events], events, 60.0)
    assert d is not None and d.fixed_ms_per_batch == pytest.approx(150.0)
    assert d.fit_ceiling_per_s == 0.0  # 150 ms every 100 ms: more than a core before any event


def _line(pairs: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least squares by the textbook sums, one pair (events, CPU) at a time: (fixed, per event,
    the per-event slope's standard error), None below five pairs or with one size only."""
    n = len(pairs)
    if n < 5:
        return None
    sx = sum(x for x, _ in pairs)
    sy = sum(y for _, y in pairs)
    mx, my = sx / n, sy / n
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    if sxx <= 1e-12 * sum(x * x for x, _ in pairs):
        return None
    b = sum((x - mx) * (y - my) for x, y in pairs) / sxx
    a = my - b * mx
    rss = sum((y - a - b * x) ** 2 for x, y in pairs)
    return a, b, math.sqrt(rss / (n - 2) / sxx)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(5, 40),
    st.floats(0.0, 100.0),
    st.floats(1e-5, 1e-2),
    st.floats(0.0, 30.0),
    st.randoms(use_true_random=False),
)
def test_the_fit_matches_the_textbook_sums(
    n: int, fixed: float, per_event: float, noise: float, rnd: random.Random
) -> None:
    """Batches along a line with noise, some of them clean, some drowned: the kept fit is the
    textbook one, and it is kept exactly when its slope's error is within a quarter of it."""
    events = [float(rnd.randint(0, 100_000)) for _ in range(n)]
    cpu = [max(fixed + per_event * e + rnd.uniform(-noise, noise), 0.0) for e in events]
    times = [float(i) for i in range(n)]
    d = driver_load(times, cpu, events, 1000.0)
    assert d is not None
    want = _line(list(zip(events[1:], cpu[1:], strict=True)))  # the first row starts the span
    if want is None:
        assert d.marginal_us_per_event is None
        return
    a, b, se = want
    if abs(se - 0.25 * b) <= 1e-9 * max(abs(b), 1e-12):
        return  # on the threshold: either answer is right
    if b > 0 and se <= 0.25 * b:
        assert d.fixed_ms_per_batch is not None and d.marginal_us_per_event is not None
        assert math.isclose(d.fixed_ms_per_batch, a, rel_tol=1e-6, abs_tol=1e-6)
        assert math.isclose(d.marginal_us_per_event, b * 1000, rel_tol=1e-6, abs_tol=1e-9)
        assert d.batches_per_s == pytest.approx(1.0)  # n - 1 batches counted over n - 1 s
    else:
        assert d.marginal_us_per_event is None and d.fit_ceiling_per_s is None
