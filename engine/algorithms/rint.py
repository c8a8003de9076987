"""R-INT: running (prefix) aggregates per key (Arasu & Widom 2004, section 3.2, Figure 6).

For a subtractable aggregate (COUNT, SUM, hence AVG) R-INT keeps, per substream, the values
``f(1, r)`` of the *running intervals* ending at every element; the aggregate of any interval
``(l, r]`` is ``f(1, r) - f(1, l)``. Here every key keeps, in its pool region
(:mod:`engine.algorithms._pool`), the timestamps of its rows, the running count (a row stands for
``mult`` events: raw events have 1, pane rows their pane's count) and the running sums of
``n_cols`` value columns -- exact, in 128-bit fixed point (:mod:`engine.algorithms.fixed128`), so a
window's SUM is the float64 nearest to the exact sum however its rows were grouped -- plus the raw
values for FIRST/LAST. An update is O(1); a time-based
window ``(lo, hi]`` costs two binary searches (O(1) for a suffix window's right end), a
tuple-based window (last n rows) is O(1). ``kth_newest_ts`` gives the timestamp of the k-th
newest event, which turns the COUNT threshold test into a constant-time check:
``COUNT(now - T, now] >= k  <=>  kth_newest_ts(k) > now - T`` (section 4.1.1's observation).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from . import fixed128 as fx
from ._base import PooledStructure
from ._pool import INT64_MIN, as_keys, broadcast_i64, order_batch, search_after


@nb.njit(cache=True, nogil=True)
def _append(
    keys, ts, vals, vh, vl, mult, head, end, base_cnt, base_sh, base_sl, last_ts, tot, unit,
    c_ts, c_cnt, c_sh, c_sl, c_val,
):  # fmt: skip
    ncol = vals.shape[1]
    for i in range(keys.shape[0]):
        k = keys[i]
        e = end[k]
        if e > head[k]:
            pc = c_cnt[e - 1]
            for c in range(ncol):
                c_sh[e, c], c_sl[e, c] = fx.add(c_sh[e - 1, c], c_sl[e - 1, c], vh[i, c], vl[i, c])
        else:
            pc = base_cnt[k]
            for c in range(ncol):
                c_sh[e, c], c_sl[e, c] = fx.add(base_sh[k, c], base_sl[k, c], vh[i, c], vl[i, c])
        for c in range(ncol):
            c_val[e, c] = vals[i, c]
        c_ts[e] = ts[i]
        c_cnt[e] = pc + mult[i]
        tot[k] += mult[i]
        if mult[i] != 1:
            unit[k] = False
        end[k] = e + 1
        last_ts[k] = ts[i]


@nb.njit(cache=True, nogil=True)
def _advance_base(new_head, head, end, base_cnt, base_sh, base_sl, tot, c_cnt, c_sh, c_sl):
    for k in range(head.shape[0]):
        if new_head[k] > head[k]:
            base_cnt[k] = c_cnt[new_head[k] - 1]
            for c in range(c_sh.shape[1]):
                base_sh[k, c] = c_sh[new_head[k] - 1, c]
                base_sl[k, c] = c_sl[new_head[k] - 1, c]
            tot[k] = (c_cnt[end[k] - 1] - base_cnt[k]) if end[k] > new_head[k] else 0


@nb.njit(cache=True, nogil=True)
def _bounds_time(keys, lo, hi, head, end, c_ts):
    """Row index ranges [i1, i2) of the windows (lo, hi]; (0, 0) for unknown keys."""
    m = keys.shape[0]
    K = head.shape[0]
    i1 = np.zeros(m, np.int64)
    i2 = np.zeros(m, np.int64)
    for j in range(m):
        k = keys[j]
        if k >= K:
            continue
        h = head[k]
        e = end[k]
        if hi[j] <= lo[j]:
            i1[j] = h
            i2[j] = h
            continue
        b = search_after(c_ts, h, e, hi[j])
        i1[j] = search_after(c_ts, h, b, lo[j])
        i2[j] = b
    return i1, i2


@nb.njit(cache=True, nogil=True)
def _bounds_rows(keys, n, head, end):
    m = keys.shape[0]
    K = head.shape[0]
    i1 = np.zeros(m, np.int64)
    i2 = np.zeros(m, np.int64)
    for j in range(m):
        k = keys[j]
        if k >= K:
            continue
        e = end[k]
        i1[j] = max(head[k], e - max(n[j], 0))
        i2[j] = e
    return i1, i2


@nb.njit(cache=True, nogil=True)
def _aggregate(keys, i1, i2, head, base_cnt, base_sh, base_sl, c_cnt, c_sh, c_sl):
    """COUNT and the float64 nearest to each exact SUM (fixed128) of the rows [i1, i2)."""
    m = keys.shape[0]
    ncol = c_sh.shape[1]
    counts = np.zeros(m, np.int64)
    sums = np.zeros((m, ncol), np.float64)
    for j in range(m):
        a = i1[j]
        b = i2[j]
        if b <= a:
            continue
        k = keys[j]
        if a > head[k]:
            counts[j] = c_cnt[b - 1] - c_cnt[a - 1]
            for c in range(ncol):
                h, lo = fx.sub(c_sh[b - 1, c], c_sl[b - 1, c], c_sh[a - 1, c], c_sl[a - 1, c])
                sums[j, c] = fx.to_float(h, lo)
        else:
            counts[j] = c_cnt[b - 1] - base_cnt[k]
            for c in range(ncol):
                h, lo = fx.sub(c_sh[b - 1, c], c_sl[b - 1, c], base_sh[k, c], base_sl[k, c])
                sums[j, c] = fx.to_float(h, lo)
    return counts, sums


@nb.njit(cache=True, nogil=True)
def _first_last(i1, i2, c_val, col):
    m = i1.shape[0]
    first = np.full(m, np.nan)
    last = np.full(m, np.nan)
    for j in range(m):
        if i2[j] > i1[j]:
            first[j] = c_val[i1[j], col]
            last[j] = c_val[i2[j] - 1, col]
    return first, last


@nb.njit(cache=True, inline="always")
def kth_one(k, need, head, end, base_cnt, tot, unit, c_ts, c_cnt):
    """Timestamp of key k's need-th newest unit (INT64_MIN if fewer; INT64_MAX for need <= 0).
    tot[k] is the key's live count (``c_cnt[end - 1] - base_cnt[k]``); unit[k] says that every
    row the key ever had stands for one event, so the answer is one array read."""
    if need <= 0:
        return np.iinfo(np.int64).max  # the 0-th newest event: "inside" any window
    if tot[k] < need:
        return INT64_MIN  # fewer than need live units (dense pre-filter, no pool access)
    e = end[k]
    if unit[k]:
        return c_ts[e - need]
    h = head[k]
    target = base_cnt[k] + tot[k] - need  # running count c_cnt[e - 1] is base + tot;
    # the answer is the first row whose running count exceeds target
    g = e - need  # fast path: the newest need rows are single events
    if g >= h and c_cnt[g] > target and (c_cnt[g - 1] if g > h else base_cnt[k]) <= target:
        return c_ts[g]
    lo = h
    hi = e
    while lo < hi:
        mid = (lo + hi) >> 1
        if c_cnt[mid] <= target:
            lo = mid + 1
        else:
            hi = mid
    return c_ts[lo]


@nb.njit(cache=True, nogil=True)
def _kth_newest(keys, kk, head, end, base_cnt, tot, unit, c_ts, c_cnt):
    m = keys.shape[0]
    K = head.shape[0]
    out = np.full(m, INT64_MIN, np.int64)
    for j in range(m):
        k = keys[j]
        if k < K:
            out[j] = kth_one(k, kk[j], head, end, base_cnt, tot, unit, c_ts, c_cnt)
    return out


@nb.njit(cache=True, nogil=True)
def count_filter(cand, n, u, w, t, head, end, base_cnt, tot, unit, c_ts, c_cnt):
    """Exact post-check in place: keep among cand[:n] the keys with u <= COUNT(t, now] <= w
    (u <= 0 / w < 0: no bound), using COUNT >= x <=> x-th newest ts > t. Returns the new n."""
    K = head.shape[0]
    j = 0
    for i in range(n):
        k = cand[i]
        if k >= K:
            continue
        if u > 0 and kth_one(k, u, head, end, base_cnt, tot, unit, c_ts, c_cnt) <= t:
            continue
        if w >= 0 and kth_one(k, w + 1, head, end, base_cnt, tot, unit, c_ts, c_cnt) > t:
            continue
        cand[j] = k
        j += 1
    return j


@nb.njit(cache=True, nogil=True)
def _last_ts(keys, head, end, c_ts):
    m = keys.shape[0]
    K = head.shape[0]
    out = np.full(m, INT64_MIN, np.int64)
    for j in range(m):
        k = keys[j]
        if k < K and end[k] > head[k]:
            out[j] = c_ts[end[k] - 1]
    return out


class RInt(PooledStructure):
    """R-INT over all keys: COUNT and SUM of ``n_cols`` value columns for any time window
    ``(lo, hi]`` or the last n rows, FIRST/LAST, and the k-th newest timestamp."""

    _kind = "rint128"  # running sums in fixed128 words (snapshots of the float64 "rint" are refused)

    def __init__(self, n_cols: int = 0, min_cap: int = 4) -> None:
        super().__init__(min_cap)
        self.n_cols = int(n_cols)
        self._add_col("ts", np.int64, None, 0)
        self._add_col("cnt", np.int64, None, 0)
        # running sums: exact 128-bit fixed point (fixed128), high and low words
        self._add_col("sh", np.int64, self.n_cols, 0)
        self._add_col("sl", np.int64, self.n_cols, 0)
        self._add_col("val", np.float64, self.n_cols, 0.0)
        self._add_kcol("base_cnt", np.int64, None, 0)
        self._add_kcol("base_sh", np.int64, self.n_cols, 0)
        self._add_kcol("base_sl", np.int64, self.n_cols, 0)
        self._add_kcol("tot", np.int64, None, 0)  # live count per key (a dense pre-filter)
        self._add_kcol("unit", np.bool_, None, True)  # every row of the key had mult == 1

    # ----------------------------------------------------------------- updates
    def append(
        self,
        key_ids: np.ndarray,
        ts: np.ndarray,
        values: np.ndarray | None = None,
        mult: np.ndarray | None = None,
        exact: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Apply a batch of rows (any order across keys; per key by ts, ties in array order).

        ``exact``: the rows' values as fixed128 (hi, lo) words (e.g. exact pane sums, whose
        float64 ``values`` are rounded); by default the words of ``values``."""
        keys = as_keys(key_ids)
        t = np.ascontiguousarray(ts, dtype=np.int64)
        n = keys.shape[0]
        if values is None:
            if self.n_cols:
                raise ValueError(f"values[n, {self.n_cols}] required")
            v = np.zeros((n, 0), np.float64)
        else:
            v = np.ascontiguousarray(values, dtype=np.float64).reshape(n, self.n_cols)
        mu = np.ones(n, np.int64) if mult is None else np.ascontiguousarray(mult, dtype=np.int64)
        if mu.shape[0] != n:
            raise ValueError("mult must have one entry per row")
        if exact is None:
            vh, vl = fx.split_many(v)
        else:
            vh = np.ascontiguousarray(exact[0], dtype=np.int64).reshape(n, self.n_cols)
            vl = np.ascontiguousarray(exact[1], dtype=np.int64).reshape(n, self.n_cols)
        self._prepare(keys, t)
        kc = self._kcols
        order = order_batch(keys, t, kc["last_ts"])
        if order is not None:
            keys, t, v, vh, vl, mu = keys[order], t[order], v[order], vh[order], vl[order], mu[order]
        c = self._cols
        p = self._pool
        _append(
            keys, t, v, vh, vl, mu, p.head, p.end, kc["base_cnt"], kc["base_sh"], kc["base_sl"], kc["last_ts"],
            kc["tot"], kc["unit"], c["ts"], c["cnt"], c["sh"], c["sl"], c["val"],
        )  # fmt: skip

    def _on_expire(self, new_head: np.ndarray) -> None:
        kc = self._kcols
        _advance_base(
            new_head, self._pool.head, self._pool.end, kc["base_cnt"], kc["base_sh"], kc["base_sl"], kc["tot"],
            self._cols["cnt"], self._cols["sh"], self._cols["sl"],
        )  # fmt: skip

    # ----------------------------------------------------------------- lookups
    def _time_bounds(self, keys: np.ndarray, lo: object, hi: object) -> tuple[np.ndarray, np.ndarray]:
        m = keys.shape[0]
        return _bounds_time(
            keys, broadcast_i64(lo, m), broadcast_i64(hi, m), self._pool.head, self._pool.end,
            self._cols["ts"],
        )  # fmt: skip

    def _agg(self, keys: np.ndarray, i1: np.ndarray, i2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        kc = self._kcols
        return _aggregate(
            keys,
            i1,
            i2,
            self._pool.head,
            kc["base_cnt"],
            kc["base_sh"],
            kc["base_sl"],
            self._cols["cnt"],
            self._cols["sh"],
            self._cols["sl"],
        )

    def window(self, key_ids: np.ndarray, lo: object, hi: object) -> tuple[np.ndarray, np.ndarray]:
        """COUNT (int64[m]) and SUMs (float64[m, n_cols]) over rows with lo < ts <= hi; each SUM
        is the float64 nearest to the exact sum (:mod:`engine.algorithms.fixed128`)."""
        keys = as_keys(key_ids)
        i1, i2 = self._time_bounds(keys, lo, hi)
        return self._agg(keys, i1, i2)

    def rows(self, key_ids: np.ndarray, n: object) -> tuple[np.ndarray, np.ndarray]:
        """COUNT and SUMs over each key's last n rows (tuple-based window)."""
        keys = as_keys(key_ids)
        i1, i2 = _bounds_rows(keys, broadcast_i64(n, keys.shape[0]), self._pool.head, self._pool.end)
        return self._agg(keys, i1, i2)

    def first_last(
        self, key_ids: np.ndarray, lo: object, hi: object, col: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Value of column col at the earliest / latest row in (lo, hi]; NaN when empty."""
        keys = as_keys(key_ids)
        i1, i2 = self._time_bounds(keys, lo, hi)
        return _first_last(i1, i2, self._cols["val"], int(col))

    def first_last_rows(self, key_ids: np.ndarray, n: object, col: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Value of column col at the earliest / latest of the key's last n rows; NaN when empty."""
        keys = as_keys(key_ids)
        i1, i2 = _bounds_rows(keys, broadcast_i64(n, keys.shape[0]), self._pool.head, self._pool.end)
        return _first_last(i1, i2, self._cols["val"], int(col))

    def total(self, key_ids: np.ndarray) -> np.ndarray:
        """Live count (sum of multiplicities of the rows not expired) per key."""
        keys = as_keys(key_ids)
        tot = self._kcols["tot"]
        out = np.zeros(keys.shape[0], np.int64)
        ok = keys < tot.shape[0]
        out[ok] = tot[keys[ok]]
        return out

    def last_ts(self, key_ids: np.ndarray) -> np.ndarray:
        """Timestamp of each key's newest live row (INT64_MIN if none)."""
        return _last_ts(as_keys(key_ids), self._pool.head, self._pool.end, self._cols["ts"])

    def kth_newest_ts(self, key_ids: np.ndarray, k: object) -> np.ndarray:
        """Timestamp of the k-th newest unit of count (INT64_MIN if fewer than k live units).

        ``COUNT(now - T, now] >= k`` exactly when ``kth_newest_ts(k) > now - T`` (all ts <= now).
        Constant time when the newest k rows are single events, O(log n) otherwise.
        """
        keys = as_keys(key_ids)
        kc = self._kcols
        return _kth_newest(
            keys, broadcast_i64(k, keys.shape[0]), self._pool.head, self._pool.end, kc["base_cnt"], kc["tot"],
            kc["unit"], self._cols["ts"], self._cols["cnt"],
        )  # fmt: skip

    # ----------------------------------------------------------------- state
    def _meta(self) -> dict[str, int | float]:
        return {"n_cols": self.n_cols}

    @classmethod
    def _empty_from_meta(cls, meta: dict[str, np.ndarray]) -> RInt:
        return cls(int(meta["n_cols"]))
