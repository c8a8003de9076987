"""A lookup's result changes, per rule: the evaluator's blocks of changes cut into runs of one
rule, and a rule's alerts put in (key, kind) order -- what :meth:`engine.core.EngineCore._lookup_at`
checks against its result sets and hands on (:meth:`~engine.core.EngineCore._emit`).

Pure: lists and NumPy arrays in and out.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ENTER", "EXIT", "in_order", "runs"]

ENTER, EXIT = "ENTER", "EXIT"


def runs(names: np.ndarray, keys: np.ndarray) -> list[tuple[str, list[str]]]:
    """A block of changes (rule names, keys) as ``(rule, [key, ...])`` per run of one rule (a
    rule in several runs comes once per run): the runs found by one vectorized comparison."""
    n = names.shape[0]
    if n == 0:
        return []
    cut = (np.flatnonzero(names[1:] != names[:-1]) + 1).tolist()
    ks = keys.tolist()
    return [(str(names[a]), ks[a:b]) for a, b in zip([0, *cut], [*cut, n], strict=True)]


def in_order(enter: list[str], gone: list[str]) -> tuple[list[str], list[str]]:
    """A rule's alerts at one lookup in (key, kind) order: ``(keys, kinds)``."""
    if not gone or not enter:
        keys = sorted(enter or gone)
        return keys, [ENTER if enter else EXIT] * len(keys)
    both = sorted([(k, ENTER) for k in enter] + [(k, EXIT) for k in gone])
    return [k for k, _ in both], [kind for _, kind in both]
