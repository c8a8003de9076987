"""Row columns made ahead of a pool's growth, so that its fresh memory is paid off the batch.

A pooled structure's row columns grow by :func:`engine.algorithms._pool.grow_len` when the pool
runs out of room (:meth:`engine.algorithms._base.PooledStructure._apply_plan`): a fresh array per
column, its first write the page faults of all its memory.  Where a fault is cheap that is a
memset's time; on this project's benchmark machine -- a nested virtual machine whose free memory
goes back to the host -- the growth of a 93-146 MB structure held the live run's lookup batches
up for 0.3-0.7 s, nearly all of it kernel time on those faults (docs/measurements/engine.md,
"What the slow batches do, in the kernel").  So once a structure's pool is
:data:`SPARE_AT` full, it makes the columns of its next growth ahead (:func:`spare_array`: memory
mapped, nothing touched yet); the engine's runtime faults them in on a thread of its own while the
batches go on (:class:`engine.runtime.prefault.SpareWarmer`), and the growth takes them.  The
collective indexes do the same for the slot tables of their next key growth
(:meth:`engine.algorithms.ci_count.CICount._plan_spare`).

Made only where something faults them in ahead: the engine turns them on at its start
(:func:`make_spares`, :meth:`engine.app.EngineApp.start`), a sharded engine's Python worker at its
first shard task (:mod:`engine.shards.processor`); elsewhere (``tidewatch backtest``) a growth
makes its columns as before.  The switch is per process, as
NumPy's huge-page switch is, not per structure: structures are made by the evaluator, by a
snapshot's restore and by the executors' shards, and what decides is whether the process runs the
warmer.  A spare is not state: it is left out of snapshots and of :attr:`PooledStructure.nbytes`,
and a snapshot's forked child does not get it (``MADV_DONTFORK``: the parent's spare stays its own,
so filling it while a child lives costs no copies).  A spare taken by a growth becomes state, and a
forked child gets it again (:func:`adopt`, ``MADV_DOFORK``).  Arrays and memory only: no thread, no
I/O.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

__all__ = [
    "SPARE_AT",
    "SPARE_DROP",
    "SPARE_MIN_BYTES",
    "Spares",
    "adopt",
    "make_spares",
    "mapping_of",
    "numpy_advises_huge_pages",
    "spare_array",
    "spare_len",
    "spares_on",
    "wants_spare",
]

#: a structure makes its spare once the pool's used length reaches this share of its columns
SPARE_AT = 0.8
#: ... and lets it go when the used length falls below this share (rows expired, compacted)
SPARE_DROP = 0.5
#: structures whose row columns hold less than this grow cheaply: no spare
SPARE_MIN_BYTES = 4 << 20

_ON = False  # make_spares


def make_spares(on: bool) -> bool:
    """Whether the structures of this process make spares from now on (the engine, whose
    :class:`engine.runtime.prefault.SpareWarmer` faults them in); whether they did before."""
    global _ON
    before, _ON = _ON, bool(on)
    return before


def spares_on() -> bool:
    """Whether the structures of this process make spares (:func:`make_spares`)."""
    return _ON


def wants_spare(nbytes: int) -> bool:
    """Whether a structure whose growing arrays hold ``nbytes`` now makes the arrays of its next
    growth ahead: spares are on in this process and the arrays hold :data:`SPARE_MIN_BYTES` or
    more (read at each call: probes set it).  The one policy of the row columns and of the
    collective indexes' slot tables."""
    return _ON and nbytes >= SPARE_MIN_BYTES


class Spares:
    """One structure's arrays of its next growth, made ahead (:func:`spare_array`), by name, and
    those of them not yet handed to the runtime's warmer: the bookkeeping the row columns
    (:class:`engine.algorithms._base.PooledStructure`) and the collective indexes' slot tables
    (:class:`engine.algorithms.ci_count.CICount`) share.  True while it holds arrays.  A growth
    that takes one makes it state with :func:`adopt`."""

    __slots__ = ("_arrays", "_new")

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._new: list[np.ndarray] = []  # made, not yet handed out by take_new

    def __bool__(self) -> bool:
        return bool(self._arrays)

    def hold(self, arrays: dict[str, np.ndarray], warm: list[np.ndarray] | None = None) -> None:
        """Keep ``arrays`` for the next growth; ``warm`` (views of them; default all of them) is
        what :meth:`take_new` hands to the warmer, for a structure whose rows beyond some are
        never touched until they come into use."""
        self._arrays = dict(arrays)
        self._new = list(self._arrays.values()) if warm is None else list(warm)

    def get(self, name: str) -> np.ndarray | None:
        """The array held for ``name``; None when none is."""
        return self._arrays.get(name)

    def spend(self) -> dict[str, np.ndarray]:
        """The arrays held, which the caller's growth takes or lets go: none is held after."""
        out = self._arrays
        self._arrays, self._new = {}, []
        return out

    def take_new(self) -> list[np.ndarray]:
        """The arrays held since the last call, for the runtime to fault in off the batch
        (:class:`engine.runtime.prefault.SpareWarmer`); each is handed out once."""
        out, self._new = self._new, []
        return out


_HUGE = getattr(mmap, "MADV_HUGEPAGE", None)
_DONTFORK = getattr(mmap, "MADV_DONTFORK", None)
_DOFORK = getattr(mmap, "MADV_DOFORK", None)


def spare_len(cur_len: int) -> int:
    """Rows of a spare for columns of ``cur_len`` rows: twice as many, so that it is at least
    ``grow_len`` of any growth by up to a third (a growth needing more makes its columns fresh)."""
    return 2 * int(cur_len) + 64


def spare_array(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` in memory of its own (a private anonymous mapping, page
    aligned, not written: no page of it is faulted in yet), with NumPy's huge-page advice when
    NumPy gives it, and not passed to forked children."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    # private (mmap's default is a shared mapping: shared memory, no transparent huge pages)
    m = mmap.mmap(-1, max(1, count * dt.itemsize), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if _HUGE is not None and numpy_advises_huge_pages() is not False:
        m.madvise(_HUGE)
    if _DONTFORK is not None:
        m.madvise(_DONTFORK)
    return np.frombuffer(m, dtype=dt, count=count).reshape(shape)


def adopt(arr: np.ndarray) -> np.ndarray:
    """``arr`` (a :func:`spare_array`) made state: forked children get its memory again."""
    m = mapping_of(arr)
    if _DOFORK is not None and m is not None:
        m.madvise(_DOFORK)
    return arr


def mapping_of(arr: np.ndarray) -> mmap.mmap | None:
    """The mapping a :func:`spare_array` lives in (through its bases and the buffer it was made
    from); None for any other array."""
    base: Any = arr
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base if isinstance(base, mmap.mmap) else None


def numpy_advises_huge_pages() -> bool | None:
    """Whether NumPy asks for transparent huge pages on its large arrays now (its runtime switch,
    set at import from ``NUMPY_MADVISE_HUGEPAGE`` or the kernel's version); None for a NumPy
    without the switch (whose default is to ask).  Also what
    :func:`engine.runtime.hugepages.numpy_hugepages` reads."""
    try:
        from numpy._core import multiarray
    except ImportError:
        return None
    read = getattr(multiarray, "_get_madvise_hugepage", None)
    return None if read is None else bool(read())
