"""Metric rows grouped by engine: the one grouping the Health view's per-engine figures share.

Engines that share a database (shards by key, a second deployment: each its own
``--engine-id``, docs/engine.md "Scale") write their ``engine_metrics`` rows side by side.  A
figure about "the batch before" or "the newest batch" means the engine's own: engine b's batch
is not engine a's previous one.  :func:`groups` gives each engine's rows once; the Health view's
alerts per second since an engine's row before (:func:`since_row_before`), its charts' unbroken
runs (:func:`runs`) and each driver's load (:func:`dashboard.driver_load.driver_loads`) are
measured over them.  :class:`Newest` is an engine's newest row, what the view's top figures show
(with several engines, the worst of them: :func:`worst`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

__all__ = ["Newest", "capacity", "groups", "runs", "since_row_before", "worst"]


def groups(engine_ids: Sequence[str]) -> dict[str, np.ndarray]:
    """Each engine's row indices, in the rows' given order, engines in the order of their ids."""
    ids = np.asarray(engine_ids, dtype=object)
    if not len(ids):
        return {}
    order = np.argsort(ids, kind="stable")
    cuts = np.flatnonzero(ids[order][1:] != ids[order][:-1]) + 1
    return {str(ids[part[0]]): part for part in np.split(order, cuts)}


def since_row_before(times_s: Sequence[float], by_engine: dict[str, np.ndarray]) -> np.ndarray:
    """Seconds from each row's engine's row before to the row (rows oldest first within each
    engine, :func:`groups` of their engine ids); NaN for an engine's first row."""
    t = np.asarray(times_s, dtype=np.float64)
    dt = np.full(len(t), np.nan)
    for rows in by_engine.values():
        dt[rows[1:]] = np.diff(t[rows])
    return dt


def runs(since_before: np.ndarray, by_engine: dict[str, np.ndarray], gap_s: float) -> list[str]:
    """A name per row ("<engine> <n>") for its engine's unbroken run of rows: a run starts at an
    engine's first row and after more than ``gap_s`` seconds without a row -- a chart draws no
    line across the gap.  ``since_before`` is :func:`since_row_before` of the rows (NaN at an
    engine's first row), ``by_engine`` the :func:`groups` it was measured over."""
    names = [""] * len(since_before)
    for engine, rows in by_engine.items():
        n = np.cumsum(~(since_before[rows] <= gap_s))  # NaN (the engine's first row) starts a run too
        for i, k in zip(rows.tolist(), n.tolist(), strict=True):
            names[i] = f"{engine} {k}"
    return names


@dataclass(frozen=True)
class Newest:
    """An engine's newest metric row: when it was made, the lag behind the input, the batch's
    evaluation time, its delivery (and the alert log's expansion behind it), and its
    ``events_per_s`` over that evaluation time (the processing capacity)."""

    engine: str
    at: datetime
    lag_ms: float | None = None
    batch_ms: float | None = None
    delivery_ms: float | None = None
    expansion_ms: float | None = None
    events_per_s: float | None = None


def worst(newest: Sequence[Newest]) -> Newest | None:
    """One :class:`Newest` of the worst figures among the engines' newest rows: the oldest
    ``at`` (the engine that committed least recently, named in ``engine``), the largest lag,
    batch time and delivery (with that delivery's expansion); None without rows.  With one
    engine, its row as it is.  (Capacities add up instead: :func:`capacity`.)"""
    if len(newest) <= 1:
        return newest[0] if newest else None

    def most(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    stalest = min(newest, key=lambda n: n.at)
    deliveries = [n for n in newest if n.delivery_ms is not None]
    slowest = max(deliveries, key=lambda n: n.delivery_ms or 0.0) if deliveries else None
    return Newest(
        engine=stalest.engine,
        at=stalest.at,
        lag_ms=most([n.lag_ms for n in newest]),
        batch_ms=most([n.batch_ms for n in newest]),
        delivery_ms=None if slowest is None else slowest.delivery_ms,
        expansion_ms=None if slowest is None else slowest.expansion_ms,
    )


def capacity(newest: Sequence[Newest], window_s: float) -> float | None:
    """The engines' processing capacity: the sum of ``events_per_s`` of each engine's newest row
    made within ``window_s`` seconds of the newest of all (an engine that stopped earlier adds
    nothing); None when none of them has a figure."""
    if not newest:
        return None
    since = max(n.at for n in newest).timestamp() - window_s
    figures = [n.events_per_s for n in newest if n.at.timestamp() >= since and n.events_per_s is not None]
    return float(sum(figures)) if figures else None
