"""Exact sliding MIN / MAX per key for any time window ``(lo, hi]`` or the last n rows.

MIN and MAX are not subtractable, so R-INT does not apply (Arasu & Widom 2004, section 3.1).
We use the B-INT idea of section 3.1.1 -- precomputed aggregates of aligned *base intervals*
of widths 2^5 and 2^10 -- laid out, as section 5 suggests, as plain arrays indexed by position
(here: position in the shared pool of :mod:`engine.algorithms._pool`). A lookup decomposes the
window's rows into at most 31 + 31 single rows, 31 + 31 level-5 blocks and the level-10 blocks
in between: O(n / 1024 + 124) worst case, O(1) per update. A block is only used when it lies
entirely inside one key's live rows, so blocks never mix keys.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ._base import PooledStructure
from ._pool import Plan, as_keys, broadcast_i64, order_batch
from .rint import _bounds_rows, _bounds_time

_B1 = 5  # log2 of the small block width
_B2 = 10  # log2 of the large block width


@nb.njit(cache=True, nogil=True)
def _fold(i, x, s1min, s1max, s2min, s2max):
    j = i >> _B1
    if x < s1min[j]:
        s1min[j] = x
    if x > s1max[j]:
        s1max[j] = x
    j = i >> _B2
    if x < s2min[j]:
        s2min[j] = x
    if x > s2max[j]:
        s2max[j] = x


@nb.njit(cache=True, nogil=True)
def _append(keys, ts, vals, end, last_ts, c_ts, c_v, s1min, s1max, s2min, s2max):
    for i in range(keys.shape[0]):
        k = keys[i]
        e = end[k]
        c_ts[e] = ts[i]
        c_v[e] = vals[i]
        _fold(e, vals[i], s1min, s1max, s2min, s2max)
        end[k] = e + 1
        last_ts[k] = ts[i]


@nb.njit(cache=True, nogil=True)
def _rebuild(keys, off, cap, head, end, c_v, s1min, s1max, s2min, s2max):
    """Reset the blocks inside the keys' regions and fold their live rows again."""
    inf = np.inf
    for j in range(keys.shape[0]):
        k = keys[j]
        a = off[k]
        b = off[k] + cap[k]
        for q in range((a + (1 << _B1) - 1) >> _B1, b >> _B1):
            s1min[q] = inf
            s1max[q] = -inf
        for q in range((a + (1 << _B2) - 1) >> _B2, b >> _B2):
            s2min[q] = inf
            s2max[q] = -inf
        for i in range(head[k], end[k]):
            _fold(i, c_v[i], s1min, s1max, s2min, s2max)


@nb.njit(cache=True, nogil=True)
def _range(i1, i2, c_v, s1min, s1max, s2min, s2max):
    m = i1.shape[0]
    mins = np.full(m, np.nan)
    maxs = np.full(m, np.nan)
    w1 = 1 << _B1
    w2 = 1 << _B2
    for j in range(m):
        a = i1[j]
        b = i2[j]
        if b <= a:
            continue
        lo = np.inf
        hi = -np.inf
        i = a
        while i < b and (i & (w1 - 1)) != 0:
            x = c_v[i]
            lo = min(lo, x)
            hi = max(hi, x)
            i += 1
        while i + w1 <= b and (i & (w2 - 1)) != 0:
            lo = min(lo, s1min[i >> _B1])
            hi = max(hi, s1max[i >> _B1])
            i += w1
        while i + w2 <= b:
            lo = min(lo, s2min[i >> _B2])
            hi = max(hi, s2max[i >> _B2])
            i += w2
        while i + w1 <= b:
            lo = min(lo, s1min[i >> _B1])
            hi = max(hi, s1max[i >> _B1])
            i += w1
        while i < b:
            x = c_v[i]
            lo = min(lo, x)
            hi = max(hi, x)
            i += 1
        mins[j] = lo
        maxs[j] = hi
    return mins, maxs


class MinMax(PooledStructure):
    """Exact MIN and MAX of one value column per key (B-INT-style blocked base intervals)."""

    _kind = "minmax"

    def __init__(self, min_cap: int = 4) -> None:
        super().__init__(min_cap)
        self._add_col("ts", np.int64, None, 0)
        self._add_col("v", np.float64, None, 0.0)
        self._sum: dict[str, np.ndarray] = {}
        self._resize_summaries(0)

    def _resize_summaries(self, n: int) -> None:
        for name, shift, fill in (
            ("s1min", _B1, np.inf), ("s1max", _B1, -np.inf), ("s2min", _B2, np.inf), ("s2max", _B2, -np.inf)
        ):  # fmt: skip
            size = (n >> shift) + 1
            old = self._sum.get(name)
            if old is not None and old.shape[0] >= size:
                continue
            new = np.full(size, fill)
            if old is not None:
                new[: old.shape[0]] = old
            self._sum[name] = new

    def _after_moves(self, plan: Plan) -> None:
        if plan.fresh:
            self._sum = {}
        self._resize_summaries(self._pool_len())
        p = self._pool
        s = self._sum
        keys = np.arange(p.n_keys, dtype=np.int64) if plan.fresh else plan.keys
        _rebuild(
            keys, p.off, p.cap, p.head, p.end, self._cols["v"], s["s1min"], s["s1max"], s["s2min"], s["s2max"]
        )

    def _after_restore(self) -> None:
        self._sum = {}
        self._resize_summaries(self._pool_len())
        p = self._pool
        s = self._sum
        keys = np.arange(p.n_keys, dtype=np.int64)
        _rebuild(
            keys, p.off, p.cap, p.head, p.end, self._cols["v"], s["s1min"], s["s1max"], s["s2min"], s["s2max"]
        )

    def append(self, key_ids: np.ndarray, ts: np.ndarray, values: np.ndarray) -> None:
        """Apply a batch of rows (per key by ts, ties in array order)."""
        keys = as_keys(key_ids)
        t = np.ascontiguousarray(ts, dtype=np.int64)
        v = np.ascontiguousarray(values, dtype=np.float64).reshape(keys.shape[0])
        self._prepare(keys, t)
        order = order_batch(keys, t, self._kcols["last_ts"])
        if order is not None:
            keys, t, v = keys[order], t[order], v[order]
        s = self._sum
        c = self._cols
        _append(
            keys, t, v, self._pool.end, self._kcols["last_ts"], c["ts"], c["v"],
            s["s1min"], s["s1max"], s["s2min"], s["s2max"],
        )  # fmt: skip

    def _lookup(self, i1: np.ndarray, i2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = self._sum
        return _range(i1, i2, self._cols["v"], s["s1min"], s["s1max"], s["s2min"], s["s2max"])

    def window(self, key_ids: np.ndarray, lo: object, hi: object) -> tuple[np.ndarray, np.ndarray]:
        """(mins, maxs) over rows with lo < ts <= hi; NaN when empty."""
        keys = as_keys(key_ids)
        m = keys.shape[0]
        i1, i2 = _bounds_time(
            keys,
            broadcast_i64(lo, m),
            broadcast_i64(hi, m),
            self._pool.head,
            self._pool.end,
            self._cols["ts"],
        )
        return self._lookup(i1, i2)

    def rows(self, key_ids: np.ndarray, n: object) -> tuple[np.ndarray, np.ndarray]:
        """(mins, maxs) over each key's last n rows; NaN when empty."""
        keys = as_keys(key_ids)
        i1, i2 = _bounds_rows(keys, broadcast_i64(n, keys.shape[0]), self._pool.head, self._pool.end)
        return self._lookup(i1, i2)

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(a.nbytes for a in self._sum.values())

    @classmethod
    def _empty_from_meta(cls, meta: dict[str, np.ndarray]) -> MinMax:
        return cls()
