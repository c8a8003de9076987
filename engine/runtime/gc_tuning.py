"""Python's cyclic garbage collector, tuned for a process that holds a large state.

The engine keeps hundreds of thousands of long-lived Python objects (rules, current result sets,
compiled plans) and allocates a few small ones per alert (its values dict, its record). With
Python's default thresholds (700, 10, 10) a full collection -- a walk over every tracked object --
runs every few hundred thousand allocations, each a pause in the alert path (measured in an
alert storm of 10,000 rules: docs/measurements/engine.md, "Garbage collection and alert values").
Nearly all these objects are freed by reference counting; the collector only matters for cycles,
which the young generations still catch.

:func:`tune_gc` raises the thresholds (``engine_gc_threshold``); :func:`freeze_state` moves what
exists after start-up (the recovered state) out of the collector's reach (``gc.freeze``).

In Spark's Python workers the collector costs per task, not per allocation: PySpark's daemon runs
a full ``gc.collect()`` after every task of a reused worker (``pyspark/daemon.py``), a walk over
every object the worker holds -- with NumPy, Arrow, Numba and the engine's kernels loaded, ≈ 100 ms
of CPU per task here, whatever the task did.  :func:`freeze_worker`, called by each of the
engine's worker functions as a task starts, takes that to ≈ 2-3 ms.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("tidewatch.engine")

DEFAULT = (700, 10, 10)  # Python's own


def tune_gc(threshold0: int) -> None:
    """Collect the youngest generation every ``threshold0`` allocations (0: Python's defaults),
    the older ones 50 and 100 times less often."""
    if threshold0 <= 0:
        gc.set_threshold(*DEFAULT)
        return
    gc.set_threshold(int(threshold0), 50, 100)
    log.info("garbage collector thresholds %s", gc.get_threshold())


def freeze_state() -> None:
    """Collect once, then exempt every object that exists now from later collections."""
    gc.collect()
    gc.freeze()
    log.info("%d objects of the start-up state exempted from garbage collection", gc.get_freeze_count())


def freeze_worker() -> None:
    """At the start of a task in a Spark Python worker: exempt every object alive now from the
    collector (``gc.freeze``), so the full collection PySpark's daemon runs after each task walks
    only what this task allocates.  What is alive as a task starts is what the worker keeps
    (modules, compiled kernels, caches, a shard's state); the previous task's garbage was collected
    after it.  Reference counting still frees every frozen object that is dropped; only cycles
    among frozen objects are never collected.  No logging: it runs in every task.  Outside a
    Spark task (the same functions run in the driver on a replay, in tests) it does nothing."""
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        gc.freeze()
