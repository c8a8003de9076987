"""CI-SUM: the collective index for SUM threshold rules over non-negative values
(Arasu & Widom 2004, section 4.2).

CI-SUM is CI-COUNT over the modified stream S' in which an element of value a stands for a
copies of itself. Values are measured in *units* (``unit``, default 1): a key's position
counter is ``floor(cumulative sum / unit)``, and a row adds the units its value completes, all
at once -- O(p log a) level work, never O(a) (see :mod:`engine.algorithms._levels`).
For values that are multiples of ``unit`` (integers with the default) the translation of a
threshold into units is exact; otherwise one unit of slack is added on each side, so the
candidates remain a superset. Exact answers come from :func:`post_check_sum` (R-INT sums).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from . import fixed128 as fx
from ._levels import levels_lookup
from ._pool import Packing, as_keys, order_batch, search_after
from .ci_count import CICount
from .rint import RInt


@nb.njit(cache=True, nogil=True)
def _units(keys, vals, unit, csum):
    """Units completed by each row (in array order) and the per-key running sums (updated)."""
    out = np.empty(keys.shape[0], np.int64)
    for i in range(keys.shape[0]):
        k = keys[i]
        c0 = csum[k]
        c1 = c0 + vals[i]
        out[i] = np.int64(math.floor(c1 / unit)) - np.int64(math.floor(c0 / unit))
        csum[k] = c1
    return out


class CISum(CICount):
    """CI-SUM over all keys: candidates for ``SUM(now - T, now] in (lo, hi)`` over values >= 0."""

    _kind = "cisum"

    def __init__(self, p: int = 8, unit: float = 1.0, relayout_every: int | None = None) -> None:
        if not unit > 0:
            raise ValueError("unit must be > 0")
        self.unit = float(unit)
        self.integral = True  # every value so far is a whole number of units
        self.csum = np.zeros(64, np.float64)  # running sum per position
        super().__init__(p, relayout_every)

    def _aux(self) -> np.ndarray:
        return self.csum

    def _alloc(self, kcap: int, La: int) -> None:
        super()._alloc(kcap, La)
        kcap = self.TS.shape[1]  # the positions allocated (spare tables taken may hold more)
        if self.csum.shape[0] < kcap:
            c = np.zeros(kcap, np.float64)
            c[: self.csum.shape[0]] = self.csum
            self.csum = c

    def update(self, key_ids: np.ndarray, ts: np.ndarray, values: np.ndarray) -> None:  # type: ignore[override]
        """Apply a batch of rows ``(key, ts, value >= 0)``."""
        keys = as_keys(key_ids)
        t = np.ascontiguousarray(ts, dtype=np.int64)
        v = np.ascontiguousarray(values, dtype=np.float64).reshape(keys.shape[0])
        if keys.shape[0] == 0:
            return
        if not (v >= 0).all():
            raise ValueError("CI-SUM needs values >= 0 (and not NaN)")
        if t.shape[0] != keys.shape[0]:
            raise ValueError("key_ids, ts and values must have the same length")
        pos = self._positions(keys)
        order = order_batch(pos, t, self.act)
        if order is not None:
            pos, t, v = pos[order], t[order], v[order]
        if self.integral:
            q = v / self.unit
            self.integral = bool((q == np.floor(q)).all())
            if not self.integral:
                self._plans.clear()
        units = _units(pos, v, self.unit, self.csum)
        self._apply(pos, t, units, ordered=True)

    # ----------------------------------------------------------------- lookup
    def _unit_range(
        self, lo: float | None, hi: float | None, lo_strict: bool, hi_strict: bool
    ) -> tuple[int | None, int | None]:
        """Unit bounds (u, w): every key whose sum lies in the range has u <= units <= w
        (units in the window differ from sum / unit by less than one; exact for integral data)."""
        un = self.unit
        u = w = None
        if lo is not None:
            x = lo / un
            if self.integral:
                u = math.floor(x) + 1 if lo_strict else math.ceil(x)
            else:
                u = math.floor(x)
        if hi is not None:
            x = hi / un
            if self.integral:
                w = math.ceil(x) - 1 if hi_strict else math.floor(x)
            else:
                w = math.ceil(x)
        return u, w

    def _sure_range(
        self, lo: float | None, hi: float | None, lo_strict: bool, hi_strict: bool
    ) -> tuple[int | None, int | None]:
        """Unit bounds proving the range: units >= u_s implies the lower end, units <= w_s the
        upper end (for non-integral data sum > (units - 1) unit and sum < (units + 1) unit)."""
        if self.integral:
            return self._unit_range(lo, hi, lo_strict, hi_strict)
        un = self.unit
        u = w = None
        if lo is not None:
            u = math.floor(lo / un) + 2  # (units - 1) unit > lo
        if hi is not None:
            w = math.ceil(hi / un) - 2  # (units + 1) unit < hi
        return u, w

    def _ranges(
        self, lo: float | None, hi: float | None, lo_strict: bool, hi_strict: bool
    ) -> tuple[int | None, int | None, int | None, int | None, int]:
        u, w = self._unit_range(lo, hi, lo_strict, hi_strict)
        us, ws = self._sure_range(lo, hi, lo_strict, hi_strict)
        return u, w, us, ws, 0

    def guarantee(  # type: ignore[override]
        self, lo: float | None, hi: float | None, lo_strict: bool = True, hi_strict: bool = True
    ) -> tuple[float, float | None]:
        """(min, max) sum every candidate is guaranteed to have (for non-integral values the
        bounds are strict: sum > min and sum < max)."""
        pl = self.plan(lo, hi, lo_strict, hi_strict)
        if pl is None:
            return 0.0, None
        if self.integral:
            return pl.gmin * self.unit, (pl.gmax * self.unit if pl.gmax is not None else None)
        return (pl.gmin - 1) * self.unit, ((pl.gmax + 1) * self.unit if pl.gmax is not None else None)

    # ----------------------------------------------------------------- state
    @property
    def nbytes(self) -> int:
        return super().nbytes + int(self.csum.nbytes)

    def bytes_per_key(self) -> float:
        return super().bytes_per_key() + 8 if self._K else 0.0

    def _packing(self) -> Packing:
        p = super()._packing()
        arrays = {**p.arrays, "csum": self.csum[: self._K]}
        return Packing(p.kind, arrays, {**p.meta, "unit": self.unit, "integral": int(self.integral)})

    @classmethod
    def from_bytes(cls, b: bytes) -> CISum:
        from ._pool import unpack

        kind, _, rest = b.partition(b"\x00")
        _, meta = unpack(rest)
        obj = super().from_bytes(b)
        assert isinstance(obj, CISum)
        obj.unit = float(meta["unit"])
        obj._plans.clear()
        obj.integral = bool(int(meta["integral"]))
        return obj  # type: ignore[return-value]

    def _restore_extra(self, arrays: dict[str, np.ndarray]) -> None:
        K = arrays["m"].shape[0]
        if self.csum.shape[0] < self.TS.shape[1]:
            self.csum = np.zeros(self.TS.shape[1], np.float64)
        self.csum[:K] = arrays["csum"]


def post_check_sum(
    rint: RInt,
    cand: np.ndarray,
    T: int,
    now: int,
    lo: float | None,
    hi: float | None,
    lo_strict: bool = True,
    hi_strict: bool = True,
    col: int = 0,
) -> np.ndarray:
    """Exact filter of candidates with R-INT sums of column col over (now - T, now]."""
    cand = as_keys(cand)
    _, sums = rint.window(cand, np.int64(now) - np.int64(T), now)
    s = sums[:, col]
    keep = np.ones(cand.shape[0], bool)
    if lo is not None:
        keep &= (s > lo) if lo_strict else (s >= lo)
    if hi is not None:
        keep &= (s < hi) if hi_strict else (s <= hi)
    return cand[keep]


@nb.njit(cache=True, nogil=True)
def _exact_sum_kernel(s_lo, s_up, sure_lo, sure_up, t, lo, hi, has_lo, has_hi, lo_strict, hi_strict, nkeys,
                      TS, BM, BM2, act, bma, bma2, key_of, out, sure, head, end, base_sh, base_sl, c_ts, c_sh, c_sl,
                      col):  # fmt: skip
    """Candidates of the index, the unproven ones checked with R-INT window sums; out[:j] = the
    answer's key ids (position order)."""
    n = levels_lookup(s_lo, s_up, sure_lo, sure_up, t, nkeys, TS, BM, BM2, act, bma, bma2, out, sure)
    K = head.shape[0]
    j = 0
    for i in range(n):
        k = key_of[out[i]]
        if not sure[i]:
            if k >= K:
                continue
            h = head[k]
            e = end[k]
            if e <= h:
                continue
            i1 = search_after(c_ts, h, e, t)
            if i1 > h:
                dh, dl = fx.sub(c_sh[e - 1, col], c_sl[e - 1, col], c_sh[i1 - 1, col], c_sl[i1 - 1, col])
            else:
                dh, dl = fx.sub(c_sh[e - 1, col], c_sl[e - 1, col], base_sh[k, col], base_sl[k, col])
            s = fx.to_float(dh, dl)
            if has_lo and (s <= lo if lo_strict else s < lo):
                continue
            if has_hi and (s >= hi if hi_strict else s > hi):
                continue
        out[j] = k
        j += 1
    return j


def exact_sum(
    cs: CISum,
    rint: RInt,
    T: int,
    now: int,
    lo: float | None,
    hi: float | None,
    lo_strict: bool = True,
    hi_strict: bool = True,
    col: int = 0,
) -> np.ndarray:
    """Exact answer ``{k | SUM(now - T, now] in (lo, hi), at least one event}`` in key order:
    CI-SUM candidates, the ones the index cannot prove post-checked with R-INT sums of column
    col (every row of now - T < ts <= now must be applied). One Numba call."""
    pl = cs.plan(lo, hi, lo_strict, hi_strict)
    if pl is None:
        return np.empty(0, np.int64)
    kc = rint._kcols
    n = _exact_sum_kernel(
        pl.s_lo, pl.s_up, pl.sure_lo, pl.sure_up, np.int64(now) - np.int64(T),
        float(lo if lo is not None else 0.0), float(hi if hi is not None else 0.0), lo is not None, hi is not None,
        bool(lo_strict), bool(hi_strict), cs._K, cs.TS, cs.BM, cs.BM2, cs.act, cs.bma, cs.bma2, cs.key_of, cs._out,
        cs._sure,
        rint._pool.head, rint._pool.end, kc["base_sh"], kc["base_sl"], rint._cols["ts"], rint._cols["sh"],
        rint._cols["sl"], int(col),
    )  # fmt: skip
    return np.sort(cs._out[:n])
