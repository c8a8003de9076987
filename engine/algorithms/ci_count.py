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
    BLOCK_SHIFT,
    choose_slots,
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
from .rint import RInt, count_filter


class CICount:
    """CI-COUNT over all keys of one substream family, with p sub-levels per level."""

    _kind = "cicount"

    def __init__(self, p: int = 8) -> None:
        if p < 1:
            raise ValueError("p must be >= 1")
        self.p = int(p)
        self.L = 1
        self._K = 0  # number of key ids in use
        self._alloc(64, 1)

    # ----------------------------------------------------------------- storage
    def _alloc(self, kcap: int, L: int) -> None:
        S = L * self.p
        nb_ = (kcap >> BLOCK_SHIFT) + 1
        TS = np.full((S, kcap), INT64_MIN, np.int64)
        BM = np.full((S, nb_), INT64_MIN, np.int64)
        m = np.zeros(kcap, np.int64)
        act = np.full(kcap, INT64_MIN, np.int64)
        bma = np.full(nb_, INT64_MIN, np.int64)
        if hasattr(self, "TS"):
            s0, k0 = self.TS.shape
            TS[:s0, :k0] = self.TS
            BM[:s0, : self.BM.shape[1]] = self.BM
            m[:k0] = self.m
            act[:k0] = self.act
            bma[: self.bma.shape[0]] = self.bma
        self.TS, self.BM, self.m, self.act, self.bma = TS, BM, m, act, bma
        self._out = np.empty(kcap, np.int64)
        self.L = L

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
        levels_update(keys, ts, units, self.m, self.TS, self.BM, self.p, self.L)
        _touch_act(keys, ts, self.act, self.bma)

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
            recompute_blocks(self.TS, self.BM, blocks, self._K)

    # ----------------------------------------------------------------- lookup
    def _slots(self, lo: float | None, hi: float | None, lo_strict: bool, hi_strict: bool):
        u, w = count_range(lo, hi, lo_strict, hi_strict)
        return u, w, choose_slots(self.p, self.L, u, w)

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
        u, w, (s_lo, s_up, _, _) = self._slots(lo, hi, lo_strict, hi_strict)
        if w is not None and (w < 1 or (u is not None and w < u)):
            return np.empty(0, np.int64)
        t = np.int64(now) - np.int64(T)
        n = levels_lookup(s_lo, s_up, t, self._K, self.TS, self.BM, self.act, self.bma, self._out)
        return self._out[:n].copy()

    def guarantee(
        self, lo: float | None, hi: float | None, lo_strict: bool = True, hi_strict: bool = True
    ) -> tuple[int, int | None]:
        """(min, max) count every candidate is guaranteed to have (max None: unbounded)."""
        u, w, (_, s_up, gmin, gmax) = self._slots(lo, hi, lo_strict, hi_strict)
        return gmin, (gmax if s_up >= 0 else None)

    # ----------------------------------------------------------------- state
    @property
    def nbytes(self) -> int:
        return int(self.TS.nbytes + self.BM.nbytes + self.m.nbytes + self.act.nbytes + self.bma.nbytes)

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
        recompute_blocks(obj.TS, obj.BM, blocks, K)
        _rebuild_bma(obj.act, obj.bma, K)
        return obj

    def _restore_extra(self, arrays: dict[str, np.ndarray]) -> None:
        """Hook for subclasses."""


@nb.njit(cache=True)
def _touch_act(keys, ts, act, bma):
    """Newest event timestamp per key and its block maximum."""
    for i in range(keys.shape[0]):
        k = keys[i]
        if ts[i] > act[k]:
            act[k] = ts[i]
        b = k >> BLOCK_SHIFT
        if ts[i] > bma[b]:
            bma[b] = ts[i]


@nb.njit(cache=True)
def _rebuild_bma(act, bma, K):
    bma[:] = INT64_MIN
    for k in range(K):
        b = k >> BLOCK_SHIFT
        if act[k] > bma[b]:
            bma[b] = act[k]


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
        rint._pool.head, rint._pool.end, kc["base_cnt"], rint._cols["cnt"], rint._cols["ts"],
    )  # fmt: skip
    return cand[:n]
