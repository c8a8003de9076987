"""The rows of the last span of batches: what the Health view's per-second figures are measured
over.

A figure per wall-clock second (:func:`dashboard.queries.input_rate`'s events,
:func:`dashboard.driver_load.driver_load`'s CPU) is a sum over the batches of a window before the
newest one, divided by the time the window's batches span.  The oldest batch in the window
starts the span: what it counts arrived before it, so it is not counted.
(:func:`dashboard.storm.rate_per_s` keeps its own rule for a window holding only the newest
batch: the span then starts at the batch before, so a storm in slow batches is still seen.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["recent"]


def recent(times_s: Sequence[float] | np.ndarray, window_s: float) -> np.ndarray:
    """Indices of the rows made at ``times_s`` (any order) within ``window_s`` seconds before the
    newest, oldest first (ties in their given order); empty when there are no rows."""
    t = np.asarray(times_s, dtype=np.float64)
    if not len(t):
        return np.zeros(0, np.int64)
    order = np.argsort(t, kind="stable")
    return order[t[order] >= t[order[-1]] - window_s]
