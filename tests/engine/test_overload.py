"""engine.overload: the ladder, the controller, the grid and the schedule (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.overload import (
    Marks,
    Overload,
    batch_strides,
    by_stride,
    chain,
    decide,
    ladder,
    schedule,
    skipped,
    strides_at,
)
from tidewatch.settings import Settings

L = 1000


def test_chain_divides_its_largest_stride() -> None:
    assert chain(1) == [] and chain(2) == [2] and chain(3) == [3]
    assert chain(5) == [2, 4] and chain(7) == [2, 6] and chain(8) == [2, 4, 8]
    assert chain(12) == [2, 4, 12] and chain(13) == [2, 4, 12]
    for m in range(2, 200):
        c = chain(m)
        assert c[-1] <= m and c[-1] * 4 >= m * 3 - 3  # most of the budget used
        assert all(c[-1] % k == 0 for k in c) and c == sorted(set(c))


def test_ladder_loosest_budget_first_up_to_budget_over_L() -> None:
    budgets = {"a": 5_000, "b": 12_000, "c": None, "d": 1_999, "e": 5_000, "f": 2_000}
    assert ladder(budgets, L) == [
        (("b",), 2),
        (("b",), 4),
        (("b",), 12),
        (("a", "e"), 2),
        (("a", "e"), 4),
        (("f",), 2),
    ]  # c: no budget, d: under two lookup periods -- never degraded
    assert ladder({}, L) == [] and ladder({"x": None}, L) == []


def test_strides_at_each_level() -> None:
    budgets = {"a": 4_000, "b": 8_000}
    assert strides_at(0, budgets, L) == {}
    assert strides_at(1, budgets, L) == {"b": 2}
    assert strides_at(3, budgets, L) == {"b": 8}
    assert strides_at(5, budgets, L) == {"b": 8, "a": 4}
    assert strides_at(99, budgets, L) == {"b": 8, "a": 4}
    assert strides_at(1, {"a": 9_000}, L) == {"a": 3} and strides_at(2, {"a": 9_000}, L) == {"a": 9}


def test_decide_hysteresis() -> None:
    m = Marks(high=0.9, low=0.5, patience=2)
    s = Overload()
    s = decide(s, 1.5, 3, m)
    assert s == Overload(1, 0)
    s = decide(decide(s, 2.0, 3, m), 2.0, 3, m)
    assert s.level == 3
    assert decide(s, 5.0, 3, m).level == 3  # at the top
    assert decide(s, 0.7, 3, m) == Overload(3, 0)  # between the marks: stays
    once = decide(s, 0.1, 3, m)
    assert once == Overload(3, 1)  # patience: one calm batch is not enough
    assert decide(once, 0.1, 3, m) == Overload(2, 0)
    assert decide(once, 0.95, 3, m) == Overload(3, 0)  # an overloaded batch resets the calm count
    assert decide(Overload(5, 0), None, 3, m) == Overload(3, 0)  # budgets went: clamped
    assert decide(Overload(4, 2), 9.0, 0, m) == Overload()  # no budget anywhere: nothing


def test_marks_from_settings() -> None:
    s = Settings(
        _env_file=None, engine_overload_high=1.2, engine_overload_low=0.3, engine_overload_patience=5
    )  # type: ignore[call-arg]
    assert Marks.of(s) == Marks(1.2, 0.3, 5)
    with pytest.raises(ValueError, match="engine_overload_low"):
        Settings(_env_file=None, engine_overload_high=0.5, engine_overload_low=0.5)  # type: ignore[call-arg]


def test_batch_strides_and_degraded() -> None:
    budgets = {"a": 4_000, "b": 8_000}
    assert batch_strides(0, budgets, L) == ({}, {})
    use, degraded = batch_strides(2, budgets, L)
    assert use == {"b": 4} and degraded == {"b": {"every_ms": 4_000, "budget_ms": 8_000}}
    assert batch_strides(2, budgets, L, {"a": 3, "b": 1}) == (
        {"a": 3},
        {"a": {"every_ms": 3_000, "budget_ms": 4_000}},
    )


def test_skipped_on_the_grid() -> None:
    groups = by_stride({"a": 2, "b": 3, "c": 1, "d": 2})
    assert groups == {2: frozenset({"a", "d"}), 3: frozenset({"b"})}
    assert skipped(groups, 6_000, L) == frozenset()
    assert skipped(groups, 4_000, L) == {"b"}
    assert skipped(groups, 5_000, L) == {"a", "b", "d"}
    assert skipped(groups, 5_000, L, {"a"}) == {"b", "d"}
    assert skipped({}, 5_000, L) == frozenset()


@settings(max_examples=300, deadline=None)
@given(
    budget=st.integers(2 * L, 40 * L),
    batches=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 8)), min_size=1, max_size=40),
)
def test_gap_never_exceeds_the_budget_whatever_the_strides_do(
    budget: int, batches: list[tuple[int, int]]
) -> None:
    """The level changing every batch (``n`` lookup times each): the gap between a subscription's
    consecutive lookups is at most its budget."""
    tau, looked = 0, [0]
    for n, level in batches:
        groups = by_stride(strides_at(level, {"s": budget}, L))
        for _ in range(n):
            tau += L
            if "s" not in skipped(groups, tau, L):
                looked.append(tau)
    gaps = [b - a for a, b in zip(looked, looked[1:], strict=False)]
    assert all(g <= budget for g in gaps)
    assert tau - looked[-1] < budget  # and the time since the last lookup


def test_schedule_from_recorded_batches() -> None:
    batches = [([0, 1_000, 2_000], {"a": 2}), ([3_000, 4_000], {}), ([5_000, 6_000, 7_000], {"a": 3, "b": 2})]
    skip = schedule(batches, L)
    assert [sorted(skip(t)) for t in range(0, 8_000, L)] == [
        [],  # the first lookup: nobody skipped
        ["a"],
        [],
        [],
        [],
        ["a", "b"],
        [],
        ["a", "b"],
    ]
    later = schedule(batches, L, first={"a": 1_000})
    assert later(1_000) == frozenset() and later(0) == frozenset()
