"""Per-key row buffers for the per-key window structures (Arasu & Widom 2004, section 5).

Section 5 of the paper implements R-INT and B-INT with "simple arrays ... conceptually a
circular buffer" per substream. With hundreds of thousands of substreams of very different
rates one array per key is wasteful, so all keys share *column arrays* (the pool): key ``k``
owns the contiguous region ``[off[k], off[k] + cap[k])`` and its live rows are
``[head[k], end[k])`` inside it. Appends go to ``end``; expiry advances ``head``. A key that
runs out of room is moved, either to the start of its own region (when at most half of it is
live) or to a fresh region of twice the size at the top of the pool; when more than half of
the pool is dead space the whole pool is compacted. Every move is amortized O(1) per row.

The pool only plans moves; the owning structure applies them to its columns
(:meth:`PooledStructure._apply_plan`), so one implementation serves R-INT, MIN/MAX and
COUNT DISTINCT.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max


@dataclass
class Plan:
    """Row moves: for each moved key, ``length`` live rows go from ``src`` to ``dst``."""

    keys: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    length: np.ndarray
    new_len: int  # pool length needed after the plan
    fresh: bool  # True: columns are rebuilt from scratch (compaction), else moved in place / grown


@nb.njit(cache=True, nogil=True)
def _next_pow2(x: int) -> int:
    c = 1
    while c < x:
        c *= 2
    return c


@nb.njit(cache=True, nogil=True)
def _plan_reserve(need, off, cap, head, end, top, min_cap):
    """Plan moves so that every key k has room for need[k] more rows (mutates off/cap/head/end)."""
    n = 0
    for k in range(need.shape[0]):
        if need[k] > 0 and end[k] + need[k] > off[k] + cap[k]:
            n += 1
    keys = np.empty(n, np.int64)
    src = np.empty(n, np.int64)
    dst = np.empty(n, np.int64)
    length = np.empty(n, np.int64)
    j = 0
    for k in range(need.shape[0]):
        if need[k] > 0 and end[k] + need[k] > off[k] + cap[k]:
            live = end[k] - head[k]
            want = live + need[k]
            keys[j] = k
            src[j] = head[k]
            length[j] = live
            if cap[k] > 0 and want <= cap[k] // 2:
                dst[j] = off[k]  # slide to the start of the own region
            else:
                c = _next_pow2(max(min_cap, 2 * want))
                off[k] = top
                cap[k] = c
                dst[j] = top
                top += c
            head[k] = dst[j]
            end[k] = dst[j] + live
            j += 1
    return keys, src, dst, length, top


@nb.njit(cache=True, nogil=True)
def _batch_need(keys, scratch):
    """Distinct keys of a batch (first-appearance order) and their row counts, in O(batch);
    scratch (zeros, one entry per key) is left zeroed."""
    n = 0
    uk = np.empty(keys.shape[0], np.int64)
    for i in range(keys.shape[0]):
        k = keys[i]
        if scratch[k] == 0:
            uk[n] = k
            n += 1
        scratch[k] += 1
    need = np.empty(n, np.int64)
    for j in range(n):
        need[j] = scratch[uk[j]]
        scratch[uk[j]] = 0
    return uk[:n], need


@nb.njit(cache=True, nogil=True)
def _plan_reserve_keys(ukeys, uneed, off, cap, head, end, top, min_cap):
    """:func:`_plan_reserve` for the keys of one batch only (O(batch), not O(K)); also returns
    the change of the keys' total capacity."""
    n = ukeys.shape[0]
    keys = np.empty(n, np.int64)
    src = np.empty(n, np.int64)
    dst = np.empty(n, np.int64)
    length = np.empty(n, np.int64)
    j = 0
    dcap = 0
    for i in range(n):
        k = ukeys[i]
        nd = uneed[i]
        if nd > 0 and end[k] + nd > off[k] + cap[k]:
            live = end[k] - head[k]
            want = live + nd
            keys[j] = k
            src[j] = head[k]
            length[j] = live
            if cap[k] > 0 and want <= cap[k] // 2:
                dst[j] = off[k]  # slide to the start of the own region
            else:
                c = _next_pow2(max(min_cap, 2 * want))
                dcap += c - cap[k]
                off[k] = top
                cap[k] = c
                dst[j] = top
                top += c
            head[k] = dst[j]
            end[k] = dst[j] + live
            j += 1
    return keys[:j], src[:j], dst[:j], length[:j], top, dcap


@nb.njit(cache=True, nogil=True)
def _plan_compact(need, off, cap, head, end, min_cap):
    """Plan a full compaction into a fresh pool (mutates off/cap/head/end); returns the new top."""
    K = need.shape[0]
    keys = np.empty(K, np.int64)
    src = np.empty(K, np.int64)
    dst = np.empty(K, np.int64)
    length = np.empty(K, np.int64)
    top = 0
    j = 0
    for k in range(K):
        live = end[k] - head[k]
        want = live + need[k]
        if want == 0 and cap[k] == 0:
            continue
        c = _next_pow2(max(min_cap, want + want // 2)) if want > 0 else 0
        keys[j] = k
        src[j] = head[k]
        length[j] = live
        dst[j] = top
        off[k] = top
        cap[k] = c
        head[k] = top
        end[k] = top + live
        top += c
        j += 1
    return keys[:j], src[:j], dst[:j], length[:j], top


@nb.njit(cache=True, nogil=True)
def move_rows_1d(old, new, src, dst, length, same):
    for j in range(src.shape[0]):
        s = src[j]
        d = dst[j]
        if same and s == d:
            continue
        for i in range(length[j]):  # forward copy: safe for in-place slides (d < s)
            new[d + i] = old[s + i]


@nb.njit(cache=True, nogil=True)
def move_rows_2d(old, new, src, dst, length, same):
    for j in range(src.shape[0]):
        s = src[j]
        d = dst[j]
        if same and s == d:
            continue
        for i in range(length[j]):
            for c in range(old.shape[1]):
                new[d + i, c] = old[s + i, c]


@nb.njit(cache=True, nogil=True)
def expire_heads(ts, head, end, before_ts):
    """New head per key: first live row with ts > before_ts (binary search in [head, end))."""
    K = head.shape[0]
    new_head = head.copy()
    for k in range(K):
        lo = head[k]
        hi = end[k]
        if lo == hi or ts[lo] > before_ts:
            continue
        while lo < hi:
            mid = (lo + hi) >> 1
            if ts[mid] <= before_ts:
                lo = mid + 1
            else:
                hi = mid
        new_head[k] = lo
    return new_head


@nb.njit(cache=True, nogil=True)
def keep_newest(new_head, head, end, keep):
    """Heads moved back, where needed, so that each key keeps its newest ``keep`` rows: a row
    goes only when it is both expired by time (before ``new_head``) and older than the key's
    newest ``keep`` rows (a tuple-based window of ``keep`` rows reads no further back)."""
    for k in range(head.shape[0]):
        floor = max(head[k], end[k] - keep)
        if new_head[k] > floor:
            new_head[k] = floor
    return new_head


@nb.njit(cache=True, nogil=True)
def search_after(ts, lo, hi, t):
    """First index i in [lo, hi) with ts[i] > t (hi if none); ts is sorted within [lo, hi)."""
    if hi <= lo or ts[hi - 1] <= t:
        return hi
    if ts[lo] > t:
        return lo
    while lo < hi:
        mid = (lo + hi) >> 1
        if ts[mid] <= t:
            lo = mid + 1
        else:
            hi = mid
    return lo


@nb.njit(cache=True, nogil=True)
def _check_order(key_ids, ts, last_ts):
    """0: per-key ts already non-decreasing in array order; 1: needs a stable sort by ts;
    2: a row is older than its key's last applied ts."""
    status = 0
    for i in range(key_ids.shape[0]):
        if ts[i] < last_ts[key_ids[i]]:
            return 2
        if i > 0 and ts[i] < ts[i - 1]:
            status = 1
    return status


class Pool:
    """Region bookkeeping of the shared column arrays (see module docstring)."""

    def __init__(self, min_cap: int = 4) -> None:
        self.min_cap = int(min_cap)
        self.off = np.zeros(0, np.int64)
        self.cap = np.zeros(0, np.int64)
        self.head = np.zeros(0, np.int64)
        self.end = np.zeros(0, np.int64)
        self._scratch = np.zeros(0, np.int64)  # per key, all zero between calls (_batch_need)
        self._cap_sum: int | None = 0  # sum of cap (None: unknown, recomputed when needed)
        self.top = 0

    @property
    def n_keys(self) -> int:
        return int(self.off.shape[0])

    def ensure_keys(self, n: int) -> bool:
        """Grow the per-key arrays to at least n keys; True when they were reallocated."""
        K = self.n_keys
        if n <= K:
            return False
        newK = max(n, 2 * K, 16)
        for name in ("off", "cap", "head", "end", "_scratch"):
            a = np.zeros(newK, np.int64)
            a[:K] = getattr(self, name)
            setattr(self, name, a)
        return True

    def live(self) -> int:
        return int((self.end - self.head).sum())

    def reserve_batch(self, key_ids: np.ndarray, pool_len: int) -> Plan | None:
        """Make room for one more row per occurrence of a key in key_ids; returns the moves to
        apply, if any. O(batch) (the full scan of :meth:`reserve` only when compacting)."""
        if key_ids.shape[0] == 0:
            return None
        uk, un = _batch_need(key_ids, self._scratch)
        if self._cap_sum is None:
            self._cap_sum = int(self.cap.sum())
        if self.top > 1024 and self.top > 2 * (self._cap_sum + int(un.sum())):
            need = np.zeros(self.n_keys, np.int64)
            need[uk] = un
            return self.reserve(need, pool_len)
        keys, src, dst, length, top, dcap = _plan_reserve_keys(
            uk, un, self.off, self.cap, self.head, self.end, self.top, self.min_cap
        )
        self.top = int(top)
        self._cap_sum += int(dcap)
        if keys.shape[0] == 0:
            return None
        return Plan(keys, src, dst, length, max(self.top, pool_len), False)

    def reserve(self, need: np.ndarray, pool_len: int) -> Plan | None:
        """Make room for ``need[k]`` more rows per key; returns the moves to apply, if any."""
        self._cap_sum = None
        total_cap = int(self.cap.sum())
        if self.top > 1024 and self.top > 2 * (total_cap + int(need.sum())):
            keys, src, dst, length, top = _plan_compact(
                need, self.off, self.cap, self.head, self.end, self.min_cap
            )
            self.top = int(top)
            return Plan(keys, src, dst, length, self.top, True)
        keys, src, dst, length, top = _plan_reserve(
            need, self.off, self.cap, self.head, self.end, self.top, self.min_cap
        )
        self.top = int(top)
        if keys.shape[0] == 0:
            return None
        return Plan(keys, src, dst, length, max(self.top, pool_len), False)

    def compacted(self) -> tuple[Plan, dict[str, np.ndarray]]:
        """A full compaction's plan (rows into a fresh pool of ``new_len`` rows) and the per-key
        ``off``, ``cap``, ``head`` and ``end`` it leads to, as new arrays: this pool is not
        changed.  What serialization writes (:meth:`engine.algorithms._base.PooledStructure.to_bytes`)."""
        layout = {name: getattr(self, name).copy() for name in ("off", "cap", "head", "end")}
        need = np.zeros(self.n_keys, np.int64)
        keys, src, dst, length, top = _plan_compact(
            need, layout["off"], layout["cap"], layout["head"], layout["end"], self.min_cap
        )
        return Plan(keys, src, dst, length, int(top), True), layout


def grow_len(n: int) -> int:
    """Pool length to allocate for n rows (geometric growth)."""
    return max(64, int(n * 1.5) + 64)


class _After:
    """The part of a ``BytesIO`` after what it holds now, as a file of its own: positions are
    counted from there, so a zip written into it is the zip written alone."""

    def __init__(self, buf: io.BytesIO) -> None:
        self._buf, self._at = buf, buf.tell()

    def write(self, b: Any) -> int:
        return self._buf.write(b)

    def read(self, n: int = -1) -> bytes:  # NumPy takes only objects with read for files
        return self._buf.read(n)

    def tell(self) -> int:
        return self._buf.tell() - self._at

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._buf.seek(pos + self._at if whence == 0 else pos, whence) - self._at

    def flush(self) -> None:
        pass


def pack(arrays: dict[str, np.ndarray], meta: dict[str, int | float], prefix: bytes = b"") -> bytes:
    """``prefix``, then named arrays and scalars serialized (``np.savez``, no pickle), made in one
    buffer (no copy of the whole to join them)."""
    buf = io.BytesIO()
    buf.write(prefix)
    payload = {f"a_{k}": np.ascontiguousarray(v) for k, v in arrays.items()}
    for k, v in meta.items():
        payload[f"m_{k}"] = np.asarray(v)
    np.savez(_After(buf), **payload)  # type: ignore[arg-type]
    return buf.getvalue()


@dataclass(frozen=True)
class Packing:
    """What a structure's ``to_bytes`` writes: its kind, then :func:`pack` of named arrays and
    scalars.  :meth:`later` makes the same bytes later from copies of the arrays, however the
    structure changes meanwhile (a state snapshot's capture, :mod:`engine.runtime.state_capture`)."""

    kind: str
    arrays: dict[str, np.ndarray]
    meta: dict[str, int | float]
    #: names of arrays made for this packing (no view of the structure's state: not copied again)
    owned: frozenset[str] = frozenset()

    def to_bytes(self) -> bytes:
        return pack(self.arrays, self.meta, self.kind.encode() + b"\x00")

    def later(self) -> Callable[[], bytes]:
        """:meth:`to_bytes` to be called later: the arrays copied now (a ``memcpy`` each; those
        it owns are kept as they are)."""
        arrays = {k: v if k in self.owned else np.array(v, order="C") for k, v in self.arrays.items()}
        return Packing(self.kind, arrays, dict(self.meta)).to_bytes


def unpack(b: bytes) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inverse of :func:`pack`."""
    with np.load(io.BytesIO(b), allow_pickle=False) as z:
        arrays = {k[2:]: z[k] for k in z.files if k.startswith("a_")}
        meta = {k[2:]: z[k] for k in z.files if k.startswith("m_")}
    return arrays, meta


def as_keys(key_ids: np.ndarray | list[int] | int) -> np.ndarray:
    """Key ids as a 1-D int64 array; negative ids are refused."""
    k = np.ascontiguousarray(np.atleast_1d(np.asarray(key_ids)), dtype=np.int64)
    if k.ndim != 1:
        raise ValueError("key_ids must be 1-D")
    if k.size and k.min() < 0:
        raise ValueError("key ids must be >= 0")
    return k


def broadcast_i64(x: object, m: int) -> np.ndarray:
    """Scalar or per-key array as a contiguous, writable int64 array of length m (a copy: always
    the same array type, so the kernels taking it are compiled once -- a broadcast view is
    read-only, and ``ascontiguousarray`` keeps it so when it is already contiguous)."""
    return np.array(np.broadcast_to(np.asarray(x, dtype=np.int64), (m,)), dtype=np.int64)  # type: ignore[call-overload]


def order_batch(key_ids: np.ndarray, ts: np.ndarray, last_ts: np.ndarray) -> np.ndarray | None:
    """Validate a batch against the keys' last applied timestamps.

    Returns None when rows can be applied in array order, else the stable permutation by ts
    (per key: ts order, ties in arrival order). Raises ValueError for a row older than its key's
    last applied ts (the batch is then not applied at all).
    """
    status = _check_order(key_ids, ts, last_ts)
    if status == 2:
        raise ValueError("row older than its key's last applied timestamp")
    if status == 0:
        return None
    return np.argsort(ts, kind="stable")
