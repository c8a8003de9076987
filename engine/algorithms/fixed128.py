"""Exact window sums: 128-bit fixed-point integers, scaled by ``2**SCALE_BITS``.

R-INT answers ``SUM(l, r]`` as the difference of two running sums (Arasu & Widom 2004,
section 3.2). In float64 that difference depends on how the additions were grouped -- one
event at a time in a backtest, per-pane sums of a micro-batch in the engine -- so a rule
whose average sits at its threshold (``AVG(price) > 105.2`` with an exact average a few
1e-15 below) could get a different answer from each. Here every value ``v`` is turned into
the integer ``round(v * 2**60)`` once (exact for ``2**-8 <= |v| < 2**67``: every bit of a
float64 in that range is a multiple of ``2**-60``) and all sums -- pane sums, running sums,
window differences -- are exact integer arithmetic in two int64 words (hi, lo), modulo
``2**128``. A window's sum is then converted to the float64 *nearest* to the exact sum
(ties to even), so it is the same bits whatever the grouping, and equal to
``math.fsum`` of the window's values.

Running sums may wrap around ``2**128`` (a key's lifetime total is unbounded); differences are
still exact while the *window's* sum stays below ``2**67`` (about 1.5e20) in magnitude. Input
values above ``2**53`` are refused by the decoder (not exactly representable integers), so a
window would need more than 16,384 such extreme values to reach that bound.

All kernels are Numba ``njit`` functions over int64 words; ``lo`` holds the unsigned low word's
bits.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

SCALE_BITS = 60
_SCALE = 2.0**SCALE_BITS
_TWO64 = 2.0**64
_TWO63 = 2.0**63
_U1 = np.uint64(1)
_U0 = np.uint64(0)


@nb.njit(cache=True, inline="always")
def add(ah, al, bh, bl):  # type: ignore[no-untyped-def]
    """(ah, al) + (bh, bl) modulo 2**128."""
    lo = al + bl  # wraps
    carry = 1 if (lo ^ np.int64(-9223372036854775808)) < (al ^ np.int64(-9223372036854775808)) else 0
    return ah + bh + carry, lo


@nb.njit(cache=True, inline="always")
def sub(ah, al, bh, bl):  # type: ignore[no-untyped-def]
    """(ah, al) - (bh, bl) modulo 2**128."""
    lo = al - bl
    borrow = 1 if (al ^ np.int64(-9223372036854775808)) < (bl ^ np.int64(-9223372036854775808)) else 0
    return ah - bh - borrow, lo


@nb.njit(cache=True, inline="always")
def split(v):  # type: ignore[no-untyped-def]
    """The (hi, lo) words of ``round(v * 2**60)`` (ties to even); v finite, |v| < 2**67."""
    x = np.rint(v * _SCALE)
    a = abs(x)
    h = np.floor(a / _TWO64)
    r = a - h * _TWO64  # exact: an integer in [0, 2**64) (either a itself or a multiple of ulp(a))
    lo = np.int64(r - _TWO64) if r >= _TWO63 else np.int64(r)
    hi = np.int64(h)
    if x < 0:
        return sub(np.int64(0), np.int64(0), hi, lo)
    return hi, lo


@nb.njit(cache=True, inline="always")
def _bitlen(u):  # type: ignore[no-untyped-def]
    n = 0
    for s in (32, 16, 8, 4, 2, 1):
        if u >= (_U1 << np.uint64(s)):
            u >>= np.uint64(s)
            n += s
    return n + 1 if u != _U0 else n


@nb.njit(cache=True, inline="always")
def to_float(h, l):  # type: ignore[no-untyped-def]  # noqa: E741
    """The float64 nearest to ``(h * 2**64 + unsigned(l)) / 2**60`` (ties to even)."""
    neg = h < 0
    uh = np.uint64(h)
    ul = np.uint64(l)
    if neg:
        ul = ~ul + _U1
        uh = ~uh + (_U1 if ul == _U0 else _U0)
    if uh == _U0:
        nbits = _bitlen(ul)
        if nbits <= 53:
            f = math.ldexp(np.float64(ul), -SCALE_BITS)
            return -f if neg else f
        shift = np.uint64(nbits - 53)
        q = ul >> shift
        rem = ul & ((_U1 << shift) - _U1)
        half = _U1 << (shift - _U1)
        up = rem > half or (rem == half and (q & _U1) == _U1)
    else:
        nbits = 64 + _bitlen(uh)
        s = nbits - 53  # 12 .. 75
        if s < 64:
            sh = np.uint64(s)
            q = (uh << (np.uint64(64) - sh)) | (ul >> sh)
            rem = ul & ((_U1 << sh) - _U1)
            half = _U1 << (sh - _U1)
            up = rem > half or (rem == half and (q & _U1) == _U1)
        elif s == 64:
            q = uh
            half = _U1 << np.uint64(63)
            up = ul > half or (ul == half and (q & _U1) == _U1)
        else:
            sh = np.uint64(s - 64)
            q = uh >> sh
            rem_h = uh & ((_U1 << sh) - _U1)
            half_h = _U1 << (sh - _U1)
            up = rem_h > half_h or (rem_h == half_h and (ul != _U0 or (q & _U1) == _U1))
        shift = np.uint64(s)
    if up:
        q += _U1
    f = math.ldexp(np.float64(q), np.int64(shift) - SCALE_BITS)
    return -f if neg else f


@nb.njit(cache=True, nogil=True)
def split_many(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Element-wise :func:`split` of a float64 array (any shape)."""
    flat = values.ravel()
    hi = np.empty(flat.shape[0], np.int64)
    lo = np.empty(flat.shape[0], np.int64)
    for i in range(flat.shape[0]):
        hi[i], lo[i] = split(flat[i])
    return hi.reshape(values.shape), lo.reshape(values.shape)


@nb.njit(cache=True, nogil=True)
def to_float_many(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Element-wise :func:`to_float`."""
    fh = hi.ravel()
    fl = lo.ravel()
    out = np.empty(fh.shape[0], np.float64)
    for i in range(fh.shape[0]):
        out[i] = to_float(fh[i], fl[i])
    return out.reshape(hi.shape)


@nb.njit(cache=True, nogil=True)
def group_sums(groups: np.ndarray, values: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-group sums of ``values`` (group ids in ``[0, n_groups)``), as (hi, lo) words:
    what ``np.bincount(groups, weights=values)`` computes, without rounding."""
    hi = np.zeros(n_groups, np.int64)
    lo = np.zeros(n_groups, np.int64)
    for i in range(groups.shape[0]):
        g = groups[i]
        vh, vl = split(values[i])
        hi[g], lo[g] = add(hi[g], lo[g], vh, vl)
    return hi, lo


def exact_group_sums(
    groups: np.ndarray, values: np.ndarray, n_groups: int
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """(float64 sums nearest to the exact ones, (hi, lo) exact words) per group."""
    g = np.ascontiguousarray(groups, dtype=np.int64)
    v = np.ascontiguousarray(values, dtype=np.float64)
    hi, lo = group_sums(g, v, int(n_groups))
    return to_float_many(hi, lo), (hi, lo)
