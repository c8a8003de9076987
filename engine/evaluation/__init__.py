"""Evaluation: the shared window state, every rule's lookup, the pane pre-aggregation and the backtest."""
