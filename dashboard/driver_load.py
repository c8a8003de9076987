"""How busy the engine's driver is, and where it would saturate: pure functions for the Health view.

Adding Spark executors scales the engine's decode and pane pre-aggregation, not its driver, which
merges the pane rows, evaluates the shared indexes and delivers the alerts (issue #19;
docs/engine.md, "Scale").  Each ``engine_metrics`` row carries ``driver_cpu_ms``, the driver
process's CPU since the row before it (:mod:`engine.runtime.driver_cpu`, migration 0013), and
the batch's events (``events_per_s`` × ``batch_ms``: the events over the evaluation time, times
that time).  :func:`driver_load` sums them over the rows of the last ``window_s`` seconds:

* **share**: the driver's CPU seconds per wall-clock second -- 1.0 is one core busy all the time;
* **µs per event**: its CPU per event taken in; one core's **ceiling** is 10^6 / that events per
  second at this rule load and alert rate -- the input rate past which more executors do not help.
  The driver's fixed costs (per batch, the chart answers' polling) are in the sum too, so at a
  low input rate this understates the ceiling: it is a bound from below.

A row's CPU is the CPU spent between the row before it and itself, so the oldest counted row
starts the span and its own CPU is not counted (:mod:`dashboard.spans`, as
:func:`dashboard.queries.input_rate` does for events).  A row without ``driver_cpu_ms`` (an
engine's first batch, a restart, a row older than migration 0013) starts the span again:
nothing before it is counted.

Engines that share a database (shards, a second deployment: each its own ``--engine-id``,
docs/engine.md "Scale") each have a driver, and a row's CPU is its own driver's since that
driver's row before.  :func:`driver_loads` therefore measures each engine's rows apart, over the
same last ``window_s`` seconds before the newest row of any engine: one engine's restart does
not cut another's span, and no share sums two processes' CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dashboard import per_engine, spans

__all__ = ["DriverLoad", "driver_load", "driver_loads"]


@dataclass(frozen=True)
class DriverLoad:
    """The driver's CPU over a span of batches: ``share`` of one core, ``us_per_event`` (None
    when the span took in no event), and the ``ceiling_per_s`` that gives on one core."""

    share: float
    us_per_event: float | None
    seconds: float

    @property
    def ceiling_per_s(self) -> float | None:
        if not self.us_per_event:
            return None
        return 1e6 / self.us_per_event


def driver_load(
    times_s: Sequence[float],
    cpu_ms: Sequence[float | None],
    events: Sequence[float | None],
    window_s: float,
) -> DriverLoad | None:
    """The :class:`DriverLoad` of metric rows made at ``times_s`` (any order) with their
    ``driver_cpu_ms`` and events, over the last ``window_s`` seconds before the newest; None when
    fewer than two rows remain after the newest row without a CPU figure (no span to measure)."""
    rows = spans.recent(times_s, window_s)
    if len(rows) < 2:
        return None
    t = np.asarray(times_s, dtype=np.float64)[rows]
    c = np.asarray([np.nan if x is None else x for x in cpu_ms], dtype=np.float64)[rows]
    e = np.nan_to_num(np.asarray([np.nan if x is None else x for x in events], dtype=np.float64))[rows]
    gaps = np.flatnonzero(np.isnan(c))
    if len(gaps):  # the span starts again at the newest row without a figure
        t, c, e = t[gaps[-1] :], c[gaps[-1] :], e[gaps[-1] :]
    span = float(t[-1] - t[0]) if len(t) >= 2 else 0.0
    if span <= 0:
        return None
    cpu_s = float(c[1:].sum()) / 1000
    n = float(e[1:].sum())
    return DriverLoad(share=cpu_s / span, us_per_event=cpu_s * 1e6 / n if n > 0 else None, seconds=span)


def driver_loads(
    engine_ids: Sequence[str],
    times_s: Sequence[float],
    cpu_ms: Sequence[float | None],
    events: Sequence[float | None],
    window_s: float,
) -> dict[str, DriverLoad]:
    """Each engine's :func:`driver_load` over its own rows of the last ``window_s`` seconds before
    the newest row of all (rows in any order), busiest driver first; an engine without a span
    there (one row, no CPU figure since its restart, or none in the window) is left out."""
    if not len(times_s):
        return {}
    t = np.asarray(times_s, dtype=np.float64)
    recent = np.flatnonzero(t >= t.max() - window_s)
    loads: dict[str, DriverLoad] = {}
    for engine, part in per_engine.groups([engine_ids[i] for i in recent.tolist()]).items():
        rows = recent[part].tolist()
        d = driver_load(t[rows].tolist(), [cpu_ms[i] for i in rows], [events[i] for i in rows], window_s)
        if d is not None:
            loads[engine] = d
    return dict(sorted(loads.items(), key=lambda kv: -kv[1].share))
