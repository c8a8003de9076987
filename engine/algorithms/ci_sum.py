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

from ._levels import choose_slots, levels_lookup
from ._pool import as_keys, order_batch
from .ci_count import CICount
from .rint import RInt


@nb.njit(cache=True)
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

    def __init__(self, p: int = 8, unit: float = 1.0) -> None:
        if not unit > 0:
            raise ValueError("unit must be > 0")
        self.unit = float(unit)
        self.integral = True  # every value so far is a whole number of units
        self.csum = np.zeros(64, np.float64)
        super().__init__(p)

    def _alloc(self, kcap: int, L: int) -> None:
        super()._alloc(kcap, L)
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
        nkeys = int(keys.max()) + 1
        if nkeys > self.TS.shape[1]:
            self._grow(nkeys, 0)
        order = order_batch(keys, t, self.act)
        if order is not None:
            keys, t, v = keys[order], t[order], v[order]
        if self.integral:
            q = v / self.unit
            self.integral = bool((q == np.floor(q)).all())
        units = _units(keys, v, self.unit, self.csum)
        self._apply(keys, t, units)

    # ----------------------------------------------------------------- lookup
    def _unit_range(
        self, lo: float | None, hi: float | None, lo_strict: bool, hi_strict: bool
    ) -> tuple[int | None, int | None]:
        """Unit bounds (u, w): every key whose sum lies in the range has u <= units <= w."""
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

    def candidates(
        self,
        T: int,
        now: int,
        lo: float | None,
        hi: float | None,
        lo_strict: bool = True,
        hi_strict: bool = True,
    ) -> np.ndarray:
        """Key ids whose SUM over (now - T, now] may lie in (lo, hi): a superset of the exact
        answer, restricted to keys with at least one event in the window."""
        u, w = self._unit_range(lo, hi, lo_strict, hi_strict)
        if w is not None and (w < 0 or (u is not None and w < u)):
            return np.empty(0, np.int64)
        s_lo, s_up, _, _ = choose_slots(self.p, self.L, u, w)
        if u is None or u <= 0:
            s_lo = -1
        t = np.int64(now) - np.int64(T)
        n = levels_lookup(s_lo, s_up, t, self._K, self.TS, self.BM, self.act, self.bma, self._out)
        return self._out[:n].copy()

    def guarantee(  # type: ignore[override]
        self, lo: float | None, hi: float | None, lo_strict: bool = True, hi_strict: bool = True
    ) -> tuple[float, float | None]:
        """(min, max) sum every candidate is guaranteed to have (for non-integral values the
        bounds are strict: sum > min and sum < max)."""
        u, w = self._unit_range(lo, hi, lo_strict, hi_strict)
        s_lo, s_up, gmin, gmax = choose_slots(self.p, self.L, u, w)
        if u is None or u <= 0:
            gmin = 0
        if self.integral:
            return gmin * self.unit, (gmax * self.unit if s_up >= 0 else None)
        return (gmin - 1) * self.unit, ((gmax + 1) * self.unit if s_up >= 0 else None)

    # ----------------------------------------------------------------- state
    @property
    def nbytes(self) -> int:
        return super().nbytes + int(self.csum.nbytes)

    def bytes_per_key(self) -> float:
        return super().bytes_per_key() + 8 if self._K else 0.0

    def to_bytes(self) -> bytes:
        from ._pool import pack, unpack

        kind, _, rest = super().to_bytes().partition(b"\x00")
        arrays, meta = unpack(rest)
        arrays["csum"] = self.csum[: self._K]
        meta2 = {k: v.item() for k, v in meta.items()}
        meta2["unit"] = self.unit
        meta2["integral"] = int(self.integral)
        return kind + b"\x00" + pack(arrays, meta2)

    @classmethod
    def from_bytes(cls, b: bytes) -> CISum:
        from ._pool import unpack

        kind, _, rest = b.partition(b"\x00")
        _, meta = unpack(rest)
        obj = super().from_bytes(b)
        obj.unit = float(meta["unit"])
        obj.integral = bool(int(meta["integral"]))
        return obj  # type: ignore[return-value]

    def _restore_extra(self, arrays: dict[str, np.ndarray]) -> None:
        K = arrays["m"].shape[0]
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
