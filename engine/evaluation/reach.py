"""How far back the rules in use read: what the retained history keeps and how often the
shared structures are expired, worked out once per rule set instead of at every batch and
lookup.

A :class:`Reach` is a function of the structures' users only (each structure's longest time
window, :meth:`engine.evaluation.state.Structure.horizon`, and its ROWS windows,
:meth:`~engine.evaluation.state.Structure.rows_keep`), and those change only when a rule is
added or removed.  So the evaluator asks for it with :func:`reach_for` and drops it with
:func:`forget_reach` whenever a rule is added or removed -- as it does its alert values' plan
(:func:`engine.evaluation.alert_values.forget_plan`) -- and it is never written into a
snapshot.  With 10,000 rules sharing a few structures, walking every structure's users at
every lookup (``max`` over 10,000 windows per structure) was ≈ 5 % of the driver's lookups.

Retention (Arasu & Widom 2004, section 2: a time-based window reads the rows of its last T
time units, a tuple-based window ``S_k[N, 0]`` of substream k its last N tuples; section 3.2):
a stream's raw history keeps the batches of its longest time window in use (at least the
evaluator's ``history_ms``) and, per (key field, predicate) read by ROWS windows, each key's
newest n_max rows (:class:`engine.evaluation.history.RowsKeep`).

Pure: the states in, the figures out.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.evaluation.history import RowsKeep
from engine.evaluation.state import KeyState

__all__ = ["Reach", "forget_reach", "reach_for"]


@dataclass(frozen=True)
class Reach:
    """The windows in use, summed up: ``longest`` -- the longest time window of any structure
    (0: none); per stream, what its raw history keeps (:meth:`retention`)."""

    longest: int
    history_ms: int
    by_stream: dict[str, tuple[int, list[RowsKeep]]] = field(default_factory=dict)

    def retention(self, stream: str) -> tuple[int, list[RowsKeep]]:
        """(how far back ``stream``'s batches are kept -- its longest time window in use, at
        least ``history_ms`` --, the newest rows per key and predicate that ROWS windows in use
        read); a stream no rule reads keeps ``history_ms`` and no rows."""
        got = self.by_stream.get(stream)
        return got if got is not None else (self.history_ms, [])


def reach_of(states: Iterable[KeyState], history_ms: int) -> Reach:
    """The :class:`Reach` of the structures of ``states`` (an evaluator's ``states.values()``)."""
    longest = 0
    keep: dict[str, int] = {}
    rows: dict[str, dict[tuple[str, str], RowsKeep]] = {}
    for st in states:
        by_key = rows.setdefault(st.stream, {})
        far = keep.get(st.stream, history_ms)
        for (_, pred_text, _, _), s in st.structs.items():
            h = s.horizon()
            longest = max(longest, h)
            far = max(far, h)
            n = s.rows_keep()
            if n is None:
                continue
            k = (st.key, pred_text)
            if k not in by_key or by_key[k].n < n:
                by_key[k] = RowsKeep(st.key, s.predicate, n)
        keep[st.stream] = far
    return Reach(longest, history_ms, {s: (keep[s], list(rows[s].values())) for s in keep})


#: per evaluator: its :class:`Reach` -- not in the evaluator, so never in a snapshot
_REACH: weakref.WeakKeyDictionary[Any, Reach] = weakref.WeakKeyDictionary()


def reach_for(owner: Any, states: Iterable[KeyState], history_ms: int) -> Reach:
    """``owner``'s :class:`Reach`, made at the first call after :func:`forget_reach` (which
    ``owner`` calls whenever a rule is added or removed)."""
    got = _REACH.get(owner)
    if got is None:
        got = _REACH[owner] = reach_of(states, history_ms)
    return got


def forget_reach(owner: Any) -> None:
    """Drop ``owner``'s :class:`Reach`: its rules changed."""
    _REACH.pop(owner, None)
