"""The level structure shared by CI-COUNT and CI-SUM (Arasu & Widom 2004, section 4.1, Figure 7,
parameterized as in section 4.1.2; the same exponential-histogram bands as Datar et al. 2002).

Positions of a substream are numbered 1, 2, ..., m (m = number of *units* so far: events for
CI-COUNT, value units for CI-SUM). The *distance* of position q is ``m - q + 1`` (the newest
position has distance 1). Group ``l`` (``l = 0, 1, ...``) is the band of distances
``[p(2^l - 1) + 1, p(2^(l+1) - 1)]``: p sub-levels of width 2^l each, as in section 4.1.2.
The band holds exactly p positions that are multiples of 2^l; slot ``(l, i)`` stores the
timestamp of the i-th newest of them (``TSTAMP[k, l]`` of Figure 7 for p = 1). Its distance
always lies in ``[A, A + 2^l - 1]`` with ``A = p(2^l - 1) + i 2^l + 1``, whatever m is, so a
lookup of ``COUNT(now - T, now] >= u`` reads one slot for all keys: the slot with the largest
distance ``<= u`` (superset: a key with u events in the window has its slot element inside the
window) whose smallest distance A bounds the relaxation (count >= A > u (1 - eps),
eps = 3 / (2 (p + 1)): 3/4 for p = 1 as in Lemma 4.1, 1/2 for p = 2, roughly 1.5/p).

UPDATE adds ``a`` units with one timestamp. When m grows, a multiple of 2^l that leaves the
band of group l-1 at its old end enters group l (Figure 7, step 4: ``TSTAMP[k, l] =
TSTAMP[k, l-1]``). For ``a > 1`` all entering elements are located directly in the old
state: a group whose band moved past e multiples of 2^l shifts by e; an entering position is
either new (timestamp tau) or an old position that the old state stored in a lower group. The
cost is O(p) per group that changed, i.e. O(p log a + log m) per update, never O(a)
(section 4.2).

The *search index* of each slot is a two-level max summary over blocks of 64 keys (slot
timestamps only grow, so an update keeps it exact with one ``max``): a lookup skips every
block whose maximum is not in the window, and costs O(K / 64 + 64 |K_ao|) in the worst case
and O(|K_ao|) for clustered answers; it is a flat array scan, which beats a pointer-based
search tree at these sizes. The columns are the index's own *positions* of the keys, not their
ids: positions follow first appearance and are periodically renumbered by decreasing activity
(:func:`relayout`), so the keys a threshold lookup returns -- the busy ones -- fill a few
adjacent blocks, and the blocks' summaries skip the rest of the key space.

The exact post-check (:func:`check_count`) uses section 4.1.1's observation on R-INT:
``COUNT(now - T, now] >= u`` exactly when the key's u-th newest timestamp is later than
``now - T`` -- one array read per key; the reads of all unproven candidates are issued in one
branch-free gather so that their cache misses overlap.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numba as nb
import numpy as np

from ._pool import INT64_MIN
from .rint import kth_one

BLOCK_SHIFT = 4  # 16 keys per level-1 summary block
BLOCK2_SHIFT = 8  # 256 keys (16 level-1 blocks) per level-2 summary block


@nb.njit(cache=True, inline="always")
def _floor_log2(x):
    r = 0
    while x > 1:
        x >>= 1
        r += 1
    return r


@nb.njit(cache=True, nogil=True)
def levels_update(keys, ts, adds, m, TS, BM, BM2, p, L):
    """Apply rows (key, ts, units) in array order. TS: int64[L*p, Kcap]; BM / BM2: the slots'
    maxima over blocks of 16 / 1024 keys."""
    for r in range(keys.shape[0]):
        a = adds[r]
        if a <= 0:
            continue
        k = keys[r]
        tau = ts[r]
        m0 = m[k]
        m1 = m0 + a
        b = k >> BLOCK_SHIFT
        b2 = k >> BLOCK2_SHIFT
        for lv in range(L - 1, -1, -1):
            offl = p * ((1 << lv) - 1)
            top1 = m1 - offl
            if top1 <= 0:
                continue
            top0 = m0 - offl
            n0 = (top0 >> lv) if top0 > 0 else 0
            n1 = top1 >> lv
            e = n1 - n0
            if e == 0:
                continue
            base = lv * p
            for i in range(p - 1, -1, -1):
                if i >= e:
                    v = TS[base + i - e, k]
                else:
                    q = (n1 - i) << lv
                    if q > m0:
                        v = tau
                    else:
                        d = m0 - q + 1
                        l2 = _floor_log2((d - 1) // p + 1)
                        top0b = m0 - p * ((1 << l2) - 1)
                        i2 = (top0b >> l2) - (q >> l2)
                        v = TS[l2 * p + i2, k]
                TS[base + i, k] = v
                if v > BM[base + i, b]:
                    BM[base + i, b] = v
                    if v > BM2[base + i, b2]:
                        BM2[base + i, b2] = v
        m[k] = m1


@nb.njit(cache=True, nogil=True)
def levels_lookup(s_lo, s_up, s_lo_sure, s_up_sure, t, nkeys, TS, BM, BM2, act, bma, bma2, out, sure):
    """Candidates: keys k < nkeys with act[k] > t (an event in the window), (s_lo < 0 or
    TS[s_lo, k] > t) and (s_up < 0 or TS[s_up, k] <= t); act[k] is the key's newest event ts.

    sure[j] tells whether candidate out[j] is *proven* to satisfy the exact range by the index
    alone: (s_lo_sure == -1 or TS[s_lo_sure, k] > t) and (s_up_sure == -1 or TS[s_up_sure, k]
    <= t); a sure slot of -2 means "cannot be proven". Only the other candidates need the exact
    post-check. Blocks are filtered on the two-level max summary of slot s_lo (of act when
    s_lo < 0). Returns the number of candidates written to out / sure."""
    n = 0
    nb1 = (nkeys + (1 << BLOCK_SHIFT) - 1) >> BLOCK_SHIFT
    nb2 = (nkeys + (1 << BLOCK2_SHIFT) - 1) >> BLOCK2_SHIFT
    per2 = 1 << (BLOCK2_SHIFT - BLOCK_SHIFT)
    if s_lo >= 0:
        row = TS[s_lo]
        bm = BM[s_lo]
        bm2 = BM2[s_lo]
    else:
        row = act
        bm = bma
        bm2 = bma2
    need_act = s_lo < 0
    up = TS[max(s_up, 0)]
    los = TS[max(s_lo_sure, 0)]
    ups = TS[max(s_up_sure, 0)]
    for c in range(nb2):
        if bm2[c] <= t:
            continue
        for b in range(c * per2, min(nb1, (c + 1) * per2)):
            if bm[b] <= t:
                continue
            k0 = b << BLOCK_SHIFT
            k1 = min(nkeys, k0 + (1 << BLOCK_SHIFT))
            for k in range(k0, k1):
                if row[k] > t and (s_up < 0 or up[k] <= t) and (not need_act or act[k] > t):
                    out[n] = k
                    ok_lo = s_lo_sure == -1 or (s_lo_sure >= 0 and los[k] > t)
                    ok_up = s_up_sure == -1 or (s_up_sure >= 0 and ups[k] <= t)
                    sure[n] = ok_lo and ok_up
                    n += 1
    return n


@nb.njit(cache=True, nogil=True)
def recompute_blocks(TS, BM, BM2, blocks, nkeys, S=-1):
    """Recompute the level-1 summaries of the given blocks and the level-2 ones above them
    (slot rows 0..S-1; S < 0: every row of TS)."""
    per2 = 1 << (BLOCK2_SHIFT - BLOCK_SHIFT)
    nb1 = BM.shape[1]
    if S < 0:
        S = TS.shape[0]
    for j in range(blocks.shape[0]):
        b = blocks[j]
        k0 = b << BLOCK_SHIFT
        k1 = min(nkeys, k0 + (1 << BLOCK_SHIFT))
        for s in range(S):
            mx = INT64_MIN
            for k in range(k0, k1):
                if TS[s, k] > mx:
                    mx = TS[s, k]
            BM[s, b] = mx
    last = -1
    for j in range(blocks.shape[0]):
        c = blocks[j] >> (BLOCK2_SHIFT - BLOCK_SHIFT)
        if c == last:
            continue
        last = c
        for s in range(S):
            mx = INT64_MIN
            for b in range(c * per2, min(nb1, (c + 1) * per2)):
                if BM[s, b] > mx:
                    mx = BM[s, b]
            BM2[s, c] = mx


@nb.njit(cache=True, nogil=True)
def reset_expired(before_ts, nkeys, m, TS, act, S=-1):
    """Forget keys none of whose units is newer than before_ts; returns the touched blocks."""
    marks = np.zeros((nkeys >> BLOCK_SHIFT) + 1, np.bool_)
    if S < 0:
        S = TS.shape[0]
    for k in range(nkeys):
        if m[k] > 0 and TS[0, k] <= before_ts and act[k] <= before_ts:
            m[k] = 0
            for s in range(S):
                TS[s, k] = INT64_MIN
            marks[k >> BLOCK_SHIFT] = True
    return np.nonzero(marks)[0].astype(np.int64)


# ---------------------------------------------------------------------------- key positions
# The index stores keys at *positions* of its own (slot columns, counts, block summaries), not
# at their ids: a new key gets the next free position (first-seen order), and :func:`relayout`
# periodically renumbers the positions by decreasing recent activity. The keys a threshold
# lookup returns are the busy ones, so they end up in a few adjacent blocks: the block
# summaries skip almost everything else and the slot rows a lookup or an update touches stay
# in cache. This is a clustering of the search index (section 4.1's "search index per level"),
# invisible to callers: lookups map positions back to key ids.


@nb.njit(cache=True, nogil=True)
def assign_positions(keys, pos_of, key_of, K):
    """Positions of the rows' keys; keys without one get K, K + 1, ... in arrival order.
    Returns (positions, new K). pos_of: key id -> position (-1: none); key_of: inverse."""
    out = np.empty(keys.shape[0], np.int64)
    for i in range(keys.shape[0]):
        k = keys[i]
        q = pos_of[k]
        if q < 0:
            q = K
            pos_of[k] = q
            key_of[q] = k
            K += 1
        out[i] = q
    return out, K


@nb.njit(cache=True, nogil=True)
def batch_max_units(pos, units, m):
    """Largest m[k] after adding the batch's units (O(batch), m is left unchanged)."""
    for i in range(pos.shape[0]):
        m[pos[i]] += units[i]
    mx = 0
    for i in range(pos.shape[0]):
        if m[pos[i]] > mx:
            mx = m[pos[i]]
    for i in range(pos.shape[0]):
        m[pos[i]] -= units[i]
    return mx


@nb.njit(cache=True, nogil=True)
def touch(pos, ts, units, act, bma, bma2, score):
    """Per row: newest event timestamp of the key and its block maxima; activity score += units."""
    for i in range(pos.shape[0]):
        k = pos[i]
        score[k] += units[i]
        t = ts[i]
        if t > act[k]:
            act[k] = t
        if t > bma[k >> BLOCK_SHIFT]:
            bma[k >> BLOCK_SHIFT] = t
        if t > bma2[k >> BLOCK2_SHIFT]:
            bma2[k >> BLOCK2_SHIFT] = t


@nb.njit(cache=True, nogil=True)
def rebuild_act_blocks(act, bma, bma2, K):
    """Block maxima of act over positions 0..K-1."""
    bma[:] = INT64_MIN
    bma2[:] = INT64_MIN
    for k in range(K):
        if act[k] > bma[k >> BLOCK_SHIFT]:
            bma[k >> BLOCK_SHIFT] = act[k]
        if act[k] > bma2[k >> BLOCK2_SHIFT]:
            bma2[k >> BLOCK2_SHIFT] = act[k]


@nb.njit(cache=True, nogil=True)
def relayout_due(since, K, every):
    """Relayout policy: after ``every`` rows (every < 0: max(65536, 4 K) rows, i.e. O(L p / 4)
    amortized slot moves per row; every == 0: never)."""
    if every == 0:
        return False
    if every < 0:
        every = max(65536, 4 * K)
    return since >= every


@nb.njit(cache=True, nogil=True)
def relayout(K, S, score, TS, BM, BM2, m, act, bma, bma2, key_of, pos_of, aux):
    """Renumber positions 0..K-1 by decreasing activity score (stable: ties keep their order),
    halve the scores (exponential decay of old activity), rebuild the block summaries.
    aux (float64, per position; length 0 = none) is permuted too. O(K (S + log K))."""
    order = np.argsort(-score[:K], kind="mergesort")
    tmp = np.empty(K, np.int64)
    for s in range(S):
        row = TS[s]
        for i in range(K):
            tmp[i] = row[order[i]]
        for i in range(K):
            row[i] = tmp[i]
    for arr in (m, act, key_of):
        for i in range(K):
            tmp[i] = arr[order[i]]
        for i in range(K):
            arr[i] = tmp[i]
    for i in range(K):
        tmp[i] = score[order[i]] >> 1
    for i in range(K):
        score[i] = tmp[i]
    if aux.shape[0] >= K:
        ftmp = np.empty(K, np.float64)
        for i in range(K):
            ftmp[i] = aux[order[i]]
        for i in range(K):
            aux[i] = ftmp[i]
    for i in range(K):
        pos_of[key_of[i]] = i
    nb1 = (K + (1 << BLOCK_SHIFT) - 1) >> BLOCK_SHIFT
    recompute_blocks(TS, BM, BM2, np.arange(nb1), K, S)
    rebuild_act_blocks(act, bma, bma2, K)


# ---------------------------------------------------------------------------- exact post-check
@nb.njit(cache=True, nogil=True)
def _kth_batch(keys, idx, n, need, res, slot, head, end, base_cnt, tot, unit, c_ts, c_cnt):
    """res[i] = timestamp of key keys[idx[i]]'s need-th newest unit (kth_one), i < n, in two
    passes: the row index of each single-event key is computed from small per-key arrays first,
    then the pool is read in one branch-free gather, so the cache misses overlap."""
    K = head.shape[0]
    for i in range(n):
        k = keys[idx[i]]
        slot[i] = -1
        if need <= 0:
            res[i] = np.iinfo(np.int64).max
        elif k < 0 or k >= K or tot[k] < need:
            res[i] = INT64_MIN  # (k < 0: a candidate already rejected)
        elif unit[k]:
            slot[i] = end[k] - need
        else:
            res[i] = kth_one(k, need, head, end, base_cnt, tot, unit, c_ts, c_cnt)
    for i in range(n):
        j = slot[i]
        if j >= 0:
            res[i] = c_ts[j]


@nb.njit(cache=True, nogil=True)
def check_count(
    out, sure, n, key_of, u, w, t, head, end, base_cnt, tot, unit, c_ts, c_cnt, scr_i, scr_j, scr_t
):
    """Exact post-check of a lookup's n candidates (positions in out, proof mask in sure):
    out[:j] becomes the key ids of the candidates with ``u <= COUNT(t, now] <= w`` (u <= 0 /
    w < 0: no bound), using ``COUNT >= x <=> x-th newest ts > t`` on R-INT for the unproven
    ones only. Returns j; order is the positions' order. Scratch arrays: length >= n."""
    nu = 0
    K = head.shape[0]
    for i in range(n):
        k = key_of[out[i]]
        out[i] = k
        if not sure[i]:
            if k >= K:
                out[i] = -1  # no R-INT rows: cannot be in the answer
            else:
                scr_i[nu] = i
                nu += 1
    if u > 0:
        _kth_batch(out, scr_i, nu, u, scr_t, scr_j, head, end, base_cnt, tot, unit, c_ts, c_cnt)
        for i in range(nu):
            if scr_t[i] <= t:
                out[scr_i[i]] = -1
    if w >= 0:
        _kth_batch(out, scr_i, nu, w + 1, scr_t, scr_j, head, end, base_cnt, tot, unit, c_ts, c_cnt)
        for i in range(nu):
            if scr_t[i] > t:
                out[scr_i[i]] = -1
    j = 0
    for i in range(n):
        if out[i] >= 0:
            out[j] = out[i]
            j += 1
    return j


def slot_bounds(p: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """(A, H): smallest and largest distance of each slot, slot index = l * p + i."""
    lv = np.repeat(np.arange(L, dtype=np.int64), p)
    i = np.tile(np.arange(p, dtype=np.int64), L)
    A = p * ((np.int64(1) << lv) - 1) + i * (np.int64(1) << lv) + 1
    H = A + (np.int64(1) << lv) - 1
    return A, H


def eps_of(p: int) -> float:
    """Relative error of a lower-bounded lookup ``count > v``: every returned key has
    ``count > v (1 - eps)``; 3/4 for p = 1 (Lemma 4.1), 1/2 for p = 2, 2 / (p + 2) in general
    (section 4.1.2's "roughly 2/p"; checked exhaustively in the tests)."""
    return 0.75 if p == 1 else 2.0 / (p + 2)


def eps_upper_of(p: int) -> float:
    """Relative error of an upper-bounded lookup ``count < v``: every returned key has
    ``count < v (1 + eps_upper)``; 3 for p = 1, 2 / p in general."""
    return 3.0 if p == 1 else 2.0 / p


def groups_needed(p: int, max_m: int) -> int:
    """Smallest L with p (2^L - 1) >= max_m (group L would still be empty)."""
    L = 1
    while p * ((1 << L) - 1) < max_m:
        L += 1
    return L


@dataclass(frozen=True)
class LookupPlan:
    """The slots one lookup reads: candidate slots (s_lo, s_up; -1 = none), proof slots
    (sure_lo, sure_up; -1 = nothing to prove, -2 = cannot prove), the count bounds every
    candidate is guaranteed to meet (gmin, gmax; None = unbounded) and the integer range
    ``u <= count <= w`` of the exact answer."""

    s_lo: int
    s_up: int
    sure_lo: int
    sure_up: int
    gmin: int
    gmax: int | None
    u: int | None
    w: int | None


class SlotTable:
    """Distance bounds of the slots for one (p, L), and the slot choices of a lookup."""

    def __init__(self, p: int, L: int) -> None:
        A, H = slot_bounds(p, L)
        self.p, self.L = p, L
        self.A = A.tolist()
        self.H = H.tolist()

    def lower(self, u: int) -> tuple[int, int]:
        """Slot for ``count >= u`` (u >= 1): the largest H <= u; returns (slot, its A)."""
        s = bisect.bisect_right(self.H, u) - 1
        return s, self.A[s]

    def upper(self, w: int) -> tuple[int, int]:
        """Slot for ``count <= w`` (w >= 0): the smallest A >= w + 1; returns (slot, its H) or
        (-1, -1) when no slot can exclude anything."""
        s = bisect.bisect_left(self.A, w + 1)
        return (s, self.H[s]) if s < len(self.A) else (-1, -1)

    def sure_lower(self, u: int) -> int:
        """Slot proving ``count >= u``: the smallest A >= u (-2: none)."""
        s = bisect.bisect_left(self.A, u)
        return s if s < len(self.A) else -2

    def sure_upper(self, w: int) -> int:
        """Slot proving ``count <= w``: the largest H <= w + 1 (-2: none)."""
        s = bisect.bisect_right(self.H, w + 1) - 1
        return s if s >= 0 else -2


def choose_slots(p: int, L: int, u: int | None, w: int | None) -> tuple[int, int, int, int]:
    """Slots for ``count >= u`` (u >= 1) and ``count <= w`` (w >= 0, None = unbounded).

    Returns (s_lo, s_up, guaranteed_min, guaranteed_max): s_up = -1 when the upper bound cannot
    exclude anything; the guarantees hold for every returned key (guaranteed_max = -1: none)."""
    tab = SlotTable(p, L)
    s_lo, gmin = tab.lower(max(1, u if u is not None else 1))
    s_up, H = tab.upper(w) if w is not None else (-1, -1)
    return s_lo, s_up, gmin, (H - 1 if s_up >= 0 else -1)


def count_range(
    lo: float | None, hi: float | None, lo_strict: bool, hi_strict: bool
) -> tuple[int | None, int | None]:
    """Integer bounds (u, w) with ``count in (lo, hi)`` <=> ``u <= count <= w``."""
    u = None
    w = None
    if lo is not None:
        u = math.floor(lo) + 1 if lo_strict else math.ceil(lo)
    if hi is not None:
        w = math.ceil(hi) - 1 if hi_strict else math.floor(hi)
    return u, w


def build_plan(
    tab: SlotTable, u: int | None, w: int | None, u_sure: int | None, w_sure: int | None, min_units: int
) -> LookupPlan | None:
    """The plan of a lookup of ``u <= units <= w`` (None: unbounded) over keys with an event in
    the window, shared by CI-COUNT (min_units = 1: such a key has count >= 1) and CI-SUM
    (min_units = 0). u_sure / w_sure: the bounds whose proof implies the exact range (equal to
    u / w for counts and integral sums). None when the answer is empty."""
    if w is not None and (w < min_units or (u is not None and w < u)):
        return None
    ue = max(u if u is not None else 0, min_units)
    if ue <= 0:
        s_lo, gmin = -1, 0  # no slot: candidates are the keys with an event in the window
    else:
        s_lo, gmin = tab.lower(ue)
    s_up, h = tab.upper(w) if w is not None else (-1, -1)
    sure_lo = -1 if u_sure is None or u_sure <= min_units else tab.sure_lower(u_sure)
    sure_up = -1 if w_sure is None else (-2 if w_sure < 0 else tab.sure_upper(w_sure))
    return LookupPlan(s_lo, s_up, sure_lo, sure_up, gmin, (h - 1) if s_up >= 0 else None, u, w)
