"""CI-COUNT: the collective index for many COUNT threshold rules over all keys
(Arasu & Widom 2004, section 4.1, Figure 7; parameterized by p as in section 4.1.2).

One index answers every SSF operator ``{k | COUNT(S_k(now - T, now]) in R}`` over one
(filtered) stream, for any window T and any range R: ``candidates`` returns, in
O(K / 64 + |K_ao|), a superset of the exact answer whose members all satisfy the relaxed
range (eps = 2 / (p + 2), see :mod:`engine.algorithms._levels`). Exact results come from
post-checking the candidates with R-INT (:func:`post_check_count`): ``COUNT >= u`` exactly when
the key's u-th newest timestamp is later than ``now - T``.

Batches of ``(key, ts, mult)`` rows serve raw events (mult = 1) and pane rows (mult = the
pane's count) alike; a row of multiplicity a costs O(p log a), not O(a) (section 4.2).
Precondition of a lookup: every applied timestamp is ``<= now``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ._levels import (
    BLOCK2_SHIFT,
    BLOCK_SHIFT,
    LookupPlan,
    SlotTable,
    count_range,
    eps_of,
    eps_upper_of,
    groups_needed,
    levels_lookup,
    levels_update,
    recompute_blocks,
    reset_expired,
)
from ._pool import INT64_MIN, as_keys, order_batch, pack, unpack
from .rint import RInt, count_filter, kth_one

_MISSING = object()


class CICount:
    """CI-COUNT over all keys of one substream family, with p sub-levels per level."""

    _kind = "cicount"
    TS: np.ndarray  # int64[L * p, Kcap]: slot timestamps, slot-major (a lookup scans one row)
    BM: np.ndarray  # int64[L * p, Kcap / 16]: slot maxima over blocks of 16 keys
    BM2: np.ndarray  # int64[L * p, Kcap / 256]: slot maxima over blocks of 256 keys
    m: np.ndarray  # int64[Kcap]: units (events) per key so far
    act: np.ndarray  # int64[Kcap]: newest event timestamp per key
    bma: np.ndarray  # block maxima of act (16 keys)
    bma2: np.ndarray  # block maxima of act (256 keys)

    def __init__(self, p: int = 8) -> None:
        if p < 1:
            raise ValueError("p must be >= 1")
        self.p = int(p)
        self.L = 1
        self._K = 0  # number of key ids in use
        self._plans: dict[tuple, LookupPlan | None] = {}
        self._alloc(64, 1)

    # ----------------------------------------------------------------- storage
    def _alloc(self, kcap: int, L: int) -> None:
        S = L * self.p
        nb1 = (kcap >> BLOCK_SHIFT) + 1
        nb2 = (kcap >> BLOCK2_SHIFT) + 1
        TS = np.full((S, kcap), INT64_MIN, np.int64)
        BM = np.full((S, nb1), INT64_MIN, np.int64)
        BM2 = np.full((S, nb2), INT64_MIN, np.int64)
        m = np.zeros(kcap, np.int64)
        act = np.full(kcap, INT64_MIN, np.int64)
        bma = np.full(nb1, INT64_MIN, np.int64)
        bma2 = np.full(nb2, INT64_MIN, np.int64)
        if hasattr(self, "TS"):
            s0, k0 = self.TS.shape
            TS[:s0, :k0] = self.TS
            BM[:s0, : self.BM.shape[1]] = self.BM
            BM2[:s0, : self.BM2.shape[1]] = self.BM2
            m[:k0] = self.m
            act[:k0] = self.act
            bma[: self.bma.shape[0]] = self.bma
            bma2[: self.bma2.shape[0]] = self.bma2
        self.TS, self.BM, self.BM2, self.m, self.act, self.bma, self.bma2 = TS, BM, BM2, m, act, bma, bma2
        self._out = np.empty(kcap, np.int64)
        self._sure = np.empty(kcap, np.bool_)
        self.L = L
        self._tab: SlotTable | None = None

    def _grow(self, nkeys: int, max_m: int) -> None:
        kcap = self.TS.shape[1]
        L = max(self.L, groups_needed(self.p, max_m))
        if nkeys > kcap or L > self.L:
            self._alloc(max(kcap, nkeys, 2 * kcap if nkeys > kcap else 0), L)
        self._K = max(self._K, nkeys)

    @property
    def eps(self) -> float:
        """Relative error of lower-bounded lookups: candidates of ``count > v`` have
        ``count > v (1 - eps)`` (3/4 for p = 1, 2 / (p + 2) otherwise)."""
        return eps_of(self.p)

    @property
    def eps_upper(self) -> float:
        """Relative error of upper-bounded lookups: candidates of ``count < v`` have
        ``count < v (1 + eps_upper)`` (3 for p = 1, 2 / p otherwise)."""
        return eps_upper_of(self.p)

    @property
    def n_keys(self) -> int:
        return self._K

    # ----------------------------------------------------------------- update
    def _apply(self, keys: np.ndarray, ts: np.ndarray, units: np.ndarray) -> None:
        n = keys.shape[0]
        if n == 0:
            return
        if ts.shape[0] != n or units.shape[0] != n:
            raise ValueError("key_ids, ts and mult must have the same length")
        if units.min() < 0:
            raise ValueError("multiplicities must be >= 0")
        nkeys = int(keys.max()) + 1
        if nkeys > self.TS.shape[1]:
            self._grow(nkeys, 0)
        order = order_batch(keys, ts, self._last)
        if order is not None:
            keys, ts, units = keys[order], ts[order], units[order]
        per_key = np.bincount(keys, weights=units, minlength=nkeys)
        max_m = int((self.m[:nkeys] + per_key).max()) if nkeys else 0
        self._grow(nkeys, max_m)
        levels_update(keys, ts, units, self.m, self.TS, self.BM, self.BM2, self.p, self.L)
        _touch_act(keys, ts, self.act, self.bma, self.bma2)

    @property
    def _last(self) -> np.ndarray:
        return self.act

    def update(self, key_ids: np.ndarray, ts: np.ndarray, mult: np.ndarray | None = None) -> None:
        """Apply a batch of rows; each stands for ``mult`` events (default 1) at its ts."""
        keys = as_keys(key_ids)
        t = np.ascontiguousarray(ts, dtype=np.int64)
        mu = np.ones(keys.shape[0], np.int64) if mult is None else np.ascontiguousarray(mult, dtype=np.int64)
        self._apply(keys, t, mu)

    def expire(self, before_ts: int) -> None:
        """Forget keys with no event after before_ts (their state restarts empty)."""
        blocks = reset_expired(np.int64(before_ts), self._K, self.m, self.TS, self.act)
        if blocks.shape[0]:
            recompute_blocks(self.TS, self.BM, self.BM2, blocks, self._K)

    # ----------------------------------------------------------------- lookup
    def _table(self) -> SlotTable:
        tab = self._tab
        if tab is None or tab.L != self.L:
            tab = self._tab = SlotTable(self.p, self.L)
        return tab

    def plan(
        self, lo: float | None, hi: float | None, lo_strict: bool = True, hi_strict: bool = True
    ) -> LookupPlan | None:
        """Slots of a lookup of ``COUNT in (lo, hi)`` (None: the answer is empty)."""
        key = (self.L, lo, hi, lo_strict, hi_strict)
        pl = self._plans.get(key, _MISSING)
        if pl is _MISSING:
            if len(self._plans) > 4096:
                self._plans.clear()
            pl = self._plans[key] = self._make_plan(lo, hi, lo_strict, hi_strict)
        return pl  # type: ignore[return-value]

    def _make_plan(
        self, lo: float | None, hi: float | None, lo_strict: bool, hi_strict: bool
    ) -> LookupPlan | None:
        u, w = count_range(lo, hi, lo_strict, hi_strict)
        if w is not None and (w < 1 or (u is not None and w < u)):
            return None
        tab = self._table()
        s_lo, gmin = tab.lower(max(1, u if u is not None else 1))
        s_up, h = tab.upper(w) if w is not None else (-1, -1)
        sure_lo = -1 if u is None or u <= 1 else tab.sure_lower(u)
        sure_up = -1 if w is None else tab.sure_upper(w)
        return LookupPlan(s_lo, s_up, sure_lo, sure_up, gmin, (h - 1) if s_up >= 0 else None, u, w)

    def lookup(
        self,
        T: int,
        now: int,
        lo: float | None,
        hi: float | None,
        lo_strict: bool = True,
        hi_strict: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(candidates, sure): the candidates of :meth:`candidates` in key order and a mask of
        those the index alone proves to be in the exact answer (the rest needs the post-check)."""
        pl = self.plan(lo, hi, lo_strict, hi_strict)
        if pl is None:
            return np.empty(0, np.int64), np.empty(0, bool)
        return self._run(pl, np.int64(now) - np.int64(T))

    def _run(self, pl: LookupPlan, t: np.int64) -> tuple[np.ndarray, np.ndarray]:
        n = levels_lookup(
            pl.s_lo, pl.s_up, pl.sure_lo, pl.sure_up, t, self._K, self.TS, self.BM, self.BM2, self.act, self.bma,
            self.bma2, self._out, self._sure,
        )  # fmt: skip
        return self._out[:n].copy(), self._sure[:n].copy()

    def candidates(
        self,
        T: int,
        now: int,
        lo: float | None,
        hi: float | None,
        lo_strict: bool = True,
        hi_strict: bool = True,
    ) -> np.ndarray:
        """Key ids whose COUNT over (now - T, now] may lie in the range (lo, hi).

        A superset of the exact answer; every returned key has at least one event in the window
        and a count within the relaxed range (see :meth:`guarantee`)."""
        return self.lookup(T, now, lo, hi, lo_strict, hi_strict)[0]

    def guarantee(
        self, lo: float | None, hi: float | None, lo_strict: bool = True, hi_strict: bool = True
    ) -> tuple[float, float | None]:
        """(min, max) count every candidate is guaranteed to have (max None: unbounded)."""
        pl = self.plan(lo, hi, lo_strict, hi_strict)
        if pl is None:
            return 0, None
        return pl.gmin, pl.gmax

    # ----------------------------------------------------------------- state
    @property
    def nbytes(self) -> int:
        arrays = (self.TS, self.BM, self.BM2, self.m, self.act, self.bma, self.bma2)
        return int(sum(a.nbytes for a in arrays))

    def bytes_per_key(self) -> float:
        """Index state per key in use (slot timestamps + count + newest ts)."""
        return (self.L * self.p * 8 + 16) if self._K else 0.0

    def to_bytes(self) -> bytes:
        K = self._K
        arrays = {"TS": self.TS[:, :K], "m": self.m[:K], "act": self.act[:K]}
        return self._kind.encode() + b"\x00" + pack(arrays, {"p": self.p, "L": self.L, "K": K})

    @classmethod
    def from_bytes(cls, b: bytes) -> CICount:
        kind, _, rest = b.partition(b"\x00")
        if kind.decode() != cls._kind:
            raise ValueError(f"bytes hold a {kind.decode()!r}, not a {cls._kind!r}")
        arrays, meta = unpack(rest)
        obj = cls(int(meta["p"]))
        K = int(meta["K"])
        obj._alloc(max(64, K), int(meta["L"]))
        obj._K = K
        obj.TS[:, :K] = arrays["TS"]
        obj.m[:K] = arrays["m"]
        obj.act[:K] = arrays["act"]
        obj._restore_extra(arrays)
        blocks = np.arange((K >> BLOCK_SHIFT) + 1, dtype=np.int64) if K else np.zeros(0, np.int64)
        recompute_blocks(obj.TS, obj.BM, obj.BM2, blocks, K)
        _rebuild_bma(obj.act, obj.bma, obj.bma2, K)
        return obj

    def _restore_extra(self, arrays: dict[str, np.ndarray]) -> None:
        """Hook for subclasses."""


@nb.njit(cache=True)
def _touch_act(keys, ts, act, bma, bma2):
    """Newest event timestamp per key and its block maxima."""
    for i in range(keys.shape[0]):
        k = keys[i]
        if ts[i] > act[k]:
            act[k] = ts[i]
        if ts[i] > bma[k >> BLOCK_SHIFT]:
            bma[k >> BLOCK_SHIFT] = ts[i]
        if ts[i] > bma2[k >> BLOCK2_SHIFT]:
            bma2[k >> BLOCK2_SHIFT] = ts[i]


@nb.njit(cache=True)
def _rebuild_bma(act, bma, bma2, K):
    bma[:] = INT64_MIN
    bma2[:] = INT64_MIN
    for k in range(K):
        if act[k] > bma[k >> BLOCK_SHIFT]:
            bma[k >> BLOCK_SHIFT] = act[k]
        if act[k] > bma2[k >> BLOCK2_SHIFT]:
            bma2[k >> BLOCK2_SHIFT] = act[k]


def post_check_count(
    rint: RInt,
    cand: np.ndarray,
    T: int,
    now: int,
    lo: float | None,
    hi: float | None,
    lo_strict: bool = True,
    hi_strict: bool = True,
) -> np.ndarray:
    """Exact filter of candidates with R-INT: ``COUNT >= u <=> kth_newest_ts(u) > now - T``.

    The R-INT must hold the same rows (with the same multiplicities) as the index."""
    cand = as_keys(cand).copy()
    u, w = count_range(lo, hi, lo_strict, hi_strict)
    if w is not None and w < 0:
        return cand[:0]
    kc = rint._kcols
    n = count_filter(
        cand, cand.shape[0], -1 if u is None else u, -1 if w is None else w, np.int64(now) - np.int64(T),
        rint._pool.head, rint._pool.end, kc["base_cnt"], kc["tot"], kc["unit"], rint._cols["ts"], rint._cols["cnt"],
    )  # fmt: skip
    return cand[:n]


@nb.njit(cache=True)
def _exact_count_kernel(s_lo, s_up, sure_lo, sure_up, u, w, t, nkeys, TS, BM, BM2, act, bma, bma2, out, sure,
                        head, end, base_cnt, tot, unit, c_ts, c_cnt):  # fmt: skip
    """Candidates of the index, the unproven ones checked with R-INT; returns the count in out."""
    n = levels_lookup(s_lo, s_up, sure_lo, sure_up, t, nkeys, TS, BM, BM2, act, bma, bma2, out, sure)
    K = head.shape[0]
    j = 0
    for i in range(n):
        k = out[i]
        if not sure[i]:
            if k >= K:
                continue
            if u > 0 and kth_one(k, u, head, end, base_cnt, tot, unit, c_ts, c_cnt) <= t:
                continue
            if w >= 0 and kth_one(k, w + 1, head, end, base_cnt, tot, unit, c_ts, c_cnt) > t:
                continue
        out[j] = k
        j += 1
    return j


def exact_count(
    ci: CICount,
    rint: RInt,
    T: int,
    now: int,
    lo: float | None,
    hi: float | None,
    lo_strict: bool = True,
    hi_strict: bool = True,
) -> np.ndarray:
    """Exact answer ``{k | COUNT(now - T, now] in (lo, hi), COUNT >= 1}`` in key order:
    CI-COUNT candidates, the ones the index cannot prove post-checked with R-INT (which must
    hold the same rows with the same multiplicities). One Numba call."""
    pl = ci.plan(lo, hi, lo_strict, hi_strict)
    if pl is None:
        return np.empty(0, np.int64)
    kc = rint._kcols
    n = _exact_count_kernel(
        pl.s_lo, pl.s_up, pl.sure_lo, pl.sure_up, -1 if pl.u is None else pl.u, -1 if pl.w is None else pl.w,
        np.int64(now) - np.int64(T), ci._K, ci.TS, ci.BM, ci.BM2, ci.act, ci.bma, ci.bma2, ci._out, ci._sure,
        rint._pool.head, rint._pool.end, kc["base_cnt"], kc["tot"], kc["unit"], rint._cols["ts"], rint._cols["cnt"],
    )  # fmt: skip
    return ci._out[:n].copy()
