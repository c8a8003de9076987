"""The pages the next batch writes, made the driver's own right after a snapshot's fork.

After the ``fork`` of a snapshot's child (:mod:`engine.runtime.snapshot_writer`) every page of the
driver is shared with the child, copy on write: the first write to each page costs the driver a
page fault and a 4 KiB copy.  The per-key row buffers (Arasu & Widom 2004, section 5: one
circular buffer per substream; here regions of shared column arrays,
:mod:`engine.algorithms._pool`) take each key's new rows at the key's tail, so a lookup batch
that applies a few rows to each of thousands of keys writes a page per key in every column: on
the live 10,000-rule trades workload the first lookup batch after a fork wrote ≈ 50,000 pages,
≈ 35,000 of them the buffers' tails, and took 150--660 ms instead of ≈ 70--130
(``bench/cow_probe.py --compare``; docs/measurements/engine.md, "The pages a batch writes after a
fork").

:func:`make_private` takes those pages' copies before the batch needs them: it asks the kernel to
fault them in writable (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14 and later), exactly as a
write would, without writing anything -- so it is safe beside a thread that changes the same
memory, and beside one that frees it (a range no longer mapped is skipped).  The engine runs it
on the fork's thread (:func:`ahead_of_next_batch`, called by
:class:`engine.runtime.snapshot_writer.SnapshotWriter` with ``prefault``) while the
evaluation thread waits for the next batch.  On a kernel without
``MADV_POPULATE_WRITE`` it does nothing (said once in the log): the batch pays the copies as
before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["PAGE", "SpareWarmer", "Target", "ahead_of_next_batch", "make_private", "page_runs"]

log = logging.getLogger("tidewatch.engine")

PAGE = 4096
#: ``madvise`` advice of Linux 5.14's ``MADV_POPULATE_WRITE`` (include/uapi/asm-generic/mman-common.h)
MADV_POPULATE_WRITE = 23

#: an array and the rows of it about to be written (None: all of it)
Target = tuple[np.ndarray, np.ndarray | None]

_SUPPORTED = True


def page_runs(targets: Sequence[Target]) -> np.ndarray:
    """The pages holding ``targets``' rows -- each listed row whole (its first byte to its last,
    by the array's first stride), or the whole array -- as runs of consecutive pages: an
    ``(n, 2)`` array of (first byte address, length in bytes), page aligned, in address order."""
    firsts: list[np.ndarray] = []
    lasts: list[np.ndarray] = []
    for arr, rows in targets:
        if arr.nbytes == 0:
            continue
        base = arr.ctypes.data
        if rows is None:
            firsts.append(np.array([base // PAGE], np.int64))
            lasts.append(np.array([(base + arr.nbytes - 1) // PAGE], np.int64))
            continue
        rows = rows[(rows >= 0) & (rows < arr.shape[0])]
        if rows.size == 0:
            continue
        at = base + rows.astype(np.int64) * arr.strides[0]
        firsts.append(at // PAGE)
        lasts.append((at + arr[0].nbytes - 1) // PAGE)
    if not firsts:
        return np.zeros((0, 2), np.int64)
    lo = np.concatenate(firsts)
    hi = np.concatenate(lasts)
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    # a run starts where a span begins past the end of every span before it
    new = np.ones(lo.size, np.bool_)
    new[1:] = lo[1:] > hi[:-1] + 1
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], lo.size) - 1
    return np.stack([lo[starts] * PAGE, (hi[ends] - lo[starts] + 1) * PAGE], axis=1)


def make_private(targets: Sequence[Target]) -> int:
    """Fault in, writable, the pages of ``targets`` (:func:`page_runs`) without writing them:
    after a fork, the process's own copies made now rather than by the next write.  Returns the
    pages asked for (0 where the kernel lacks ``MADV_POPULATE_WRITE``).  The caller keeps
    ``targets`` -- and so the arrays -- alive until it returns."""
    global _SUPPORTED
    if not _SUPPORTED:
        return 0
    runs = page_runs(targets)
    madvise = _madvise()
    done = 0
    for addr, size in runs.tolist():
        if madvise(addr, size, MADV_POPULATE_WRITE) == 0:
            done += size // PAGE
            continue
        code = ctypes.get_errno()
        if code == errno.EINVAL:  # the kernel has no MADV_POPULATE_WRITE (before 5.14)
            _SUPPORTED = False
            log.info(
                "this kernel cannot fault pages in ahead (MADV_POPULATE_WRITE): batches after a fork pay their copies"
            )
            return done
        # ENOMEM: the range is no longer mapped (an array freed since); EFAULT, EHWPOISON:
        # a page could not be populated -- the next write faults it as usual
    return done


def ahead_of_next_batch(evaluator: object) -> Callable[[], None] | None:
    """A snapshot's ``after_fork``: the pages ``evaluator``'s next batch appends to -- its
    ``write_targets()`` (:meth:`engine.evaluation.evaluator.Evaluator.write_targets`), read now,
    between batches -- made this process's own by :func:`make_private`, the pages and the time
    logged; the arrays are let go as soon as it is done.  None for an evaluator without
    ``write_targets`` (None, tests' stand-ins)."""
    targets_of = getattr(evaluator, "write_targets", None)
    if targets_of is None:
        return None
    targets: list[Target] = list(targets_of())

    def run() -> None:
        t0 = time.perf_counter()
        pages = make_private(targets)
        targets.clear()
        log.info(
            "after the snapshot's fork: %d pages made this process's own in %.0f ms",
            pages,
            (time.perf_counter() - t0) * 1000,
        )

    return run


#: bytes of a spare faulted in by one call (:class:`SpareWarmer`): two huge pages
WARM_STEP = 4 << 20
#: how much lower the warming thread's priority is than the batches' (added to the thread's nice
#: value, at most 19; the kernel's work on its page faults is its own CPU time: the batches, Spark
#: and PostgreSQL come first)
WARM_NICENESS = 10


class SpareWarmer:
    """Faults in, on a thread of its own, the row columns the structures made ahead of their next
    growth (:mod:`engine.algorithms._spare`), so that the growth's fresh memory is paid while the
    batches go on rather than by the batch that grows.  :meth:`after_batch` is called by the
    evaluation thread after each batch (it only collects the new spares and hands them over);
    :meth:`close` waits for the thread.  The thread holds the arrays until they are faulted in;
    the evaluation thread may write them meanwhile (``MADV_POPULATE_WRITE`` writes nothing)."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tidewatch-spares")
        self._niced = False
        #: (arrays, bytes, seconds) of the spares faulted in, the newest last (a short tail)
        self.warmed: list[tuple[int, int, float]] = []

    def after_batch(self, evaluator: object) -> int:
        """Hand ``evaluator``'s new spare columns (``take_spares()``) to the thread; how many."""
        take = getattr(evaluator, "take_spares", None)
        spares = list(take()) if take is not None else []
        if spares:
            self._pool.submit(self._warm, spares)
        return len(spares)

    def _warm(self, spares: list[np.ndarray]) -> None:
        if not self._niced:  # this thread only (Linux: a thread's own nice value)
            self._niced = True
            with contextlib.suppress(OSError):
                me = threading.get_native_id()
                os.setpriority(
                    os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + WARM_NICENESS)
                )
        t0 = time.perf_counter()
        pages = 0
        try:
            for a in spares:
                flat = a.reshape(-1).view(np.uint8)
                # a step at a time: the kernel holds the process's memory map for the length of
                # one call, and a thread that maps or unmaps memory meanwhile (the output's
                # buffers) waits for it -- live, one call for 147-295 MB held the delivery up
                # for 1.1-1.7 s (docs/measurements/engine.md, "What the slow batches do")
                for lo in range(0, flat.shape[0], WARM_STEP):
                    pages += make_private([(flat[lo : lo + WARM_STEP], None)])
        except Exception:  # a spare not faulted in is faulted by its first write, as without one
            log.exception("spare row columns could not be faulted in ahead")
            return
        took = time.perf_counter() - t0
        self.warmed = [*self.warmed[-15:], (len(spares), pages * PAGE, took)]
        log.info(
            "row columns for a structure's next growth made ready ahead: %d MB in %.0f ms",
            pages * PAGE >> 20,
            took * 1000,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _madvise() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    """libc's ``madvise`` (``errno`` kept for :func:`ctypes.get_errno`; the GIL released while it runs)."""
    fn = ctypes.CDLL(None, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn
