"""``expire(before_ts, keep_rows=N)`` of the pooled structures (R-INT, MIN/MAX, COUNT DISTINCT):
each key keeps its newest N rows and every row after ``before_ts``, nothing else; the last n <= N
rows and every time window starting at or after ``before_ts`` read exactly as without expiry."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.algorithms import DistinctCount, MinMax, RInt
from tests.engine.algorithms.brute import ALGO_SETTINGS, Stream, streams


def _apply(obj, s: Stream, perm: np.ndarray) -> None:
    k, t = s.keys[perm], s.ts[perm]
    if isinstance(obj, RInt):
        obj.append(k, t, s.vals[perm].reshape(-1, 1))
    elif isinstance(obj, MinMax):
        obj.append(k, t, s.vals[perm])
    else:
        obj.append(k, t, s.ivals[perm])


def _live(obj) -> np.ndarray:
    p = obj._pool
    return p.end - p.head


def _check(obj, s: Stream, N: int, before: int) -> None:
    keys = np.arange(s.n_keys + 1)
    # what is held: per key, max(rows after ``before``, min(rows, N))
    held = _live(obj)
    m = min(held.shape[0], s.n_keys + 1)
    live = np.zeros(s.n_keys + 1, np.int64)
    live[:m] = held[:m]
    total = 0
    for k in keys:
        mine = np.flatnonzero(s.keys == k)
        want = max(int((s.ts[mine] > before).sum()), min(mine.shape[0], N))
        assert live[k] == want
        total += want
    assert obj.live_rows == total  # the rows held, whatever room the pool has allocated
    for n in sorted({0, N // 2, N}):
        for k in keys:
            idx = np.flatnonzero(s.keys == k)[-n:] if n else np.zeros(0, np.int64)
            if isinstance(obj, RInt):
                cnt, sums = obj.rows(np.array([k]), n)
                first, last = obj.first_last_rows(np.array([k]), n)
                assert cnt[0] == idx.shape[0]
                assert sums[0, 0] == s.vals[idx].sum()
                if idx.shape[0]:
                    assert first[0] == s.vals[idx[0]] and last[0] == s.vals[idx[-1]]
            elif isinstance(obj, MinMax):
                mn, mx = obj.rows(np.array([k]), n)
                if idx.shape[0]:
                    assert mn[0] == s.vals[idx].min() and mx[0] == s.vals[idx].max()
                else:
                    assert np.isnan(mn[0]) and np.isnan(mx[0])
            else:
                assert obj.rows(np.array([k]), n)[0] == np.unique(s.ivals[idx]).shape[0]
    # a time window starting at or after ``before`` is untouched
    hi = int(s.ts[-1]) if len(s.ts) else before
    for k in keys:
        idx = np.flatnonzero((s.keys == k) & (s.ts > before) & (s.ts <= hi))
        if isinstance(obj, RInt):
            assert obj.window(np.array([k]), before, hi)[0][0] == idx.shape[0]
        elif isinstance(obj, DistinctCount):
            assert obj.window(np.array([k]), before, hi)[0] == np.unique(s.ivals[idx]).shape[0]


@ALGO_SETTINGS
@given(
    s=streams(max_events=300),
    seed=st.integers(0, 2**32 - 1),
    N=st.integers(0, 12),
    kind=st.sampled_from(["rint", "minmax", "distinct"]),
    lag=st.sampled_from([0, 3, 50, 10**6]),
    rt=st.integers(-1, 4),
)
def test_keep_rows_holds_exactly_the_newest_rows_and_the_time_horizon(
    s: Stream, seed: int, N: int, kind: str, lag: int, rt: int
) -> None:
    rng = np.random.default_rng(seed)
    obj = {"rint": lambda: RInt(1), "minmax": MinMax, "distinct": DistinctCount}[kind]()
    before = np.iinfo(np.int64).min
    batches = list(s.batches(rng))
    for j, (_, b, perm) in enumerate(batches):
        _apply(obj, s, perm)
        # expire after every batch, as the evaluator does: the time horizon trails the newest
        # event by ``lag`` (0: a ROWS-only structure) and never passes the next batch's rows
        nxt = int(s.ts[b]) - 1 if b < len(s.ts) else int(s.ts[b - 1])
        before = max(before, min(int(s.ts[b - 1]) - lag, nxt))
        obj.expire(before, keep_rows=N)
        if j == rt:
            obj = type(obj).from_bytes(obj.to_bytes())
    _check(obj, s, N, before)


def test_keep_rows_bounds_a_long_stream() -> None:
    """100,000 rows on 20 keys, a ROWS-only structure (horizon 0) keeping 50 rows per key: the
    pool stays a few times 20 x 50 rows long instead of growing with the stream."""
    rng = np.random.default_rng(7)
    r = RInt(1)
    sizes = []
    for b in range(400):
        k = rng.integers(0, 20, 250)
        t = np.full(250, 1000 + b, np.int64)
        r.append(k, t, rng.normal(size=(250, 1)))
        r.expire(1000 + b, keep_rows=50)
        sizes.append(r._cols["ts"].shape[0])
    assert int(r.total(np.arange(20)).sum()) == 20 * 50
    assert max(sizes[100:]) <= max(sizes[:100]) and max(sizes) < 20 * 50 * 16
