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
