"""The rows of the last span of batches (:mod:`dashboard.spans`) against a plain filter."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.spans import recent


def test_the_window_before_the_newest_oldest_first() -> None:
    assert recent([30.0, 0.0, 50.0, 20.0], 30.0).tolist() == [3, 0, 2]
    assert recent([5.0, 5.0, 1.0], 0.0).tolist() == [0, 1]  # ties in their given order
    assert recent([], 60.0).tolist() == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 200).map(float), max_size=20), st.sampled_from([0.0, 10.0, 60.0, 1000.0]))
def test_matches_a_filter_then_a_sort(times: list[float], window: float) -> None:
    newest = max(times, default=0.0)
    want = sorted((i for i, t in enumerate(times) if t >= newest - window), key=lambda i: (times[i], i))
    assert recent(times, window).tolist() == want
