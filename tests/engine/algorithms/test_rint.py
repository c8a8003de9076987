"""R-INT (engine.algorithms.rint) against brute force."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.algorithms import RInt
from tests.engine.algorithms.brute import (
    ALGO_SETTINGS,
    INT64_MIN,
    Stream,
    feed,
    kth_newest,
    random_lo,
    sel_rows,
    sel_time,
    streams,
)


def _apply(s: Stream):
    def f(struct, perm):
        struct.append(s.keys[perm], s.ts[perm], np.stack([s.vals[perm], 2 * s.vals[perm]], 1), s.mult[perm])

    return f


@ALGO_SETTINGS
@given(s=streams(max_mult=3), seed=st.integers(0, 2**32 - 1), rt=st.integers(-1, 4), ex=st.integers(-1, 4))
def test_rint_matches_brute_force(s: Stream, seed: int, rt: int, ex: int):
    rng = np.random.default_rng(seed)
    t0 = int(s.ts[0]) if len(s.ts) else 0
    expire_to = t0 + int(rng.integers(0, 50))
    r, expired = feed(RInt(2), s, rng, _apply(s), rt, ex, expire_to)
    end = int(s.ts[-1]) if len(s.ts) else t0
    keys = np.arange(s.n_keys + 1)  # one unknown key id
    for _ in range(6):
        lo = random_lo(rng, t0, end, expired)
        hi = lo + int(rng.integers(-3, 6000))
        cnt, sums = r.window(keys, lo, hi)
        first, last = r.first_last(keys, lo, hi, 1)
        for k in keys:
            idx = sel_time(s, k, lo, hi, expired)
            assert cnt[k] == s.mult[idx].sum()
            np.testing.assert_allclose(sums[k], [s.vals[idx].sum(), 2 * s.vals[idx].sum()], atol=1e-9)
            if len(idx):
                assert first[k] == 2 * s.vals[idx[0]] and last[k] == 2 * s.vals[idx[-1]]
            else:
                assert np.isnan(first[k]) and np.isnan(last[k])
        n = int(rng.integers(0, 12))
        cnt, sums = r.rows(keys, n)
        first, last = r.first_last_rows(keys, n, 0)
        for k in keys:
            idx = sel_rows(s, k, n, expired)
            assert cnt[k] == s.mult[idx].sum()
            np.testing.assert_allclose(sums[k, 0], s.vals[idx].sum(), atol=1e-9)
            if len(idx):
                assert first[k] == s.vals[idx[0]] and last[k] == s.vals[idx[-1]]
            else:
                assert np.isnan(first[k])
        u = int(rng.integers(1, 15))
        kth = r.kth_newest_ts(keys, u)
        for k in keys:
            assert kth[k] == kth_newest(s, k, u, expired)
    lt = r.last_ts(keys)
    for k in keys:
        idx = np.nonzero((s.keys == k) & (s.ts > expired))[0]
        assert lt[k] == (s.ts[idx[-1]] if len(idx) else INT64_MIN)


def test_rint_refuses_rows_older_than_applied_and_stays_unchanged():
    r = RInt(1)
    r.append(np.array([0, 1]), np.array([10, 20]), np.array([[1.0], [2.0]]))
    with pytest.raises(ValueError):
        r.append(np.array([1, 0]), np.array([25, 5]), np.array([[1.0], [1.0]]))
    cnt, sums = r.window(np.array([0, 1]), 0, 100)
    assert cnt.tolist() == [1, 1] and sums[:, 0].tolist() == [1.0, 2.0]


def test_rint_batch_sorted_per_key_with_ties_in_arrival_order():
    r = RInt(1)
    r.append(np.array([0, 0, 0, 0]), np.array([5, 3, 5, 3]), np.array([[1.0], [2.0], [3.0], [4.0]]))
    first, last = r.first_last(np.array([0]), 0, 10, 0)
    assert first[0] == 2.0 and last[0] == 3.0  # ts 3: 2.0 then 4.0; ts 5: 1.0 then 3.0
    f3, l3 = r.first_last(np.array([0]), 0, 3, 0)
    assert f3[0] == 2.0 and l3[0] == 4.0


def test_rint_large_stream_with_moves_and_expiry():
    """Many keys of very different rates: exercises region moves, compaction and expiry."""
    rng = np.random.default_rng(7)
    n = 60_000
    keys = np.minimum(rng.zipf(1.3, n) - 1, 999)
    ts = np.sort(rng.integers(0, 1_000_000, n))
    vals = rng.normal(size=n)
    r = RInt(1)
    for a in range(0, n, 7000):
        r.append(keys[a : a + 7000], ts[a : a + 7000], vals[a : a + 7000, None])
        r.expire(int(ts[a]) - 200_000)
    lo = int(ts[-1]) - 150_000
    ks = np.arange(1000)
    cnt, sums = r.window(ks, lo, int(ts[-1]))
    w = ts > lo
    exp_cnt = np.bincount(keys[w], minlength=1000)
    exp_sum = np.bincount(keys[w], weights=vals[w], minlength=1000)
    assert (cnt == exp_cnt).all()
    np.testing.assert_allclose(sums[:, 0], exp_sum, atol=1e-8)
    assert r.nbytes < 40 * 16 * 60_000
