"""The Tidewatch engine: shared sliding-window indexes evaluating every subscription, exact alerts out.

:class:`EngineError` is the root of the package's errors (:mod:`engine.errors`).  Names other
than the error root are imported on first use (:mod:`tidewatch.lazy`): ``import engine`` does
not load PySpark, Numba or the Kafka clients.
"""

from __future__ import annotations

from engine.errors import EngineError
from tidewatch.lazy import lazy_exports

TYPE_CHECKING = False  # not typing's: importing typing costs more than this package
if TYPE_CHECKING:
    from engine.app import EngineApp
    from engine.evaluation.backtest import BacktestInputError, MalformedRows, RuleFileError, run_backtest

__all__ = [
    "BacktestInputError",
    "EngineApp",
    "EngineError",
    "MalformedRows",
    "RuleFileError",
    "run_backtest",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BacktestInputError": "engine.evaluation.backtest",
        "EngineApp": "engine.app",
        "MalformedRows": "engine.evaluation.backtest",
        "RuleFileError": "engine.evaluation.backtest",
        "run_backtest": "engine.evaluation.backtest",
    },
)
