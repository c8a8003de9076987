"""Metric rows by engine (:mod:`dashboard.per_engine`) against per-engine loops written plainly."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.per_engine import Newest, capacity, groups, runs, since_row_before, worst

_ROWS = st.lists(st.tuples(st.sampled_from(["a", "b", "shard-1"]), st.integers(0, 300)), max_size=25)


def _oldest_first(rows: list[tuple[str, int]]) -> tuple[list[str], list[float]]:
    rows = sorted(rows, key=lambda r: r[1])
    return [e for e, _ in rows], [float(t) for _, t in rows]


@settings(max_examples=300, deadline=None)
@given(_ROWS, st.sampled_from([0.0, 5.0, 60.0]))
def test_matches_a_loop_over_each_engines_rows(rows: list[tuple[str, int]], gap: float) -> None:
    ids, times = _oldest_first(rows)
    by = groups(ids)
    assert list(by) == sorted(set(ids))
    assert {e: r.tolist() for e, r in by.items()} == {
        e: [i for i, x in enumerate(ids) if x == e] for e in set(ids)
    }
    gaps = since_row_before(times, by)
    dt = gaps.tolist()
    names = runs(gaps, by, gap)
    for e in set(ids):
        before: float | None = None
        run = 0
        for i in (i for i, x in enumerate(ids) if x == e):
            want = math.nan if before is None else times[i] - before
            assert (math.isnan(dt[i]) and math.isnan(want)) or dt[i] == want
            if before is None or times[i] - before > gap:
                run += 1
            assert names[i] == f"{e} {run}"
            before = times[i]


def test_no_rows() -> None:
    assert groups([]) == {}
    assert since_row_before([], {}).tolist() == [] and runs(since_row_before([], {}), {}, 60.0) == []


T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_the_worst_of_the_engines_newest_rows() -> None:
    a = Newest("a", T0, lag_ms=300.0, batch_ms=40.0, delivery_ms=10.0, expansion_ms=5.0, events_per_s=1e4)
    b = Newest(
        "b", T0 - timedelta(seconds=20), lag_ms=9000.0, batch_ms=None, delivery_ms=80.0, events_per_s=2e4
    )
    c = Newest("c", T0 - timedelta(seconds=400), lag_ms=None, batch_ms=70.0, events_per_s=5e4)
    w = worst([a, b, c])
    assert w is not None
    assert (w.engine, w.at) == ("c", c.at)  # the engine that committed least recently
    assert (w.lag_ms, w.batch_ms) == (9000.0, 70.0)  # each figure's largest, a missing one skipped
    assert (w.delivery_ms, w.expansion_ms) == (80.0, None)  # the slowest delivery with its own expansion
    assert worst([a]) is a and worst([]) is None
    # capacities add up, of the engines with a row in the window before the newest only
    assert capacity([a, b, c], 60.0) == 3e4
    assert capacity([a, b, c], 3600.0) == 8e4
    assert capacity([Newest("a", T0)], 60.0) is None and capacity([], 60.0) is None
