"""Common machinery of the pooled per-key structures: key growth, row reservation, expiry,
serialization. Subclasses declare their row columns and per-key columns and provide kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ._pool import (
    INT64_MIN,
    Packing,
    Plan,
    Pool,
    expire_heads,
    grow_len,
    keep_newest,
    move_rows_1d,
    move_rows_2d,
    unpack,
)
from ._spare import SPARE_AT, SPARE_DROP, Spares, adopt, spare_array, spare_len, wants_spare


def _mover(col: np.ndarray) -> Callable[..., None]:
    """The kernel that moves a plan's rows of ``col`` (one per column rank)."""
    return move_rows_1d if col.ndim == 1 else move_rows_2d


class PooledStructure:
    """Per-key row buffers in shared columns (see :mod:`engine.algorithms._pool`).

    Subclasses fill ``self._cols`` (row columns, first axis = pool position) with
    ``self._fill`` default values, and ``self._kcols`` (per-key columns, first axis = key id).
    ``last_ts`` (per key) is the timestamp of the key's newest applied row, kept after expiry
    so that out-of-order rows are refused consistently.
    """

    _kind: ClassVar[str] = "pooled"

    def __init__(self, min_cap: int = 4) -> None:
        self._pool = Pool(min_cap)
        self._cols: dict[str, np.ndarray] = {}
        self._fill: dict[str, Any] = {}
        self._kcols: dict[str, np.ndarray] = {"last_ts": np.zeros(0, np.int64)}
        self._kfill: dict[str, Any] = {"last_ts": INT64_MIN}
        #: the row columns of the next growth, made ahead (:mod:`engine.algorithms._spare`)
        self._spares = Spares()

    # ----------------------------------------------------------------- bookkeeping
    def _add_col(self, name: str, dtype: Any, width: int | None, fill: Any) -> None:
        shape = (0,) if width is None else (0, width)
        self._cols[name] = np.zeros(shape, dtype)
        self._fill[name] = fill

    def _add_kcol(self, name: str, dtype: Any, width: int | None, fill: Any) -> None:
        shape = (0,) if width is None else (0, width)
        self._kcols[name] = np.zeros(shape, dtype)
        self._kfill[name] = fill

    @property
    def n_keys(self) -> int:
        """Number of key ids the structure has room for (ids >= this have no rows)."""
        return self._pool.n_keys

    @property
    def live_rows(self) -> int:
        """Rows held (not expired), summed over the keys: what the structure's windows can still
        read, unlike :attr:`nbytes`, which counts the arrays' allocated room (regions and pools
        grow by doubling, so it moves in steps of up to 2x while the live rows stay flat)."""
        return self._pool.live()

    def _ensure_keys(self, n: int) -> None:
        if not self._pool.ensure_keys(n):
            return
        K = self._pool.n_keys
        for name, a in list(self._kcols.items()):
            b = np.empty((K,) + a.shape[1:], a.dtype)
            b[: a.shape[0]] = a
            b[a.shape[0] :] = self._kfill[name]
            self._kcols[name] = b

    def _pool_len(self) -> int:
        return int(self._cols["ts"].shape[0])

    def _reserve(self, key_ids: np.ndarray) -> None:
        plan = self._pool.reserve_batch(key_ids, self._pool_len())
        if plan is not None:
            self._apply_plan(plan)
        self._plan_spare()

    def _plan_spare(self) -> None:
        """Make the columns of the next growth ahead once the pool is :data:`SPARE_AT` full, let
        them go when it has shrunk below :data:`SPARE_DROP` (:mod:`engine.algorithms._spare`)."""
        cur, top = self._pool_len(), self._pool.top
        if self._spares:
            if top < SPARE_DROP * cur:
                self._spares.spend()
            return
        if cur == 0 or top < SPARE_AT * cur or not wants_spare(sum(c.nbytes for c in self._cols.values())):
            return
        n = spare_len(cur)
        self._spares.hold({name: spare_array((n,) + c.shape[1:], c.dtype) for name, c in self._cols.items()})

    def take_spares(self) -> list[np.ndarray]:
        """The spare columns made since the last call, for the runtime to fault in off the
        batch (:class:`engine.runtime.prefault.SpareWarmer`); each is handed out once."""
        return self._spares.take_new()

    def _new_col(self, name: str, old: np.ndarray, n: int, keep: int = 0) -> np.ndarray:
        """A column of n rows or more: the first ``keep`` rows copied from old, the rest filled
        (each row written once; lengths grow geometrically, see :func:`grow_len`).  A growth
        (``keep``) takes the spare column when it is long enough."""
        spare = self._spares.get(name) if keep else None
        if spare is not None and spare.shape[0] >= n:
            new = adopt(spare)
        else:
            new = np.empty((n,) + old.shape[1:], old.dtype)
        new[:keep] = old[:keep]
        new[keep:] = self._fill[name]
        return new

    def _apply_plan(self, plan: Plan) -> None:
        cur_len = self._pool_len()
        for name, old in list(self._cols.items()):
            if plan.fresh:
                new = self._new_col(name, old, grow_len(plan.new_len))
            elif plan.new_len > cur_len:
                new = self._new_col(name, old, grow_len(plan.new_len), keep=cur_len)
                old = new
            else:
                new = old
            _mover(old)(old, new, plan.src, plan.dst, plan.length, new is old)
            self._cols[name] = new
        if not plan.fresh and plan.new_len > cur_len:  # grown: the spare, taken or too short, is spent
            self._spares.spend()
        self._after_moves(plan)

    def _after_moves(self, plan: Plan) -> None:
        """Hook for derived summaries over pool positions (MIN/MAX blocks)."""

    def _prepare(self, key_ids: np.ndarray, ts: np.ndarray) -> None:
        """Grow keys and reserve rows for a batch."""
        if key_ids.shape[0] != ts.shape[0]:
            raise ValueError("key_ids and ts must have the same length")
        if key_ids.size:
            self._ensure_keys(int(key_ids.max()) + 1)
        self._reserve(key_ids)

    # ----------------------------------------------------------------- expiry
    def expire(self, before_ts: int, keep_rows: int | None = None) -> None:
        """Drop rows with ts <= before_ts (data older than the longest time window in use).

        ``keep_rows``: a tuple-based window of that many rows reads the structure, so each key
        keeps at least its newest ``keep_rows`` rows whatever their age -- the only rows such a
        window can read again (Arasu & Widom 2004, section 2: ``S_k[N, 0]`` holds the last N
        tuples of substream k; section 3.2: R-INT keeps the running intervals of the last
        N_max positions only)."""
        if self._pool.n_keys == 0:
            return
        p = self._pool
        new_head = expire_heads(self._cols["ts"], p.head, p.end, np.int64(before_ts))
        if keep_rows is not None:
            new_head = keep_newest(new_head, p.head, p.end, np.int64(max(int(keep_rows), 0)))
        self._on_expire(new_head)
        self._pool.head = new_head

    def _on_expire(self, new_head: np.ndarray) -> None:
        """Hook run before heads advance (e.g. R-INT moves its base running sums)."""

    def write_targets(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Where the next appends write: each row column with the positions of the keys' next
        rows (``end[k]``, the tail of key k's buffer: section 5's circular buffer), and each
        per-key column and the pool's heads and ends whole (``None``).  For
        :func:`engine.runtime.prefault.make_private`; nothing is changed."""
        p = self._pool
        n = self._pool_len()
        tails = p.end[p.end < n]
        out: list[tuple[np.ndarray, np.ndarray | None]] = (
            [(c, tails) for c in self._cols.values()] if n else []
        )
        out += [(c, None) for c in (*self._kcols.values(), p.head, p.end)]
        return out

    # ----------------------------------------------------------------- state
    @property
    def nbytes(self) -> int:
        """Bytes held by the structure's arrays (capacity included)."""
        n = sum(a.nbytes for a in self._cols.values()) + sum(a.nbytes for a in self._kcols.values())
        p = self._pool
        return int(n + p.off.nbytes + p.cap.nbytes + p.head.nbytes + p.end.nbytes)

    def _meta(self) -> dict[str, int | float]:
        return {}

    def to_bytes(self) -> bytes:
        """Serialize the whole state, the rows laid out as a full compaction would lay them
        (:meth:`Pool.compacted`); the structure itself is not changed."""
        return self._packing().to_bytes()

    def capture_bytes(self) -> Callable[[], bytes]:
        """:meth:`to_bytes` of now, made by the callable returned whenever it is called (it holds
        the compacted rows and copies of the per-key arrays)."""
        return self._packing().later()

    def _packing(self) -> Packing:
        """The arrays :meth:`to_bytes` writes.  The row columns are gathered into fresh arrays of
        exactly the compacted rows (their slack filled), and the structure is left as it is: a
        snapshot's forked child allocates only the rows it writes (compacting the structure made
        it columns of 1.5 times as many rows, filled, and MIN/MAX's block summaries anew)."""
        p = self._pool
        arrays: dict[str, np.ndarray] = {}
        if p.n_keys:
            plan, layout = p.compacted()
            top = plan.new_len
            for name, old in self._cols.items():
                new = self._new_col(name, old, top)  # filled, no spare (that is for growths)
                _mover(old)(old, new, plan.src, plan.dst, plan.length, False)
                arrays[f"c_{name}"] = new
            owned = frozenset(arrays) | {f"p_{n}" for n in layout}
        else:
            top = p.top
            arrays.update({f"c_{k}": v[:top] for k, v in self._cols.items()})
            layout = {"off": p.off, "cap": p.cap, "head": p.head, "end": p.end}
            owned = frozenset()
        arrays.update({f"k_{k}": v for k, v in self._kcols.items()})
        arrays.update({f"p_{n}": a for n, a in layout.items()})
        meta = dict(self._meta())
        meta["top"] = top
        meta["min_cap"] = p.min_cap
        return Packing(self._kind, arrays, meta, owned)

    @classmethod
    def _empty_from_meta(cls, meta: dict[str, np.ndarray]) -> PooledStructure:
        raise NotImplementedError

    @classmethod
    def from_bytes(cls, b: bytes) -> Any:
        """Restore a structure serialized by :meth:`to_bytes`."""
        kind, _, rest = b.partition(b"\x00")
        if kind.decode() != cls._kind:
            raise ValueError(f"bytes hold a {kind.decode()!r}, not a {cls._kind!r}")
        arrays, meta = unpack(rest)
        obj = cls._empty_from_meta(meta)
        p = obj._pool
        p.min_cap = int(meta["min_cap"])
        p.top = int(meta["top"])
        p.off, p.cap, p.head, p.end = (arrays[f"p_{n}"].copy() for n in ("off", "cap", "head", "end"))
        p._scratch = np.zeros(p.off.shape[0], np.int64)
        p._cap_sum = None
        for k in obj._kcols:
            obj._kcols[k] = arrays[f"k_{k}"].copy()
        n = grow_len(p.top)
        for k in obj._cols:
            col = arrays[f"c_{k}"]
            new = np.empty((n,) + col.shape[1:], col.dtype)
            new[...] = obj._fill[k]
            new[: col.shape[0]] = col
            obj._cols[k] = new
        obj._after_restore()
        return obj

    def _after_restore(self) -> None:
        """Hook to rebuild derived summaries after :meth:`from_bytes`."""
