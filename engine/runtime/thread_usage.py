"""The calling thread's time in the kernel and its page faults, to say what slowed a batch.

A batch's evaluation is pure computation in the evaluation thread, so when it takes longer than
usual the question is whether the thread computed or the kernel worked for it: page faults (the
first write to fresh memory, or to a page shared with a snapshot's forked child,
:mod:`engine.runtime.snapshot_writer`) are counted as the thread's system time.  On this
project's benchmark machine -- a nested virtual machine whose free memory goes back to the host --
a fault costs 20-100 µs where a bare machine takes 1-2 µs, and the slow batches of a live run were
nearly all system time (docs/measurements/engine.md, "What the slow batches do, in the kernel").
Linux's ``getrusage(RUSAGE_THREAD)``; elsewhere the process's figures (a coarser answer, never an
error).
"""

from __future__ import annotations

import resource
from typing import NamedTuple

__all__ = ["ThreadUsage", "thread_usage"]

_WHO = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


class ThreadUsage(NamedTuple):
    """CPU seconds spent in the kernel on the thread's behalf, and its page faults (minor and
    major), since it started; subtract two readings for a step's share."""

    kernel_s: float
    faults: int

    def __sub__(self, other: object) -> ThreadUsage:
        if not isinstance(other, ThreadUsage):
            return NotImplemented
        return ThreadUsage(self.kernel_s - other.kernel_s, self.faults - other.faults)


def thread_usage() -> ThreadUsage:
    """The calling thread's :class:`ThreadUsage` now (about a microsecond)."""
    r = resource.getrusage(_WHO)
    return ThreadUsage(r.ru_stime, r.ru_minflt + r.ru_majflt)
