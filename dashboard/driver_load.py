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
* **the fit**: the same rows' CPU against their events as a line, ``cpu = fixed + per_event ×
  events`` (least squares), separates the two where the batches' sizes vary enough to tell them
  apart: ``fixed_ms_per_batch``, ``marginal_us_per_event`` and the ceiling they give at the span's
  batch rate, ``(1 - fixed × batches per second) / per_event`` (:attr:`DriverLoad.fit_ceiling_per_s`).
  It is kept only where it is reliable -- at least :data:`FIT_MIN_ROWS` rows, the per-event
  slope above zero and its standard error at most :data:`FIT_MAX_REL_ERROR` of it -- else the
  three are None and the bound above is all there is (a light, even input: every batch about as
  big, the slope lost in the noise of the fixed costs).

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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dashboard import per_engine, spans

__all__ = ["FIT_MAX_REL_ERROR", "FIT_MIN_ROWS", "DriverLoad", "Fit", "driver_load", "driver_loads", "fit_cpu"]

#: the fewest counted rows the fit is made from
FIT_MIN_ROWS = 5
#: the largest standard error of the fitted per-event CPU, relative to it, for the fit to be kept
FIT_MAX_REL_ERROR = 0.25


@dataclass(frozen=True)
class DriverLoad:
    """The driver's CPU over a span of batches: ``share`` of one core, ``us_per_event`` (None
    when the span took in no event), and the ``ceiling_per_s`` that gives on one core; with a
    reliable fit, its ``fit_ceiling_per_s`` too (module docstring)."""

    share: float
    us_per_event: float | None
    seconds: float
    #: the fit's fixed CPU per batch (ms) and CPU per event (µs), and the span's batches per
    #: second (module docstring); None where the fit is not reliable
    fixed_ms_per_batch: float | None = None
    marginal_us_per_event: float | None = None
    batches_per_s: float | None = None

    @property
    def ceiling_per_s(self) -> float | None:
        """One core over the CPU per event, fixed costs counted as per-event: a lower bound."""
        if not self.us_per_event:
            return None
        return 1e6 / self.us_per_event

    @property
    def fit_ceiling_per_s(self) -> float | None:
        """The input rate one core carries by the fit, at the span's batch rate: what the fixed
        costs leave of the core over the CPU per event (0 when they take it all); None without a
        reliable fit."""
        if (
            self.marginal_us_per_event is None
            or self.fixed_ms_per_batch is None
            or self.batches_per_s is None
        ):
            return None
        left = 1.0 - max(self.fixed_ms_per_batch, 0.0) / 1000 * self.batches_per_s
        return max(left, 0.0) * 1e6 / self.marginal_us_per_event


@dataclass(frozen=True)
class Fit:
    """``cpu_ms = fixed_ms + per_event_ms × events`` by least squares, with the slope's standard
    error."""

    fixed_ms: float
    per_event_ms: float
    per_event_se: float

    @property
    def reliable(self) -> bool:
        return self.per_event_ms > 0 and self.per_event_se <= FIT_MAX_REL_ERROR * self.per_event_ms


def fit_cpu(cpu_ms: np.ndarray, events: np.ndarray) -> Fit | None:
    """The least-squares line of ``cpu_ms`` over ``events`` (one entry per batch); None with
    fewer than :data:`FIT_MIN_ROWS` rows or when every batch took in as many events (no slope)."""
    n = len(cpu_ms)
    if n < FIT_MIN_ROWS:
        return None
    x, y = events.astype(np.float64), cpu_ms.astype(np.float64)
    dx = x - x.mean()
    sxx = float(dx @ dx)
    if sxx <= 1e-12 * float(x @ x):  # equal sizes, up to the mean's rounding
        return None
    b = float(dx @ (y - y.mean())) / sxx
    a = float(y.mean()) - b * float(x.mean())
    res = y - (a + b * x)
    se = math.sqrt(float(res @ res) / (n - 2) / sxx)
    return Fit(fixed_ms=a, per_event_ms=b, per_event_se=se)


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
    fit = fit_cpu(c[1:], e[1:])
    if fit is not None and not fit.reliable:
        fit = None
    return DriverLoad(
        share=cpu_s / span,
        us_per_event=cpu_s * 1e6 / n if n > 0 else None,
        seconds=span,
        fixed_ms_per_batch=None if fit is None else fit.fixed_ms,
        marginal_us_per_event=None if fit is None else fit.per_event_ms * 1000,
        batches_per_s=None if fit is None else (len(c) - 1) / span,
    )


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
