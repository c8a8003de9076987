"""A lookup's result changes checked against the rules' result sets and put in order -- what
:meth:`engine.core.EngineCore._lookup_at` hands on (:meth:`~engine.core.EngineCore._emit`).

The evaluator reports a lookup's changes as blocks of (rule names, keys) that entered or exited
(:class:`engine.evaluation.rules.Changes`).  The core keeps every rule's current result as a set
of keys, and an alert goes out only where that set changes: an ENTER for a key the rule did not
hold, an EXIT for one it held (each once).  :func:`accepted` does this for the whole lookup at
once -- the membership tests by one C-level ``map`` over all the changes, the rules and keys
ranked by factorizing them once, the order by one ``lexsort`` -- instead of a few Python calls
per rule (with 10,000 rules and thousands of them changing at a lookup, that per-rule Python
was the largest part of the core's share of a lookup).

Pure: lists, sets and NumPy arrays in and out (the result sets are updated in place).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import compress, repeat
from operator import contains, is_
from typing import Any

import numpy as np
import pandas as pd

from engine.evaluation.alert_values import KeysByRule

__all__ = ["ENTER", "EXIT", "Accepted", "accepted"]

ENTER, EXIT = "ENTER", "EXIT"
_KIND = np.array([EXIT, ENTER], dtype=object)
#: the "result set" of a rule whose changes are skipped (never added to)
_SKIPPED: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Accepted:
    """A lookup's alerts in (rule, key, kind) order -- rules by name, a rule's alerts by key, an
    ENTER before an EXIT of the same key: rule ``sids[r]`` has ``sizes[r]`` (>= 1) alerts, the
    next ones of ``keys`` / ``kinds``."""

    sids: list[str]
    sizes: np.ndarray
    keys: list[str]
    kinds: list[str]

    @cached_property
    def keys_by_rule(self) -> KeysByRule:
        """The alerts' keys as ``{rule: keys}`` over the same flat columns (what the values read)."""
        return KeysByRule(self.sids, self.sizes, self.keys)

    def by_rule(self) -> dict[str, tuple[list[str], list[str]]]:
        """``{rule: (keys, kinds)}`` in the same order."""
        kb, kinds = self.keys_by_rule, self.kinds
        return {sid: (kb[sid], kinds[slice(*kb.span(sid))]) for sid in self.sids}


NONE = Accepted([], np.zeros(0, np.int64), [], [])


def accepted(
    parts: Sequence[tuple[np.ndarray, np.ndarray, str]],
    fresh: Collection[str],
    rules: Collection[str],
    current: dict[str, set[str]],
) -> Accepted:
    """The alerts of a lookup's changes ``parts`` (blocks of ``(rule names, keys, ENTER|EXIT)``,
    in the evaluator's order): of the rules in ``rules`` and not in ``fresh`` (a rule added
    since the last lookup is diffed whole by the core instead), an ENTER where the key is not in
    the rule's set of ``current``, an EXIT where it is; ``current`` updated block by block in
    the evaluator's order (a rule's set made where it has none).

    Each (rule, key) usually comes once per lookup, so every change is checked against the sets
    as they were and applied after; where one comes twice, the changes are taken one by one in
    order instead (the same result)."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return NONE
    names = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    keys = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    enter = np.concatenate([np.full(len(p[0]), p[2] == ENTER) for p in parts])
    scode, suniq = pd.factorize(names, use_na_sentinel=False)
    sids: list[str] = suniq.tolist()
    if not fresh and all(map(rules.__contains__, sids)):  # the common case: every rule's changes
        ok = np.ones(len(sids), bool)
    else:
        ok = np.fromiter((s in rules and s not in fresh for s in sids), bool, len(sids))
        if not ok.any():
            return NONE
    curs: list[Any] = list(map(current.get, sids))
    for i in np.flatnonzero(ok & np.fromiter(map(is_, curs, repeat(None)), bool, len(curs))).tolist():
        curs[i] = current[sids[i]] = set()  # a rule's first result set, in the order rules come
    for i in np.flatnonzero(~ok).tolist():
        curs[i] = _SKIPPED
    kcode, kuniq = pd.factorize(keys, use_na_sentinel=False)
    live = ok[scode]
    pair = scode.astype(np.int64) * max(len(kuniq), 1) + kcode
    once = not bool(pd.Series(pair[live]).duplicated().any())
    cur_of = list(map(curs.__getitem__, scode.tolist()))  # each change's rule's set
    klist = keys.tolist()
    if once:
        held = np.fromiter(map(contains, cur_of, klist), bool, len(klist))
        valid = live & (held != enter)
        at = 0
        for p in parts:  # applied block by block, each one's keys in its order
            n, v = len(p[0]), valid[at : at + len(p[0])].tolist()
            op = set.add if p[2] == ENTER else set.discard
            deque(map(op, compress(cur_of[at : at + n], v), compress(klist[at : at + n], v)), maxlen=0)
            at += n
    else:
        valid = np.fromiter(map(_apply, cur_of, klist, enter.tolist()), bool, len(klist))
    return _ordered(np.flatnonzero(valid), sids, scode, kuniq, kcode, keys, enter)


def _apply(cur: set[str], key: str, enter: bool) -> bool:
    """One change taken on its own: whether it is an alert (and the set updated)."""
    if cur is _SKIPPED or (key in cur) == enter:
        return False
    if enter:
        cur.add(key)
    else:
        cur.discard(key)
    return True


def _ordered(
    at: np.ndarray,
    sids: list[str],
    scode: np.ndarray,
    kuniq: np.ndarray,
    kcode: np.ndarray,
    keys: np.ndarray,
    enter: np.ndarray,
) -> Accepted:
    """The changes ``at`` as an :class:`Accepted`: rules and keys ranked by sorting the distinct
    ones (Python's order, as ``sorted`` gives it), the changes by one ``lexsort``."""
    if at.shape[0] == 0:
        return NONE
    srank = _ranks(sids)
    krank = _ranks(kuniq.tolist())
    s = scode[at]
    order = at[np.lexsort((~enter[at], krank[kcode[at]], srank[s]))]
    counts = np.bincount(s, minlength=len(sids))
    by_name = np.argsort(srank)
    used = by_name[counts[by_name] > 0]
    return Accepted(
        [sids[i] for i in used.tolist()],
        counts[used].astype(np.int64),
        keys[order].tolist(),
        _KIND[enter[order].astype(np.int8)].tolist(),
    )


def _ranks(values: list[Any]) -> np.ndarray:
    """Each value's rank in ``sorted(values)`` (the values distinct)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    rank = np.empty(len(values), np.int64)
    rank[order] = np.arange(len(values), dtype=np.int64)
    return rank
