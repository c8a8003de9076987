"""One lookup of the evaluator: rules evaluated at one ``now`` over the shared state.

``strategy="shared"`` answers a rule with a driver (see :mod:`subscriptions.compiler`) from the
collective index candidates of its driving atom(s) -- CI-COUNT / CI-SUM lookups (Arasu & Widom
2004, sections 4.1-4.2, Figure 7) -- followed by an exact post-check of the whole condition;
candidates the index proves (``CICount.lookup``'s ``sure`` mask) skip the post-check when the
driving atom is the condition or one of its top-level disjuncts.  ``strategy="naive"``
evaluates the rule on every key of its key domain (every key with an event in the window, from
the domain R-INT) from the same per-key structures.  Both give identical answers.

The condition (NNF, :mod:`subscriptions.compiler`) is evaluated vectorized over key arrays;
every aggregate is read from its shared structure once per lookup and rule (memoized).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.evaluation.batches import EMPTY, compare, sorted_diff
from engine.evaluation.rules import Rule
from engine.evaluation.state import KeyState, Structure
from subscriptions import rule_ast as A
from subscriptions.compiler import AggSpec, Atom

if TYPE_CHECKING:
    from engine.evaluation.evaluator import Evaluator


class Lookup:
    """Evaluation of rules at one ``now``: aggregates over key arrays, the NNF condition."""

    def __init__(self, ev: Evaluator, now: int) -> None:
        self.ev = ev
        self.now = now
        self._domains: dict[tuple[int, int | None], np.ndarray] = {}

    def domain(self, st: KeyState, W: int | None) -> np.ndarray:
        """Key ids with >= 1 event (before WHERE) in (now - W, now]; every key seen if W is None."""
        k = (id(st), W)
        d = self._domains.get(k)
        if d is None:
            K = len(st.interner)
            allk = np.arange(K, dtype=np.int64)
            if W is None:
                d = allk
            else:
                cnt, _ = st.domains[st.feed_raw(W)].window(allk, self.now - W, self.now)
                d = allk[cnt > 0]
            self._domains[k] = d
        return d

    def evaluate(self, rule: Rule) -> np.ndarray:
        """Sorted key ids satisfying the rule at now."""
        plan = rule.plan
        proven = EMPTY
        if self.ev.strategy == "shared" and plan.driver:
            # a key the index proves in a driving atom that is the condition itself or one of its
            # top-level disjuncts satisfies the rule: only the other candidates are post-checked
            top = [plan.cond] if plan.cond[0] == "atom" else plan.cond[1] if plan.cond[0] == "or" else []
            direct = {n[1] for n in top if n[0] == "atom"}
            cands, sure = [], []
            for i in plan.driver:
                a = plan.atoms[i]
                c, s = rule.index_structs[i].obj.lookup(
                    a.window_ms, self.now, a.lo, a.hi, a.lo_strict, a.hi_strict
                )
                cands.append(c)
                if i in direct and s.any():
                    sure.append(c[s])
            keys = cands[0] if len(cands) == 1 else np.unique(np.concatenate(cands))
            keys = np.sort(keys)
            if sure:
                proven = np.unique(np.concatenate(sure))
                keys = sorted_diff(keys, proven)
            # no domain check: a key satisfying the rule satisfies a driving atom, so it has an
            # event in that atom's window, which lies inside (now - W, now]
            self.ev.stats["candidates"] += int(keys.shape[0] + proven.shape[0])
        else:
            keys = self.domain(rule.state, plan.domain_ms)
        if keys.shape[0] == 0:
            return proven
        self.ev.stats["post_checked"] += int(keys.shape[0])
        memo: dict[int, np.ndarray] = {}
        ok = self._cond(plan.cond, rule, keys, memo)
        if proven.shape[0] == 0:
            return keys[ok]
        return np.union1d(keys[ok], proven)

    # --- the condition, vectorized over keys
    def _cond(self, n: Any, rule: Rule, keys: np.ndarray, memo: dict[int, np.ndarray]) -> np.ndarray:
        if n[0] == "atom":
            return self._atom(rule.plan.atoms[n[1]], rule, keys, memo)
        parts = n[1]
        if n[0] == "and":
            out = self._cond(parts[0], rule, keys, memo)
            for p in parts[1:]:
                if not out.any():
                    break
                out = out & self._cond(p, rule, keys, memo)
            return out
        out = self._cond(parts[0], rule, keys, memo)
        for p in parts[1:]:
            if out.all():
                break
            out = out | self._cond(p, rule, keys, memo)
        return out

    def _atom(self, a: Atom, rule: Rule, keys: np.ndarray, memo: dict[int, np.ndarray]) -> np.ndarray:
        left = self._expr(a.left, rule, keys, memo)
        right = self._expr(a.right, rule, keys, memo)
        with np.errstate(invalid="ignore"):
            r = compare(left, a.op, right)
            if a.op == "!=":
                r = r & ~np.isnan(left) & ~np.isnan(right)
        r = np.broadcast_to(np.asarray(r, dtype=bool), keys.shape)
        return ~r if a.negated else r.copy()

    def _expr(self, e: A.Expr, rule: Rule, keys: np.ndarray, memo: dict[int, np.ndarray]) -> Any:
        if isinstance(e, A.Num):
            return np.float64(e.value)
        if isinstance(e, A.Agg):
            i = rule.plan.agg_id(e)
            v = memo.get(i)
            if v is None:
                v = self._agg(rule.plan.aggs[i], rule.agg_structs[i], keys)
                memo[i] = v
            return v
        if isinstance(e, A.Neg):
            return -self._expr(e.operand, rule, keys, memo)
        if isinstance(e, A.BinOp):
            x = self._expr(e.left, rule, keys, memo)
            y = self._expr(e.right, rule, keys, memo)
            with np.errstate(all="ignore"):
                if e.op == "+":
                    return x + y
                if e.op == "-":
                    return x - y
                if e.op == "*":
                    return x * y
                y = np.asarray(y, dtype=np.float64)
                return np.where(y == 0, np.nan, np.asarray(x, dtype=np.float64) / np.where(y == 0, 1.0, y))
        raise TypeError(e)

    def _agg(self, spec: AggSpec, s: Structure, keys: np.ndarray) -> np.ndarray:
        return aggregate_at(spec, s, keys, self.now)

    def read_over(
        self, s: Structure, specs: Sequence[AggSpec], which: np.ndarray, keys: np.ndarray
    ) -> np.ndarray:
        """``specs[which[i]]`` of key id ``keys[i]`` at ``now`` (float64; NaN for NULL), for
        aggregates of one structure ``s`` and one function whose windows are all time windows or
        all ROWS windows: one read with per-key bounds (:func:`aggregate_over`) instead of one
        per aggregate -- what a group's extra atoms read (:meth:`ExtraChecks.check
        <engine.evaluation.rules.ExtraChecks.check>`)."""
        wins = [sp.window for sp in specs]
        if isinstance(wins[0], A.RowsWindow):
            n = np.array([w.n for w in wins], np.int64)  # type: ignore[union-attr]
            return aggregate_over(specs[0].func, s, keys, n=n[which])
        start = np.array([w.start_ms for w in wins], np.int64)  # type: ignore[union-attr]
        end = np.array([w.end_ms for w in wins], np.int64)  # type: ignore[union-attr]
        return aggregate_over(specs[0].func, s, keys, lo=self.now - start[which], hi=self.now - end[which])


def aggregate_at(spec: AggSpec, s: Structure, keys: np.ndarray, now: int | np.ndarray) -> np.ndarray:
    """The aggregate ``spec`` read from its structure ``s`` for each key id of ``keys`` at ``now``
    (float64; NaN for NULL): a lookup's read, and -- with ``now`` an array aligned with ``keys``
    -- one key's value at many lookup times in one call (:mod:`engine.evaluation.key_series`)."""
    w = spec.window
    if isinstance(w, A.RowsWindow):
        return aggregate_over(spec.func, s, keys, n=w.n)
    return aggregate_over(spec.func, s, keys, lo=now - w.start_ms, hi=now - w.end_ms)  # type: ignore[union-attr]


def aggregate_over(
    func: str, s: Structure, keys: np.ndarray, lo: Any = None, hi: Any = None, n: Any = None
) -> np.ndarray:
    """The aggregate ``func`` of structure ``s`` for each key id of ``keys`` (float64; NaN for
    NULL) over its rows with ``lo < ts <= hi`` -- or, with ``n``, over its last ``n`` rows (a
    ``LAST n ROWS`` window) --, each bound a scalar or an array aligned with ``keys``: one call
    reads one structure's aggregate over many windows (:func:`aggregate_at` is one window; the
    alerts' values read every window of a structure at once, :mod:`engine.evaluation.alert_values`)."""
    obj = s.obj
    rows = n is not None
    f = func
    if f == "COUNT":
        cnt, _ = obj.rows(keys, n) if rows else obj.window(keys, lo, hi)
        return cnt.astype(np.float64)  # type: ignore[no-any-return]
    if f in ("SUM", "AVG"):
        cnt, sums = obj.rows(keys, n) if rows else obj.window(keys, lo, hi)
        tot = sums[:, 0].astype(np.float64)
        if f == "SUM":
            return tot  # type: ignore[no-any-return]
        with np.errstate(all="ignore"):
            return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)
    if f in ("FIRST", "LAST"):
        col = s.first_col if f == "FIRST" else s.last_col
        first, last = obj.first_last_rows(keys, n, col) if rows else obj.first_last(keys, lo, hi, col)
        return first if f == "FIRST" else last  # type: ignore[no-any-return]
    if f in ("MIN", "MAX"):
        mn, mx = obj.rows(keys, n) if rows else obj.window(keys, lo, hi)
        return mn if f == "MIN" else mx  # type: ignore[no-any-return]
    if f == "DISTINCT":
        d = obj.rows(keys, n) if rows else obj.window(keys, lo, hi)
        return np.asarray(d, dtype=np.float64)
    raise ValueError(f)
