"""MIN/MAX (engine.algorithms.minmax) and COUNT DISTINCT (engine.algorithms.distinct)
against brute force."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.algorithms import DistinctCount, MinMax
from tests.engine.algorithms.brute import ALGO_SETTINGS, Stream, feed, random_lo, sel_rows, sel_time, streams


def _check_minmax(r: MinMax, s: Stream, rng: np.random.Generator, expired: int, n_queries: int = 6):
    t0 = int(s.ts[0]) if len(s.ts) else 0
    end = int(s.ts[-1]) if len(s.ts) else t0
    keys = np.arange(s.n_keys + 1)
    for _ in range(n_queries):
        lo = random_lo(rng, t0, end, expired)
        hi = lo + int(rng.integers(-3, max(6, end - lo + 10)))
        mins, maxs = r.window(keys, lo, hi)
        n = int(rng.integers(0, 3000))
        rmins, rmaxs = r.rows(keys, n)
        for k in keys:
            for idx, a, b in (
                (sel_time(s, k, lo, hi, expired), mins[k], maxs[k]),
                (sel_rows(s, k, n, expired), rmins[k], rmaxs[k]),
            ):
                if len(idx):
                    assert a == s.vals[idx].min() and b == s.vals[idx].max()
                else:
                    assert np.isnan(a) and np.isnan(b)


@ALGO_SETTINGS
@given(s=streams(), seed=st.integers(0, 2**32 - 1), rt=st.integers(-1, 4), ex=st.integers(-1, 4))
def test_minmax_matches_brute_force(s: Stream, seed: int, rt: int, ex: int):
    rng = np.random.default_rng(seed)
    t0 = int(s.ts[0]) if len(s.ts) else 0
    r, expired = feed(
        MinMax(),
        s,
        rng,
        lambda m, perm: m.append(s.keys[perm], s.ts[perm], s.vals[perm]),
        rt,
        ex,
        t0 + int(rng.integers(0, 50)),
    )
    _check_minmax(r, s, rng, expired)


@pytest.mark.parametrize("seed", [1, 2])
def test_minmax_long_streams_use_blocks(seed: int):
    """Thousands of rows per key so that windows span level-5 and level-10 blocks; batches
    force region moves, an expiry and a round trip through bytes."""
    rng = np.random.default_rng(seed)
    n = 12_000
    keys = rng.integers(0, 3, n)
    ts = 1000 + np.cumsum(rng.integers(0, 3, n))
    vals = rng.normal(size=n)
    s = Stream(keys, ts, np.ones(n, np.int64), vals, np.zeros(n, np.int64), [500, 3000, 7000], 3)
    m, expired = feed(
        MinMax(), s, rng, lambda m, perm: m.append(s.keys[perm], s.ts[perm], s.vals[perm]), 2, 1, 2000
    )
    _check_minmax(m, s, rng, expired, n_queries=25)


@ALGO_SETTINGS
@given(s=streams(), seed=st.integers(0, 2**32 - 1), rt=st.integers(-1, 4), ex=st.integers(-1, 4))
def test_distinct_matches_brute_force(s: Stream, seed: int, rt: int, ex: int):
    rng = np.random.default_rng(seed)
    t0 = int(s.ts[0]) if len(s.ts) else 0
    end = int(s.ts[-1]) if len(s.ts) else t0
    d, expired = feed(
        DistinctCount(), s, rng, lambda d, perm: d.append(s.keys[perm], s.ts[perm], s.ivals[perm]), rt, ex,
        t0 + int(rng.integers(0, 50)),
    )  # fmt: skip
    keys = np.arange(s.n_keys + 1)
    for _ in range(6):
        lo = random_lo(rng, t0, end, expired)
        hi = lo + int(rng.integers(-3, 6000))
        got = d.window(keys, lo, hi)
        n = int(rng.integers(0, 12))
        got_rows = d.rows(keys, n)
        for k in keys:
            assert got[k] == len(set(s.ivals[sel_time(s, k, lo, hi, expired)].tolist()))
            assert got_rows[k] == len(set(s.ivals[sel_rows(s, k, n, expired)].tolist()))


def test_distinct_many_values_with_expiry_rebuilds_index():
    rng = np.random.default_rng(3)
    n = 20_000
    keys = rng.integers(0, 50, n)
    ts = np.arange(n, dtype=np.int64)
    vals = rng.integers(0, 10_000, n)
    d = DistinctCount()
    for a in range(0, n, 2000):
        d.append(keys[a : a + 2000], ts[a : a + 2000], vals[a : a + 2000])
        d.expire(a - 3000)
    lo = n - 2500
    got = d.window(np.arange(50), lo, n)
    for k in range(50):
        assert got[k] == len(set(vals[(keys == k) & (ts > lo)].tolist()))
    assert len(d._index) < 3 * 5000 + 2048
