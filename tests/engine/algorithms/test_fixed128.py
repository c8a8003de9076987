"""Exact window sums (:mod:`engine.algorithms.fixed128`) against Python's exact arithmetic.

* ``split`` is ``round(v * 2**60)`` (``fractions.Fraction``), ``to_float`` is Python's correctly
  rounded ``int / 2**60``, for values across the whole exact range;
* R-INT window sums equal ``math.fsum`` of the window's values, for any grouping of the rows
  (single events, or pane sums with multiplicities), bit for bit -- where float64 running sums
  do not.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.algorithms import RInt
from engine.algorithms import fixed128 as fx


def _words(n: int) -> tuple[int, int]:
    n %= 2**128
    h, lo = n >> 64, n & (2**64 - 1)
    return (h - 2**64 if h >= 2**63 else h), (lo - 2**64 if lo >= 2**63 else lo)


finite = st.floats(min_value=-(2.0**66), max_value=2.0**66, allow_nan=False, allow_infinity=False)


@settings(max_examples=3000, deadline=None)
@given(st.lists(finite, min_size=1, max_size=20))
def test_split_is_the_rounded_scaled_value(values: list[float]) -> None:
    hi, lo = fx.split_many(np.array(values))
    for v, h, low in zip(values, hi.tolist(), lo.tolist(), strict=True):
        assert (h, low) == _words(round(Fraction(v) * 2**60)), v


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.integers(-(2**127) + 1, 2**127 - 1), min_size=1, max_size=20))
def test_to_float_is_correctly_rounded(ns: list[int]) -> None:
    words = [_words(n) for n in ns]
    got = fx.to_float_many(
        np.array([w[0] for w in words], np.int64), np.array([w[1] for w in words], np.int64)
    )
    assert got.tolist() == [n / 2**60 for n in ns]


def test_to_float_ties_go_to_even() -> None:
    cases = [2**53 + 1, 2**54 + 2, 2**54 + 6, (2**53 - 1) * 2**22 + 2**21, (2**52 + 1) * 2**74 + 2**73,
             (2**52 + 1) * 2**74 + 2**73 + 1, 2**64 + 2**11, 2**64 + 2**12 + 2**11]  # fmt: skip
    cases += [-n for n in cases]
    words = [_words(n) for n in cases]
    got = fx.to_float_many(
        np.array([w[0] for w in words], np.int64), np.array([w[1] for w in words], np.int64)
    )
    assert got.tolist() == [n / 2**60 for n in cases]


def test_add_and_sub_wrap_like_integers_modulo_2_128() -> None:
    rng = np.random.default_rng(3)
    for _ in range(2000):
        a, b = (int(x) for x in rng.integers(-(2**62), 2**62, 2))
        a, b = a * 2**64 + int(rng.integers(0, 2**63)), b * 2**64 + int(rng.integers(0, 2**63))
        s = fx.add(*_words(a), *_words(b))
        d = fx.sub(*_words(a), *_words(b))
        assert (int(s[0]), int(s[1])) == _words(a + b)
        assert (int(d[0]), int(d[1])) == _words(a - b)


def test_group_sums_equal_fsum() -> None:
    rng = np.random.default_rng(5)
    groups = rng.integers(0, 50, 20_000)
    values = np.round(rng.uniform(-200, 200, 20_000), 2) * rng.choice([1.0, 1e-3, 1e5], 20_000)
    sums, _ = fx.exact_group_sums(groups, values, 50)
    assert sums.tolist() == [math.fsum(values[groups == g]) for g in range(50)]


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 300),
    seed=st.integers(0, 2**31),
    pane=st.sampled_from([1000, 3000]),
    window=st.sampled_from([2000, 5000, 11000]),
)
def test_rint_window_sums_are_fsum_for_any_grouping(n: int, seed: int, pane: int, window: int) -> None:
    """Raw events and pane rows (exact pane sums, multiplicities) give the same bits: fsum."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 3, n)
    ts = np.sort(rng.integers(1, 30_000, n))
    vals = np.round(rng.uniform(100, 110, n), 2)
    raw = RInt(1)
    raw.append(keys, ts, vals.reshape(-1, 1))
    panes = RInt(1)
    pane_of = -((-ts) // pane) * pane
    gid = keys * 100 + pane_of // pane
    u, inv = np.unique(gid, return_inverse=True)
    sums, (hi, lo) = fx.exact_group_sums(inv, vals, len(u))
    cnt = np.bincount(inv)
    panes.append(
        u // 100,
        (u % 100) * pane,
        sums.reshape(-1, 1),
        mult=cnt,
        exact=(hi.reshape(-1, 1), lo.reshape(-1, 1)),
    )
    for now in range(pane, 31_000, pane):
        k = np.arange(3)
        c_raw, s_raw = raw.window(k, now - window, now)
        lo_t = (now - window) // pane * pane  # panes see whole panes only
        c_p, s_p = panes.window(k, lo_t, now)
        for key in range(3):
            sel = (keys == key) & (ts > now - window) & (ts <= now)
            assert c_raw[key] == sel.sum()
            assert s_raw[key, 0] == math.fsum(vals[sel])
            psel = (keys == key) & (ts > lo_t) & (ts <= now)
            assert c_p[key] == psel.sum()
            assert s_p[key, 0] == math.fsum(vals[psel])


def test_the_soak_tie_is_decided_the_same_way_from_events_and_from_panes() -> None:
    """Decimal prices whose exact average sits at a decimal threshold: float64 running sums
    answer ``AVG > c`` differently for per-event and per-pane additions; exact sums do not."""
    rng = np.random.default_rng(11)
    flips = 0
    for _ in range(400):
        n = int(rng.integers(20, 60))
        vals = np.round(rng.uniform(104, 106.5, n), 1)
        c = float(np.round(math.fsum(vals) / n, 1))  # a decimal threshold...
        vals[-1] = np.round(c * n - math.fsum(vals[:-1]), 1)  # ...made the window's exact average
        per_event = 0.0
        for v in vals:
            per_event += v
        panes = [math.fsum(vals[i : i + 7]) for i in range(0, n, 7)]
        per_pane = 0.0
        for v in panes:
            per_pane += v
        flips += (per_event / n > c) != (per_pane / n > c)
        r_ev = RInt(1)
        r_ev.append(np.zeros(n, np.int64), np.arange(1, n + 1), vals.reshape(-1, 1))
        r_p = RInt(1)
        pid = np.arange(n) // 7
        s, (hi, lo) = fx.exact_group_sums(pid, vals, int(pid.max()) + 1)
        r_p.append(np.zeros(len(s), np.int64), np.arange(1, len(s) + 1), s.reshape(-1, 1), mult=np.bincount(pid),
                   exact=(hi.reshape(-1, 1), lo.reshape(-1, 1)))  # fmt: skip
        a = r_ev.window(np.zeros(1, np.int64), 0, n)[1][0, 0]
        b = r_p.window(np.zeros(1, np.int64), 0, len(s))[1][0, 0]
        assert a == b == math.fsum(vals)
    assert flips > 0  # the data does hit the float64 grouping problem
