"""CI-COUNT and CI-SUM (engine.algorithms.ci_count / ci_sum) against brute force: the superset
and relaxation guarantees of section 4.1 / 4.2, exact answers after the post-check."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.algorithms import CICount, CISum, RInt, exact_count, exact_sum, post_check_count, post_check_sum
from tests.engine.algorithms.brute import ALGO_SETTINGS, INT64_MIN, Stream, feed, in_range, streams


def _random_range(rng: np.random.Generator, scale: float):
    kind = rng.integers(0, 4)  # 0: (lo, inf), 1: (0, hi), 2: (lo, hi), 3: tiny thresholds
    if kind == 3:
        lo, hi = float(rng.integers(0, 3)), None
    else:
        lo = float(rng.uniform(0, scale)) if kind != 1 else None
        hi = float(rng.uniform(1, 2 * scale)) if kind != 0 else None
        if rng.random() < 0.5:  # integral thresholds hit the strict / closed distinction
            lo = None if lo is None else float(math.floor(lo))
            hi = None if hi is None else float(math.ceil(hi))
    return lo, hi, bool(rng.integers(0, 2)), bool(rng.integers(0, 2))


def _window_totals(s: Stream, w: np.ndarray, what: np.ndarray):
    tot = np.bincount(s.keys[w], weights=what[w], minlength=s.n_keys)
    has = np.bincount(s.keys[w], minlength=s.n_keys) > 0
    return tot, has


def _check_lookups(idx, rint, s: Stream, rng, expired: int, what: np.ndarray, post, exact_fn, is_sum: bool):
    now = int(s.ts[-1]) + int(rng.integers(0, 3)) if len(s.ts) else 0
    # windows never reach behind the expiry horizon (the structures' documented precondition)
    span = now - expired if expired > INT64_MIN else max(1, now - int(s.ts[0]) + 5)
    if span < 1:
        return
    for _ in range(12):
        T = int(rng.integers(1, span + 1))
        w = s.ts > now - T
        tot, has = _window_totals(s, w, what)
        scale = max(2.0, float(tot.max()) if len(tot) else 2.0)
        lo, hi, ls, hs = _random_range(rng, scale)
        exact = set(
            np.nonzero(has & (tot > 0 if not is_sum else True) & in_range(tot, lo, hi, ls, hs))[0].tolist()
        )
        cand, sure = idx.lookup(T, now, lo, hi, ls, hs)
        assert (np.diff(cand) > 0).all()  # key order, no duplicates
        assert exact <= set(cand.tolist()), "superset guarantee violated"
        assert set(cand[sure].tolist()) <= exact, "a key proven by the index alone is not exact"
        assert set(exact_fn(idx, rint, T, now, lo, hi, ls, hs).tolist()) == exact
        gmin, gmax = idx.guarantee(lo, hi, ls, hs)
        for k in cand:
            assert has[k], "a key without events in the window was returned"
            assert tot[k] >= gmin - 1e-9
            if gmax is not None:
                assert tot[k] <= gmax + 1e-9
            # the paper's relaxed ranges (section 4.1): (v (1 - eps), inf) and (0, v (1 + eps))
            if lo is not None and not is_sum:
                assert tot[k] > lo * (1 - idx.eps) - 1
            if hi is not None and not is_sum:
                assert tot[k] < hi * (1 + idx.eps_upper) + 1
        assert set(post(rint, cand, T, now, lo, hi, ls, hs).tolist()) == exact


@ALGO_SETTINGS
@given(
    s=streams(max_keys=8, max_events=150, max_mult=40),
    p=st.integers(1, 64),
    seed=st.integers(0, 2**32 - 1),
    rt=st.integers(-1, 4),
    ex=st.integers(-1, 4),
    every=st.sampled_from([None, 0, 1, 7]),
)
def test_ci_count_superset_relaxation_and_exact_post_check(
    s: Stream, p: int, seed: int, rt: int, ex: int, every: int | None
):
    """every: rows between relayouts of the index's key positions (1: after every batch)."""
    rng = np.random.default_rng(seed)
    t0 = int(s.ts[0]) if len(s.ts) else 0
    pair = _Pair(CICount(p, relayout_every=every), RInt(0))

    def apply(pr, perm):
        pr.idx.update(s.keys[perm], s.ts[perm], s.mult[perm])
        pr.rint.append(s.keys[perm], s.ts[perm], mult=s.mult[perm])

    pair, expired = feed(pair, s, rng, apply, rt, ex, t0 + int(rng.integers(0, 100)))
    if len(s.ts):
        _check_lookups(
            pair.idx, pair.rint, s, rng, expired, s.mult.astype(float), post_check_count, exact_count, False
        )


@ALGO_SETTINGS
@given(
    s=streams(max_keys=8, max_events=150),
    p=st.integers(1, 64),
    seed=st.integers(0, 2**32 - 1),
    rt=st.integers(-1, 4),
    integral=st.booleans(),
    every=st.sampled_from([None, 1, 7]),
)
def test_ci_sum_superset_relaxation_and_exact_post_check(
    s: Stream, p: int, seed: int, rt: int, integral: bool, every: int | None
):
    rng = np.random.default_rng(seed)
    # non-negative values with a heavy tail: most small, some huge (O(p log a) updates)
    vals = np.floor(rng.pareto(0.7, len(s.ts)) * 10) if integral else rng.pareto(0.7, len(s.ts)) * 7.3
    vals[rng.random(len(vals)) < 0.1] = 0.0
    unit = 1.0 if integral else float(rng.choice([1.0, 0.5, 3.0]))
    pair = _Pair(CISum(p, unit, relayout_every=every), RInt(1))

    def apply(pr, perm):
        pr.idx.update(s.keys[perm], s.ts[perm], vals[perm])
        pr.rint.append(s.keys[perm], s.ts[perm], vals[perm, None])

    pair, expired = feed(pair, s, rng, apply, rt, -1, 0)
    assert pair.idx.integral == bool((vals / unit == np.floor(vals / unit)).all())
    if len(s.ts):
        _check_lookups(pair.idx, pair.rint, s, rng, expired, vals, post_check_sum, exact_sum, True)


class _Pair:
    """An index and its post-check R-INT fed the same rows (serialized together)."""

    def __init__(self, idx, rint):
        self.idx, self.rint = idx, rint

    def expire(self, before_ts):
        self.idx.expire(before_ts)
        self.rint.expire(before_ts)

    def to_bytes(self):
        a, b = self.idx.to_bytes(), self.rint.to_bytes()
        return len(a).to_bytes(8, "little") + a + b

    def from_bytes(self, data):  # used as type(pair).from_bytes(...) via the classmethod below
        raise NotImplementedError


def _pair_from_bytes(data):
    n = int.from_bytes(data[:8], "little")
    a, b = data[8 : 8 + n], data[8 + n :]
    kind = a.partition(b"\x00")[0]
    idx = (CISum if kind == b"cisum" else CICount).from_bytes(a)
    return _Pair(idx, RInt.from_bytes(b))


_Pair.from_bytes = staticmethod(_pair_from_bytes)  # type: ignore[method-assign]


@pytest.mark.parametrize("p", [1, 2, 3, 8, 64])
def test_eps_bounds_hold_for_every_threshold(p: int):
    """The slot chosen for every threshold up to 5000 units meets the eps bounds."""
    from engine.algorithms._levels import choose_slots

    ci = CICount(p)
    for u in range(1, 5000):
        _, _, gmin, _ = choose_slots(p, 20, u, None)
        assert gmin > u * (1 - ci.eps) and gmin <= u
        _, s_up, _, gmax = choose_slots(p, 20, None, u - 1)
        assert s_up >= 0 and u <= gmax + 1 < u * (1 + ci.eps_upper)


@pytest.mark.parametrize("p", [1, 2, 8])
def test_ci_count_paper_example_lemma_4_1(p: int):
    """Lemma 4.1 / 4.1.2: with u = v + 1 events needed, a returned key has more than v (1 - eps)."""
    rng = np.random.default_rng(p)
    K = 300
    ci, r = CICount(p), RInt(0)
    n = 40_000
    keys = np.minimum(rng.zipf(1.2, n) - 1, K - 1)
    ts = np.sort(rng.integers(0, 100_000, n))
    ci.update(keys, ts)
    r.append(keys, ts)
    cnt = np.bincount(keys[ts > 50_000], minlength=K)
    for v in (0, 1, 3, 10, 50, 200, 1000):
        cand = ci.candidates(50_000, 100_000, v, None)
        exact = np.nonzero(cnt > v)[0]
        assert set(exact) <= set(cand)
        assert (cnt[cand] > v * (1 - ci.eps)).all()
        assert (cnt[cand] >= 1).all()
        assert set(post_check_count(r, cand, 50_000, 100_000, v, None)) == set(exact)


def test_ci_count_large_multiplicities_cost_log_a_and_stay_exact():
    """Pane rows with huge counts: the update must not loop over the units."""
    ci, r = CICount(8), RInt(0)
    keys = np.array([0, 1, 0, 2, 1, 0])
    ts = np.array([10, 10, 20, 30, 40, 50])
    mult = np.array([10**9, 3, 10**12, 7, 10**6, 1])
    ci.update(keys, ts, mult)
    r.append(keys, ts, mult=mult)
    for T, lo in ((100, 10**12), (35, 10**6), (15, 5), (41, 10**12 - 1)):
        exact = {k for k in range(3) if mult[(keys == k) & (ts > 50 - T)].sum() > lo}
        cand = ci.candidates(T, 50, lo, None)
        assert exact <= set(cand.tolist())
        assert set(post_check_count(r, cand, T, 50, lo, None).tolist()) == exact


def test_ci_count_rejects_old_rows_and_zero_count_keys_are_not_returned():
    ci = CICount(4)
    ci.update(np.array([0, 1]), np.array([100, 200]))
    with pytest.raises(ValueError):
        ci.update(np.array([0]), np.array([50]))
    assert ci.candidates(1000, 200, None, 5).tolist() == [0, 1]
    assert ci.candidates(50, 200, None, 5).tolist() == [1]  # key 0 has count 0 in (150, 200]
    assert ci.candidates(50, 200, 0, None, lo_strict=False).tolist() == [1]
    ci.expire(150)
    assert ci.m[0] == 0 and ci.candidates(10_000, 200, None, None).tolist() == [1]
    assert ci.bytes_per_key() > 0 and ci.nbytes > 0


def test_ci_sum_rejects_negative_values():
    with pytest.raises(ValueError):
        CISum(4).update(np.array([0]), np.array([1]), np.array([-1.0]))
    assert CISum(4).candidates(10, 10, 1, None).shape == (0,)
    assert INT64_MIN < 0


def test_relayout_clusters_busy_keys_and_keeps_answers():
    """Positions are renumbered by activity (busy keys first); answers and key order unchanged."""
    rng = np.random.default_rng(7)
    K, n = 5000, 60_000
    keys = rng.permutation(K)[np.minimum(rng.zipf(1.3, n) - 1, K - 1)]
    ts = np.sort(rng.integers(0, 1_000_000, n))
    a, b, r = CICount(8, relayout_every=0), CICount(8, relayout_every=10_000), RInt(0)
    for i in range(0, n, 7_000):
        a.update(keys[i : i + 7_000], ts[i : i + 7_000])
        b.update(keys[i : i + 7_000], ts[i : i + 7_000])
    r.append(keys, ts)
    assert (a.key_of[: a._K] != b.key_of[: b._K]).any()  # b was renumbered
    busiest = np.argsort(-np.bincount(keys, minlength=K), kind="stable")[:20]
    assert set(b.pos_of[busiest].tolist()) <= set(range(60))  # the busiest keys come first
    assert (b.units(np.arange(K)) == a.units(np.arange(K))).all()
    now = int(ts[-1])
    for T, v in ((100_000, 5), (500_000, 40), (10_000, 0), (1_000_000, 300)):
        ca, sa = a.lookup(T, now, v, None)
        cb, sb = b.lookup(T, now, v, None)
        assert ca.tolist() == cb.tolist() and sa.tolist() == sb.tolist()
        exact = np.nonzero(np.bincount(keys[ts > now - T], minlength=K) > v)[0]
        assert exact_count(b, r, T, now, v, None).tolist() == exact.tolist()
    c = CICount.from_bytes(b.to_bytes())
    assert (
        exact_count(c, r, 300_000, now, 10, None).tolist()
        == exact_count(a, r, 300_000, now, 10, None).tolist()
    )


def test_levels_grow_with_headroom_and_state_counts_levels_in_use():
    """Groups are allocated ahead (fewer table copies) but only the ones in use count as state."""
    ci = CICount(4)
    allocs = 0
    orig = ci._alloc

    def counting(kcap: int, La: int) -> None:
        nonlocal allocs
        allocs += 1
        orig(kcap, La)

    ci._alloc = counting  # type: ignore[method-assign]
    for i in range(1, 21):
        ci.update(np.array([0, 1]), np.array([i, i]), np.array([2**i, 1]))
    from engine.algorithms._levels import groups_needed

    assert ci.L == groups_needed(4, 2**21 - 2) == 20 and ci.La >= ci.L
    assert allocs <= 5, allocs  # one group more per update, but few table copies
    assert ci.nbytes < ci.TS.nbytes + ci.BM.nbytes + ci.BM2.nbytes + 10 * ci.m.nbytes
    assert ci.units(np.array([0, 1, 5])).tolist() == [2**21 - 2, 20, 0]


@pytest.mark.parametrize("cls", [CICount, CISum])
def test_a_restored_index_has_room_for_more_groups(cls):
    """A restore allocates the groups a growth would (address space only): the next larger
    count brings a group into use without copying the tables, and answers as the original."""
    from engine.algorithms.ci_count import groups_allocated

    ci = cls(4)
    ci.update(np.arange(100), np.full(100, 1), np.full(100, 3))
    ci.update(np.array([7]), np.array([2]), np.array([400]))
    back = cls.from_bytes(ci.to_bytes())
    assert back.L == ci.L and back.La == groups_allocated(back.L) > back.L
    tables, L0 = back.TS, back.L
    for idx in (ci, back):
        idx.update(np.array([7]), np.array([3]), np.array([1_000]))  # needs more groups
    assert back.L == ci.L > L0 and back.TS is tables
    assert back.to_bytes() == ci.to_bytes()
    for lo in (1.0, 500.0, 1_200.0):
        assert back.lookup(10, 3, lo, None)[0].tolist() == ci.lookup(10, 3, lo, None)[0].tolist()


@pytest.mark.parametrize("cls", [CICount, CISum])
def test_reserve_keys_allocates_once_and_changes_no_answer(cls):
    """A capacity hint (the evaluator passes the keys it has interned) gives one allocation for
    the whole key domain, and the same candidates as growing batch by batch."""
    rng = np.random.default_rng(3)
    K, n = 20_000, 40_000
    keys = rng.integers(0, K, n)
    ts = np.sort(rng.integers(0, 100_000, n))
    vals = rng.integers(0, 50, n)
    a, b = cls(4), cls(4)
    b.reserve_keys(K)
    allocs = 0
    orig = b._alloc

    def counting(kcap: int, La: int) -> None:
        nonlocal allocs
        allocs += 1
        orig(kcap, La)

    b._alloc = counting
    for i in range(0, n, 4_000):
        sl = slice(i, i + 4_000)
        a.update(keys[sl], ts[sl], vals[sl])
        b.update(keys[sl], ts[sl], vals[sl])
    assert b.TS.shape[1] >= K and allocs <= 3  # only level growth, never a key-capacity copy
    now = int(ts[-1])
    for T, v in ((10_000, 3), (50_000, 20), (100_000, 0)):
        ca, sa = a.lookup(T, now, v, None)
        cb, sb = b.lookup(T, now, v, None)
        assert ca.tolist() == cb.tolist() and sa.tolist() == sb.tolist()
