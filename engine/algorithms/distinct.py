"""COUNT DISTINCT per key over any time window ``(lo, hi]`` or the last n rows.

Golab, Garg & Oezsu 2003 index each basic window of a sliding window with a set-valued
``value -> count`` index. We keep the same information in the form a suffix or historical
window needs: every row stores the position (per-key sequence number) of the previous
occurrence of its value, found through one ``(key, value) -> last position`` hash index kept
over all keys. The distinct values of rows ``[a, b)`` are then exactly the rows of ``[a, b)``
whose previous occurrence lies before ``a``: one sequential pass, no hashing at lookup time.
Values arrive already hashed / interned to int64 (the caller maps strings to ids).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba import types
from numba.typed import Dict

from ._base import PooledStructure
from ._pool import as_keys, broadcast_i64, order_batch
from .rint import _bounds_rows, _bounds_time

_KEY_T = types.UniTuple(types.int64, 2)


def _new_index() -> Dict:
    return Dict.empty(key_type=_KEY_T, value_type=types.int64)


@nb.njit(cache=True, nogil=True)
def _append(keys, ts, vals, head, end, first_seq, last_ts, c_ts, c_v, c_prev, index):
    for i in range(keys.shape[0]):
        k = keys[i]
        e = end[k]
        seq = first_seq[k] + (e - head[k])
        c_ts[e] = ts[i]
        c_v[e] = vals[i]
        c_prev[e] = index.get((k, vals[i]), -1)
        index[(k, vals[i])] = seq
        end[k] = e + 1
        last_ts[k] = ts[i]


@nb.njit(cache=True, nogil=True)
def _advance_seq(new_head, head, first_seq):
    for k in range(head.shape[0]):
        first_seq[k] += new_head[k] - head[k]


@nb.njit(cache=True, nogil=True)
def _rebuild_index(index, head, end, first_seq, c_v):
    index.clear()
    for k in range(head.shape[0]):
        for i in range(head[k], end[k]):
            index[(k, c_v[i])] = first_seq[k] + (i - head[k])


@nb.njit(cache=True, nogil=True)
def _distinct(keys, i1, i2, head, first_seq, c_prev):
    m = keys.shape[0]
    out = np.zeros(m, np.int64)
    for j in range(m):
        a = i1[j]
        b = i2[j]
        if b <= a:
            continue
        k = keys[j]
        sa = first_seq[k] + (a - head[k])
        n = 0
        for i in range(a, b):
            if c_prev[i] < sa:
                n += 1
        out[j] = n
    return out


class DistinctCount(PooledStructure):
    """Exact COUNT DISTINCT of an int64 value column per key."""

    _kind = "distinct"

    def __init__(self, min_cap: int = 4) -> None:
        super().__init__(min_cap)
        self._add_col("ts", np.int64, None, 0)
        self._add_col("v", np.int64, None, 0)
        self._add_col("prev", np.int64, None, -1)
        self._add_kcol("first_seq", np.int64, None, 0)
        self._index = _new_index()

    def append(self, key_ids: np.ndarray, ts: np.ndarray, values: np.ndarray) -> None:
        """Apply a batch of rows (per key by ts, ties in array order)."""
        keys = as_keys(key_ids)
        t = np.ascontiguousarray(ts, dtype=np.int64)
        v = np.ascontiguousarray(values, dtype=np.int64).reshape(keys.shape[0])
        self._prepare(keys, t)
        kc = self._kcols
        order = order_batch(keys, t, kc["last_ts"])
        if order is not None:
            keys, t, v = keys[order], t[order], v[order]
        c = self._cols
        p = self._pool
        _append(
            keys, t, v, p.head, p.end, kc["first_seq"], kc["last_ts"], c["ts"], c["v"], c["prev"], self._index
        )

    def _on_expire(self, new_head: np.ndarray) -> None:
        _advance_seq(new_head, self._pool.head, self._kcols["first_seq"])

    def expire(self, before_ts: int, keep_rows: int | None = None) -> None:
        super().expire(before_ts, keep_rows)
        if len(self._index) > 2 * self._pool.live() + 1024:
            p = self._pool
            _rebuild_index(self._index, p.head, p.end, self._kcols["first_seq"], self._cols["v"])

    def window(self, key_ids: np.ndarray, lo: object, hi: object) -> np.ndarray:
        """Number of distinct values among rows with lo < ts <= hi (int64[m])."""
        keys = as_keys(key_ids)
        m = keys.shape[0]
        p = self._pool
        i1, i2 = _bounds_time(
            keys, broadcast_i64(lo, m), broadcast_i64(hi, m), p.head, p.end, self._cols["ts"]
        )
        return _distinct(keys, i1, i2, p.head, self._kcols["first_seq"], self._cols["prev"])

    def rows(self, key_ids: np.ndarray, n: object) -> np.ndarray:
        """Number of distinct values among each key's last n rows."""
        keys = as_keys(key_ids)
        p = self._pool
        i1, i2 = _bounds_rows(keys, broadcast_i64(n, keys.shape[0]), p.head, p.end)
        return _distinct(keys, i1, i2, p.head, self._kcols["first_seq"], self._cols["prev"])

    @property
    def nbytes(self) -> int:
        return super().nbytes + 32 * len(self._index)

    def _after_restore(self) -> None:
        p = self._pool
        self._index = _new_index()
        _rebuild_index(self._index, p.head, p.end, self._kcols["first_seq"], self._cols["v"])

    @classmethod
    def _empty_from_meta(cls, meta: dict[str, np.ndarray]) -> DistinctCount:
        return cls()
