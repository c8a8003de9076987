"""``--strategy scan``: the best no-index evaluation, the honest baseline of the collective index.

``naive`` (the paper's per-rule baseline) evaluates every rule on every key of its domain and
reads each of its aggregates for that rule alone.  ``scan`` is what a good engineer writes
without a collective index: at each lookup every *distinct* aggregate -- (stream, key field,
predicate, attribute, function, window), i.e. (shared structure, function, window) -- is
computed once, vectorized over the key domain of the rules reading it (the keys with an event
in the longest time window of those rules; every key when one of them has only ROWS windows),
and each rule's condition is then array comparisons over its own domain, gathering
the aggregate values it reads.  No collective index is built or read (the evaluator runs with
``strategy="naive"``: per-key R-INT structures only).  Answers are those of ``shared`` and
``naive``: the same structures, the same aggregate code (:meth:`Lookup._agg`), every shape of
rule (ROWS windows, FIRST / LAST, DISTINCT included).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.evaluation.batches import sorted_diff
from engine.evaluation.evaluator import Evaluator
from engine.evaluation.lookup import Lookup
from engine.evaluation.rules import Changes, Rule
from subscriptions import rule_ast as A


def _window_sig(w: A.Window) -> tuple[Any, ...]:
    if isinstance(w, A.RowsWindow):
        return ("rows", w.n)
    return ("time", w.start_ms, w.end_ms)


class ScanLookup(Lookup):
    """One lookup where each distinct aggregate is computed once over its state's key domain."""

    def __init__(self, ev: Evaluator, now: int, widest: dict[tuple[Any, ...], int | None]) -> None:
        super().__init__(ev, now)
        self._widest = widest  # aggregate -> longest domain window of its rules (None: all keys)
        self._values: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}
        self.computed = 0  # distinct aggregates computed at this lookup

    def _expr(self, e: A.Expr, rule: Rule, keys: np.ndarray, memo: dict[int, np.ndarray]) -> Any:
        if not isinstance(e, A.Agg):
            return super()._expr(e, rule, keys, memo)
        i = rule.plan.agg_id(e)
        v = memo.get(i)
        if v is None:
            v = memo[i] = self._shared(rule, i, keys)
        return v

    def _shared(self, rule: Rule, i: int, keys: np.ndarray) -> np.ndarray:
        """Aggregate ``i`` of ``rule`` at ``keys``, gathered from its values over the domain."""
        spec, s = rule.plan.aggs[i], rule.agg_structs[i]
        sig = (id(s), spec.func, _window_sig(spec.window))
        got = self._values.get(sig)
        if got is None:
            dom = self.domain(rule.state, self._widest.get(sig, rule.plan.domain_ms))
            got = self._values[sig] = (dom, self._agg(spec, s, dom))
            self.computed += 1
        dom, vals = got
        pos = np.minimum(np.searchsorted(dom, keys), max(dom.shape[0] - 1, 0))
        if dom.shape[0] and np.array_equal(dom[pos], keys):
            return vals[pos]
        return self._agg(spec, s, keys)  # not inside the domain (never expected): read them


class ScanEvaluator(Evaluator):
    """An :class:`Evaluator` without collective indexes whose lookups share every distinct
    aggregate across rules (:class:`ScanLookup`); ``stats["aggregates"]`` counts them."""

    def __init__(self, *, ci_p: int, history_ms: int | None = None, pane_ms: int | None = None) -> None:
        super().__init__("naive", ci_p=ci_p, history_ms=history_ms, pane_ms=pane_ms)
        self.stats["aggregates"] = 0
        self._widest_of: tuple[tuple[int, int], dict[tuple[Any, ...], int | None]] | None = None

    def _widest(self) -> dict[tuple[Any, ...], int | None]:
        """Per distinct aggregate, the longest domain window of the rules reading it (None: a
        rule with only ROWS windows reads it, every key); rebuilt when the rules change."""
        version = (len(self.rules), self._uid)
        if self._widest_of is not None and self._widest_of[0] == version:
            return self._widest_of[1]
        out: dict[tuple[Any, ...], int | None] = {}
        for rule in self.rules.values():
            w = rule.plan.domain_ms
            for i, spec in enumerate(rule.plan.aggs):
                sig = (id(rule.agg_structs[i]), spec.func, _window_sig(spec.window))
                if sig not in out:
                    out[sig] = w
                elif out[sig] is not None:
                    cur = out[sig]
                    out[sig] = None if w is None else max(w, cur)  # type: ignore[type-var]
        self._widest_of = (version, out)
        return out

    def step(self, now: int, skip: frozenset[str] = frozenset()) -> Changes:
        """:meth:`Evaluator.step` with the aggregates shared across rules (the rules of ``skip``
        not looked up, their change state untouched)."""
        self.stats["lookups"] += 1
        ctx = ScanLookup(self, now, self._widest())
        changes = Changes(now)
        for rule in self.rules.values():
            if rule.name in skip:
                continue
            cur = ctx.evaluate(rule)
            enter = sorted_diff(cur, rule.prev)
            exit_ = sorted_diff(rule.prev, cur)
            for ids, kind in ((enter, "ENTER"), (exit_, "EXIT")):
                if ids.shape[0]:
                    changes.add(
                        np.full(ids.shape[0], rule.name, dtype=object), rule.state.key_values(ids), kind
                    )
            rule.prev = cur
        self.stats["aggregates"] += ctx.computed
        self._maybe_expire(now)
        return changes
