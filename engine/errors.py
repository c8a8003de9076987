"""The root of the ``engine`` package's errors.

:class:`EngineError` (under :class:`tidewatch.errors.TidewatchError`) is the root of every
error of the engine, e.g. the backtest's refusals of its input
(:class:`engine.evaluation.backtest.BacktestInputError` and its subclasses).
"""

from __future__ import annotations

from tidewatch.errors import TidewatchError

__all__ = ["EngineError"]


class EngineError(TidewatchError):
    """The root of every error of the ``engine`` package."""
