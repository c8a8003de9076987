"""One key's aggregates over time, from the evaluator's retained history (the key page's charts).

:func:`key_series` answers "what did each aggregate of this rule read for this key at every
pane boundary of the rule's window?" -- the points the dashboard charts against the rule's
thresholds.  Pure: no I/O, nothing of the evaluator it reads is changed.

How (exactly what the rule evaluates, by construction): the key's rows are taken from the
retained units of the rule's stream (:meth:`engine.evaluation.evaluator.Evaluator.retained`:
pane rows per key field, or raw columns), fed into a private one-rule
:class:`~engine.evaluation.evaluator.Evaluator` with the same pane width (the same structures,
WHERE and FILTER applied the same way), and every aggregate is read at all lookup times in one
vectorized call per aggregate (:func:`engine.evaluation.lookup.aggregate_at`, the read a lookup
makes, with one lookup time per point).  Work is proportional to the key's rows in the retained
history; no Python loop per row or per point.

What is held: the history keeps the last max(``engine_history_ms``, the longest time window
in use on the stream) (:mod:`engine.evaluation.history`).  Every event with ``ts >
held_from`` is held; a point whose window ``(t - n, t - m]`` starts before ``held_from`` is
computed from part of its window and marked ``partial`` -- never silently wrong.  ``held_from``
is the lower bound of the oldest retained unit's span when units carry spans (the engine's
executors mode), else the key's oldest held pane (per key, timestamps never decrease across
batches, so nothing of the key before it is held); a retained unit that cannot feed the rule
(pane rows of an older pane spec, without raw events) moves it up to that unit's newest event.
Windows of ``LAST n ROWS`` -- and time windows that are not multiples of the pane -- are read
from raw events, which the engine keeps only in some modes: when a retained unit lacks them,
that aggregate is not charted and says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.evaluation.batches import BatchView, Unit
from engine.evaluation.evaluator import Evaluator
from engine.evaluation.lookup import aggregate_at
from engine.evaluation.panes import ColumnSet, PaneAggregates, PaneRows
from subscriptions import rule_ast as A
from subscriptions.compiler import Plan

#: the name of the one rule of the private evaluator
_RULE = "chart"
#: reason codes of an aggregate that is not charted
NEEDS_RAW = "needs_raw_events"


def chart_times(t_from: int, t_to: int, pane_ms: int, max_points: int = 600) -> np.ndarray:
    """Pane-aligned lookup times in ``[t_from, t_to]``, thinned to at most ``max_points`` (a
    whole number of panes apart, the newest time always among them)."""
    first = -(-t_from // pane_ms) * pane_ms
    last = t_to // pane_ms * pane_ms
    if last < first:
        return np.zeros(0, np.int64)
    n = (last - first) // pane_ms + 1
    step = max(1, -(-n // max_points))
    return (last - np.arange(0, n, step, dtype=np.int64)[::-1] * pane_ms).astype(np.int64)


def window_ms(plan: Plan) -> int:
    """How far back the rule's time windows read (their longest ``n``; 0 with ROWS windows only)."""
    return max((a.window.start_ms for a in plan.aggs if isinstance(a.window, A.TimeWindow)), default=0)


@dataclass(frozen=True)
class AggregateSeries:
    """One aggregate of the rule over the lookup times: ``values`` (float64, NaN for NULL) and
    ``partial`` (its window starts before what is held); ``reason`` (a code, e.g.
    :data:`NEEDS_RAW`) when it is not charted, and then both arrays are empty."""

    text: str
    values: np.ndarray
    partial: np.ndarray
    reason: str | None = None


@dataclass(frozen=True)
class KeySeries:
    """The answer of :func:`key_series`: lookup times (epoch ms, ascending, at most
    ``max_points``), the series of each aggregate (in the plan's order), ``held_from`` (every
    event of the key with ``ts > held_from`` is held; None: nothing of it is) and ``until`` (the
    last lookup time)."""

    until: int
    times: np.ndarray
    held_from: int | None
    aggregates: list[AggregateSeries]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: times as ints, NULL as None, partial as bools."""

        def vals(v: np.ndarray) -> list[float | None]:
            return [None if np.isnan(x) else float(x) for x in v.tolist()]

        return {
            "until": int(self.until),
            "held_from": None if self.held_from is None else int(self.held_from),
            "times": [int(t) for t in self.times.tolist()],
            "aggregates": [
                {"text": a.text, "values": vals(a.values), "partial": [bool(p) for p in a.partial.tolist()]}
                | ({"reason": a.reason} if a.reason else {})
                for a in self.aggregates
            ],
        }


def _serves(rows: PaneRows, sets: Sequence[ColumnSet]) -> bool:
    """Whether ``rows`` hold every aggregate the column sets ask for."""
    for cs in sets:
        agg = rows.sets.get(cs.name)
        if agg is None:
            return False
        if not (
            set(cs.sums) <= set(agg.sums)
            and set(cs.minmax) <= set(agg.mins)
            and set(cs.firstlast) <= set(agg.first)
            and set(cs.distinct) <= set(agg.distinct)
        ):
            return False
    return True


def _key_rows(rows: PaneRows, key: Any, sets: Sequence[ColumnSet]) -> PaneRows | None:
    """The rows of one key (only the column sets and fields asked for); None when it has none."""
    idx = np.flatnonzero(np.asarray(rows.keys, dtype=object) == key)
    if idx.shape[0] == 0:
        return None
    pos = np.full(len(rows), -1, np.int64)
    pos[idx] = np.arange(idx.shape[0])
    out: dict[str, PaneAggregates] = {}
    for cs in sets:
        a = rows.sets[cs.name]
        b = PaneAggregates(count=a.count[idx])
        for f in cs.sums:
            b.sums[f] = a.sums[f][idx]
            b.exact[f] = (a.exact[f][0][idx], a.exact[f][1][idx])
        for f in cs.minmax:
            b.mins[f], b.maxs[f] = a.mins[f][idx], a.maxs[f][idx]
        for f in cs.firstlast:
            b.first[f], b.last[f] = a.first[f][idx], a.last[f][idx]
        for f in cs.distinct:
            r, v, m = a.distinct[f]
            keep = pos[r] >= 0
            b.distinct[f] = (pos[r[keep]], v[keep], m[keep])
        out[cs.name] = b
    return PaneRows(keys=rows.keys[idx], pane=rows.pane[idx], total=rows.total[idx], sets=out)


def _concat_rows(parts: list[PaneRows]) -> PaneRows:
    """Pane rows of one key from consecutive units, as one :class:`PaneRows` (in unit order)."""
    if len(parts) == 1:
        return parts[0]
    offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
    sets: dict[str, PaneAggregates] = {}
    for name, first in parts[0].sets.items():
        aggs = [p.sets[name] for p in parts]
        b = PaneAggregates(count=np.concatenate([a.count for a in aggs]))
        for f in first.sums:
            b.sums[f] = np.concatenate([a.sums[f] for a in aggs])
            b.exact[f] = (
                np.concatenate([a.exact[f][0] for a in aggs]),
                np.concatenate([a.exact[f][1] for a in aggs]),
            )
        for f in first.mins:
            b.mins[f] = np.concatenate([a.mins[f] for a in aggs])
            b.maxs[f] = np.concatenate([a.maxs[f] for a in aggs])
        for f in first.first:
            b.first[f] = np.concatenate([a.first[f] for a in aggs])
            b.last[f] = np.concatenate([a.last[f] for a in aggs])
        for f in first.distinct:
            b.distinct[f] = (
                np.concatenate([a.distinct[f][0] + o for a, o in zip(aggs, offsets, strict=True)]),
                np.concatenate([a.distinct[f][1] for a in aggs]),
                np.concatenate([a.distinct[f][2] for a in aggs]),
            )
        sets[name] = b
    return PaneRows(
        keys=np.concatenate([p.keys for p in parts]),
        pane=np.concatenate([p.pane for p in parts]),
        total=np.concatenate([p.total for p in parts]),
        sets=sets,
    )


def key_series(
    units: Sequence[Unit],
    plan: Plan,
    key: str,
    until: int,
    pane_ms: int,
    *,
    max_points: int = 600,
) -> KeySeries:
    """Each aggregate of ``plan`` for ``key`` at the pane-aligned lookup times of the rule's
    window ``(until - W, until]`` (W: its longest time window, at least one pane), from the
    retained ``units`` of the plan's stream (oldest first, as
    :meth:`~engine.evaluation.evaluator.Evaluator.retained` gives them) -- see the module
    docstring for what is exact and what is marked partial.  ``until``: the engine's last lookup
    time (``applied_until``); ``pane_ms``: the evaluator's pane width."""
    ev = Evaluator("naive", ci_p=2, pane_ms=pane_ms)  # naive: no collective index to build
    ev.add_rule(_RULE, plan)
    st = ev.states[(plan.stream, plan.key)]
    sets = ev.pane_spec(plan.stream, plan.key).column_sets
    raw_ids = {a.id for a in plan.aggs if st.feed_raw(a.window)}
    all_raw = all(u.raw is not None for u in units)
    bound: int | None = None  # nothing at or before it is held for sure
    spans = units[0].span if units else None
    fed: list[tuple[str, Any]] = []  # ("raw", columns) / ("rows", PaneRows), oldest first
    for u in units:
        if u.raw is not None:
            sel = np.flatnonzero(np.asarray(u.raw[plan.key], dtype=object) == key)
            if sel.shape[0]:
                fed.append(("raw", {k: np.asarray(v)[sel] for k, v in u.raw.items()}))
            continue
        rows = u.rows.get(plan.key)
        if rows is None or not _serves(rows, sets):
            # a unit that cannot feed the rule: what came before it is not held
            fed.clear()
            bound = u.max_ts() if bound is None else max(bound, u.max_ts())
            continue
        mine = _key_rows(rows, key, sets)
        if mine is not None:
            fed.append(("rows", mine))
    i = 0
    while i < len(fed):  # consecutive pieces of one kind in one call
        kind = fed[i][0]
        j = i
        while j < len(fed) and fed[j][0] == kind:
            j += 1
        group = [p for _, p in fed[i:j]]
        if kind == "raw":
            ev.apply(plan.stream, {k: np.concatenate([g[k] for g in group]) for k in group[0]})
        else:
            ev.apply_panes(plan.stream, _concat_rows(group), key=plan.key)
        i = j
    held = _held_from(spans, fed, pane_ms, bound, units)
    g = pane_ms
    w = max(window_ms(plan), g)
    taus = chart_times(until - w + g, until, g, max_points)
    kid = st._ids.get(key, len(st.interner))  # a key never seen reads as empty windows
    ids = np.full(taus.shape[0], kid, np.int64)
    rule = ev.rules[_RULE]
    out: list[AggregateSeries] = []
    for spec in plan.aggs:
        if spec.id in raw_ids and not all_raw:
            out.append(AggregateSeries(spec.text, np.zeros(0), np.zeros(0, bool), NEEDS_RAW))
            continue
        vals = np.asarray(aggregate_at(spec, rule.agg_structs[spec.id], ids, taus), np.float64)
        if isinstance(spec.window, A.TimeWindow):
            partial = np.zeros(taus.shape[0], bool) if held is None else taus - spec.window.start_ms < held
        else:  # LAST n ROWS: whole when n rows of the key satisfying its predicate are held at t
            partial = (
                _rows_held(plan.stream, [p for k, p in fed if k == "raw"], spec.predicate, taus)
                < spec.window.n
            )
        out.append(AggregateSeries(spec.text, vals, np.asarray(partial, bool)))
    return KeySeries(until, taus, held, out)


def _rows_held(
    stream: str, pieces: list[dict[str, np.ndarray]], pred: A.RowCond | None, taus: np.ndarray
) -> np.ndarray:
    """How many held raw rows (of one key) satisfying ``pred`` have ``ts <= t``, per lookup time."""
    if not pieces:
        return np.zeros(taus.shape[0], np.int64)
    cols = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
    mask = BatchView(stream, cols).mask(pred)
    ts = np.sort(np.asarray(cols["ts"], np.int64) if mask is None else np.asarray(cols["ts"], np.int64)[mask])
    return np.searchsorted(ts, taus, side="right").astype(np.int64)


def _held_from(
    span: tuple[int, int] | None, fed: list[tuple[str, Any]], g: int, bound: int | None, units: Sequence[Unit]
) -> int | None:
    """See the module docstring: the bound after which every event of the key is held."""
    if span is not None:
        base: int | None = int(span[0])
    elif fed:
        kind, first = fed[0]
        base = int(np.min(first["ts"])) if kind == "raw" else int(np.min(first.pane))
    else:  # nothing of the key held: only the newest unit's end bounds it
        base = max((u.max_ts() for u in units), default=None)
    if bound is not None:
        base = bound if base is None else max(base, bound)
    return base
