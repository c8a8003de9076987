"""A lookup's result changes, per rule: the evaluator's blocks of changes cut into runs of one
rule, and a rule's alerts put in (key, kind) order -- what :meth:`engine.core.EngineCore._lookup_at`
checks against its result sets and hands on (:meth:`~engine.core.EngineCore._emit`).

Pure: lists and NumPy arrays in and out.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ENTER", "EXIT", "entered", "exited", "in_order", "runs"]

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


def entered(cur: set[str], ks: list[str]) -> list[str]:
    """The keys of ``ks`` not in ``cur`` (each once, in no particular order), added to ``cur``.
    The evaluator reports a rule's entering keys once each and none it held, so the common case
    is checked by one ``isdisjoint`` and the count ``cur`` grew by -- no set made per run."""
    if cur.isdisjoint(ks):
        n = len(cur)
        cur.update(ks)
        return ks if len(cur) - n == len(ks) else list(dict.fromkeys(ks))
    got = set(ks).difference(cur)
    cur.update(got)
    return list(got)


def exited(cur: set[str], ks: list[str]) -> list[str]:
    """The keys of ``ks`` in ``cur`` (each once, in no particular order), removed from ``cur``:
    :func:`entered`'s converse (the common case: ``cur`` holds every key of ``ks``)."""
    if cur.issuperset(ks):
        n = len(cur)
        cur.difference_update(ks)
        return ks if n - len(cur) == len(ks) else list(dict.fromkeys(ks))
    got = cur.intersection(ks)
    cur.difference_update(got)
    return list(got)


def in_order(enter: list[str], gone: list[str]) -> tuple[list[str], list[str]]:
    """A rule's alerts at one lookup in (key, kind) order: ``(keys, kinds)``."""
    if not gone or not enter:
        keys = sorted(enter or gone)
        return keys, [ENTER if enter else EXIT] * len(keys)
    both = sorted([(k, ENTER) for k in enter] + [(k, EXIT) for k in gone])
    return [k for k, _ in both], [kind for _, kind in both]
