"""Evaluation: the shared window state, every rule's lookup, the pane pre-aggregation and the backtest.

Modules, each importing only those above it:

* :mod:`engine.evaluation.panes` -- (key, pane) pre-aggregation (Golab et al. 2003's basic
  windows; rows with multiplicities, Arasu & Widom 2004, section 4.2);
* :mod:`engine.evaluation.batches` -- a micro-batch and its predicate masks, the pane spec, the
  kernels of group lookups;
* :mod:`engine.evaluation.history` -- the retained input a rule added later is filled from
  (PSoup), bounded by the windows in use (ROWS windows: each key's newest n rows);
* :mod:`engine.evaluation.state` -- the shared state per (stream, key field) (sections 3-4);
* :mod:`engine.evaluation.reach` -- how far back the rules in use read (what the history keeps,
  how often structures expire), worked out once per rule set;
* :mod:`engine.evaluation.rules` -- rules, groups of rules looked up together, a lookup's changes;
* :mod:`engine.evaluation.lookup` -- one lookup: index candidates, exact post-check;
* :mod:`engine.evaluation.evaluator` -- :class:`Evaluator`, the entry point the engine and the
  backtest run (PSoup: rules added at any time see the state already held);
* :mod:`engine.evaluation.backtest` -- ``tidewatch backtest`` (RULES.md, "The backtest contract").

The names below are imported from their module on first use (:mod:`tidewatch.lazy`), so
``import engine.evaluation.panes`` does not load Numba or the evaluator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidewatch.lazy import lazy_exports

if TYPE_CHECKING:
    from engine.evaluation.backtest import (
        BacktestInputError,
        BacktestResult,
        EventFile,
        RuleFileError,
        iter_alerts,
        load_events,
        load_rules,
        lookup_times,
        run_backtest,
    )
    from engine.evaluation.batches import BatchView, EvalPaneSpec
    from engine.evaluation.evaluator import Evaluator
    from engine.evaluation.panes import ColumnSet, PaneAggregates, PaneRows, PaneSpec, aggregate, pane_of
    from engine.evaluation.rules import Changes

__all__ = [
    "BacktestInputError",
    "BacktestResult",
    "BatchView",
    "Changes",
    "ColumnSet",
    "EvalPaneSpec",
    "Evaluator",
    "EventFile",
    "PaneAggregates",
    "PaneRows",
    "PaneSpec",
    "RuleFileError",
    "aggregate",
    "iter_alerts",
    "load_events",
    "load_rules",
    "lookup_times",
    "pane_of",
    "run_backtest",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BacktestInputError": "engine.evaluation.backtest",
        "BacktestResult": "engine.evaluation.backtest",
        "EventFile": "engine.evaluation.backtest",
        "RuleFileError": "engine.evaluation.backtest",
        "iter_alerts": "engine.evaluation.backtest",
        "load_events": "engine.evaluation.backtest",
        "load_rules": "engine.evaluation.backtest",
        "lookup_times": "engine.evaluation.backtest",
        "run_backtest": "engine.evaluation.backtest",
        "BatchView": "engine.evaluation.batches",
        "EvalPaneSpec": "engine.evaluation.batches",
        "Evaluator": "engine.evaluation.evaluator",
        "ColumnSet": "engine.evaluation.panes",
        "PaneAggregates": "engine.evaluation.panes",
        "PaneRows": "engine.evaluation.panes",
        "PaneSpec": "engine.evaluation.panes",
        "aggregate": "engine.evaluation.panes",
        "pane_of": "engine.evaluation.panes",
        "Changes": "engine.evaluation.rules",
    },
)
