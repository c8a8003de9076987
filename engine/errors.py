"""The root of the ``engine`` package's errors.

:class:`EngineError` (under :class:`tidewatch.errors.TidewatchError`) is the root of every
error of the engine, e.g. the backtest's refusals of its input
(:class:`engine.evaluation.backtest.BacktestInputError` and its subclasses).
"""

from __future__ import annotations

from tidewatch.errors import TidewatchError

__all__ = ["BatchParamsMismatch", "CheckpointMismatch", "EngineError", "SnapshotUnreadable"]


class EngineError(TidewatchError):
    """The root of every error of the ``engine`` package."""


class SnapshotUnreadable(EngineError, ValueError):
    """A state snapshot this engine cannot restore: a different state format, classes that have
    moved or been renamed since it was written, or a damaged file.  The engine then rebuilds its
    state by replaying the committed batches from Kafka (:meth:`engine.app.EngineApp.recover`)."""


class CheckpointMismatch(EngineError):
    """Spark's checkpoint and the engine's state cover different Kafka offsets for the same
    batch id (a checkpoint deleted, or restored from another point in time).  The engine
    stops rather than skip batches it never processed (:func:`engine.sources.offsets.check_batch`);
    at its next start it replaces Spark's checkpoint by one that begins where the state ends."""


class BatchParamsMismatch(EngineError):
    """A batch the executors pre-aggregated was made with a ``late`` bound or watermark other
    than the state's when it is evaluated (:meth:`engine.core.EngineCore.process_preaggregated`;
    the pipelined executors mode decides them ahead, :meth:`engine.core.EngineCore.params_after`).
    Its events' ``late`` decisions would not be the state's: the batch is refused, the query
    stops, and the restart replays it from Kafka with the state's own parameters."""
