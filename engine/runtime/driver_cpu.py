"""The driver's CPU between batches: what the Health view turns into the share of a core it uses.

The driver is the part of the engine that more Spark executors do not scale (issue #19: it merges
the executors' pane rows, evaluates the shared indexes and delivers the alerts), so how busy it is
says how far a cluster can grow before the driver saturates.  :class:`DriverCpu` reads the CPU
time of the whole Python process -- every thread: evaluation, delivery, librdkafka's, the chart
answers -- with ``time.process_time`` (``CLOCK_PROCESS_CPUTIME_ID``; about a microsecond), the
same figure ``bench/engine_bench.py`` reports as "driver CPU".  Spark's JVM and its Python
workers are other processes and are not counted.
"""

from __future__ import annotations

import time

__all__ = ["DriverCpu"]


class DriverCpu:
    """CPU milliseconds of this process since the previous :meth:`since_last` (None at the first
    call: there is no previous batch to measure from)."""

    def __init__(self) -> None:
        self._last: float | None = None

    def since_last(self) -> float | None:
        now = time.process_time()
        last, self._last = self._last, now
        return None if last is None else (now - last) * 1000
