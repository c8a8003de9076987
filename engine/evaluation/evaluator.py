"""The evaluator: many standing rules over shared window state (the code the engine and the
backtest both run).

:class:`Evaluator` is the entry point: rules are added and removed at any time
(:meth:`Evaluator.add_rule`, :meth:`Evaluator.remove_rule`), micro-batches applied
(:meth:`Evaluator.apply`, :meth:`Evaluator.apply_panes`), and every rule looked up at a time
``now`` (:meth:`Evaluator.step`: the changes of each rule's result since its previous lookup;
:meth:`Evaluator.lookup`: the whole results), with the values that made a rule fire
(:meth:`Evaluator.values_many`).  The parts live next to it:

* :mod:`engine.evaluation.batches` -- a micro-batch and its predicate masks, the pane spec,
  the kernels of group lookups;
* :mod:`engine.evaluation.state` -- the shared state, never per rule (Arasu & Widom 2004,
  sections 3-4): per (stream, key field) a :class:`engine.evaluation.state.KeyState` with the
  key interner and a domain R-INT of every event (before WHERE) for the key domain of
  RULES.md; per (predicate = WHERE AND FILTER, attribute, kind) one structure -- R-INT counts,
  R-INT running sums and values (SUM/AVG/FIRST/LAST), MIN/MAX, COUNT DISTINCT -- serving every
  rule that needs it; per (predicate, attribute) one collective index, CI-COUNT or CI-SUM,
  serving every indexable atom on it (any window, any threshold);
* :mod:`engine.evaluation.rules` -- the rules, the groups of threshold rules looked up
  together, a lookup's changes;
* :mod:`engine.evaluation.lookup` -- one lookup: index candidates and the exact post-check.

``strategy="shared"`` answers a rule with a driver (see :mod:`subscriptions.compiler`) from the
index candidates of its driving atom(s) followed by an exact post-check of the whole
condition; rules that are a single threshold atom and share (index, window) are looked up
together (one index lookup at the loosest threshold, then one Numba pass: exact values,
per-rule ranges, changes), and so are rules ``driver AND further aggregate-vs-constant atoms``
(the group's (rule, key) pairs of the driver are then filtered by the other atoms, each distinct
aggregate read once for the keys of all rules using it -- Arasu & Widom's sharing carried over
to the post-check); candidates the index proves (``CICount.lookup``'s ``sure`` mask) skip
the post-check when the driving atom is the condition or one of its top-level disjuncts.
``strategy="naive"`` evaluates every rule, one by one, on every key of its key domain from the
same per-key structures, with no collective index.  Both give identical answers.

Batches are dicts of NumPy columns (one micro-batch); within a batch rows may come in any order,
across batches each key's timestamps must not decrease.  With ``pane_ms=g`` the structures of
time windows that are multiples of g are fed one row per (key, pane) -- Golab et al. 2003's basic
windows, as multiplicities (Arasu & Widom 2004, section 4.2) -- either pre-aggregated here
(:meth:`Evaluator.apply`) or given as :class:`engine.evaluation.panes.PaneRows` (:meth:`Evaluator.apply_panes`,
see :meth:`Evaluator.pane_spec`); answers are identical to raw events for lookups at pane
boundaries.  New rules are evaluated against the state already held (PSoup, Chandrasekaran &
Franklin 2002): structures a new rule needs that do not exist yet, or that were expired to a
shorter horizon than it reads, are (re)built from the retained history.

Retention is bounded by the windows in use, ROWS windows included (Arasu & Widom 2004, section
2: a tuple-based window ``S_k[N, 0]`` is the last N tuples of substream k):

* a structure keeps the rows of its longest time window and, while ``LAST n ROWS`` windows read
  it, each key's newest n_max rows (:meth:`engine.evaluation.state.Structure.expire`) -- every
  rule in use stays exact;
* the raw history (:class:`engine.evaluation.history.History`) keeps the batches of the last
  max(``history_ms``, longest time window in use) and, for each (key field, predicate) read by
  ROWS windows, each key's newest n_max rows satisfying the predicate.

A rule added later therefore sees, per key, the rows inside that time retention plus the newest
n_max rows of each (key field, predicate) already read by a ROWS window.  It is exact at once when
its windows lie inside what is held (a time window within the retention; a ``LAST n ROWS`` window
with n <= the n_max of a ROWS window in use on the same key field and predicate, or whose rows are
all inside the time retention), else once its window has refilled (n new rows of the key, or its
time span).  A structure in use that a new rule reads further back is rebuilt from the history,
which holds at least what its rules read.  A rule with only ROWS windows has as key domain every
key seen since its key field came into use (a key field new to the rules: the keys of the rows held).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from engine.algorithms import RInt
from engine.evaluation import alert_values
from engine.evaluation.batches import (
    EMPTY,
    SHIFT,
    BatchView,
    EvalPaneSpec,
    Unit,
    group_pass,
    pair_diff,
    sorted_diff,
)
from engine.evaluation.history import History
from engine.evaluation.lookup import Lookup
from engine.evaluation.panes import ColumnSet, PaneRows, PaneSpec, aggregate, pane_of
from engine.evaluation.reach import Reach, forget_reach, reach_for
from engine.evaluation.rules import Changes, Group, Rule, extra_atoms, loose_rules
from engine.evaluation.state import KeyState, Structure, set_name
from subscriptions import rule_ast as A
from subscriptions.compiler import AggSpec, Plan
from tidewatch.schema import STREAMS

#: ``history(stream, lo, hi)``: the stream's events applied with ``lo < ts <= hi``, as columns
#: sorted by ts (ties in arrival order), or None -- where a rule added later is filled from when
#: the retained units hold pane rows only (their ``span``; :mod:`engine.executors.history`)
HistorySource = Callable[[str, int, int], "dict[str, np.ndarray] | None"]

#: the pane-row aggregates each kind of pane-fed structure reads, by attribute
_POOL = {"ci_sum": "sums", "values": "sums", "firstlast": "first", "minmax": "mins", "distinct": "distinct"}


def _covers(rows: PaneRows | None, s: Structure) -> bool:
    """Whether ``rows`` hold what the pane-fed structure ``s`` is filled from."""
    agg = None if rows is None else rows.sets.get(set_name(s.predicate))
    if agg is None:
        return False
    pool = _POOL.get(s.kind)
    return pool is None or s.attr in getattr(agg, pool)


class Evaluator:
    """Long-lived evaluator of many rules over shared window state (see module docstring).

    ``ci_p``: the parameter p of the CI-COUNT / CI-SUM indexes (Arasu & Widom 2004, section
    4.1.2; ``Settings.ci_p``): it trades index size against candidates, the answers are exact.

    ``history_ms``: how long raw batches are retained so that rules added later can build
    structures nobody had (PSoup); at least the longest time window in use (``None``: exactly
    that), plus the newest rows per key ROWS windows in use can read (module docstring).

    ``pane_ms``: with a pane width g, structures serving time windows whose bounds are multiples
    of g are fed one row per (key, pane) instead of one per event (Golab et al. 2003's basic
    windows; rows with multiplicities, Arasu & Widom 2004 section 4.2): answers are identical
    to raw events for lookups at pane boundaries (``now`` a multiple of g). ROWS windows and
    windows that are not multiples of g keep structures fed with raw events.
    """

    def __init__(
        self,
        strategy: str = "shared",
        *,
        ci_p: int,
        history_ms: int | None = None,
        pane_ms: int | None = None,
    ) -> None:
        if strategy not in ("shared", "naive"):
            raise ValueError("strategy must be 'shared' or 'naive'")
        self.strategy = strategy
        self.ci_p = int(ci_p)
        self.history_ms = history_ms
        if pane_ms is not None and pane_ms <= 0:
            raise ValueError("pane_ms must be a positive number of milliseconds")
        self.pane_ms = pane_ms
        self.states: dict[tuple[str, str], KeyState] = {}
        self.rules: dict[str, Rule] = {}
        self.groups: dict[tuple[Any, ...], Group] = {}
        self._uid = 0
        #: per stream, retained input in arrival order (raw columns and / or pane rows)
        self._history = History()
        self._max_ts: dict[str, int] = {}
        self._last_expire: int | None = None
        self.stats = {"events": 0, "lookups": 0, "candidates": 0, "post_checked": 0}

    # ------------------------------------------------------------ rules
    def add_rule(self, name: str, plan: Plan, history: HistorySource | None = None) -> None:
        """Register a rule; structures it needs and nobody had are filled from retained history
        (``history``: where the events of units retained as pane rows only are read from)."""
        if name in self.rules:
            raise ValueError(f"rule {name!r} already exists")
        forget_reach(self)  # the structures' users change below
        st = self.states.get((plan.stream, plan.key))
        if st is None:
            st = KeyState(plan.stream, plan.key, self.ci_p, self.pane_ms)
            self.states[(plan.stream, plan.key)] = st
            new_state = True
        else:
            new_state = False
        dom_raw = st.feed_raw(plan.domain_ms)
        expired = self._last_expire is not None  # rows older than the horizons in use may be gone
        needs_domain = plan.domain_ms is not None and (self.strategy == "naive" or not plan.driver)
        domain_fresh = needs_domain and not st.domain_live[dom_raw] and not new_state
        # the longest domain window read so far (only needed, and only scanned, when the
        # domain R-INT is live and may have been expired: no O(rules) scan per added rule)
        longer = (
            needs_domain
            and st.domain_live[dom_raw]
            and expired
            and plan.domain_ms is not None
            and plan.domain_ms
            > max(
                (
                    w
                    for n, w in st.domain_users.items()
                    if w is not None and st.domain_readers.get(n) == dom_raw
                ),
                default=0,
            )
        )
        st.domain_users[name] = plan.domain_ms
        st.domain_readers[name] = dom_raw
        if longer:
            # a longer domain window than the expired R-INT kept: rebuild it from history
            st.domains[dom_raw] = RInt(0)
            domain_fresh = True
        if needs_domain:
            st.domain_live[dom_raw] = True
        fresh: list[Structure] = []

        def use(kind: str, pred: A.RowCond | None, attr: str, window: A.Window | int) -> Structure:
            s, created = st.struct(kind, pred, attr, st.feed_raw(window))
            if created:
                fresh.append(s)
            elif expired and all(s is not f for f in fresh):
                if isinstance(window, A.RowsWindow):
                    # a ROWS window reads the key's last n rows however old: the structure kept
                    # only its time horizon and the newest rows_keep() rows per key
                    longer = window.n > (s.rows_keep() or 0)
                else:
                    w = window.start_ms if isinstance(window, A.TimeWindow) else int(window)
                    longer = w > s.horizon()
                if longer:
                    # the structure was expired to a shorter horizon: rebuild it from history
                    s.obj = st.new_obj(s.kind, s.attr, s.raw)
                    fresh.append(s)
            if isinstance(window, A.RowsWindow):
                s.rows_n[name] = max(s.rows_n.get(name, 0), int(window.n))
                s.users.setdefault(name, 0)
            else:
                w = window.start_ms if isinstance(window, A.TimeWindow) else int(window)
                s.users[name] = max(s.users.get(name, 0), w)
            return s

        def kind_of(a: AggSpec) -> str:
            kind = a.structure[0]
            if kind == "values" and a.func in ("FIRST", "LAST") and not st.feed_raw(a.window):
                return "firstlast"  # pane sums cannot give FIRST / LAST: the panes' own values
            return kind

        agg_structs = [use(kind_of(a), a.predicate, a.structure[2], a.window) for a in plan.aggs]
        index_structs: dict[int, Structure] = {}
        if self.strategy == "shared":
            for i in plan.driver:
                atom = plan.atoms[i]
                assert atom.index is not None
                kind, _, attr = atom.index
                pred = plan.aggs[atom.agg_id].predicate  # type: ignore[index]
                index_structs[i] = use("ci_" + kind, pred, attr, atom.window_ms)
        self._uid += 1
        rule = Rule(name, plan, self._uid, st, agg_structs, index_structs)
        self.rules[name] = rule
        alert_values.forget_plan(self)
        if fresh or new_state or domain_fresh:
            self._replay(st, fresh, new_state, dom_raw if domain_fresh else None, history)
        extra = None if self.strategy != "shared" or plan.single_atom else extra_atoms(plan)
        if self.strategy == "shared" and (plan.single_atom or extra is not None):
            atom = plan.atoms[plan.driver[0]]
            idx = index_structs[atom.id]
            gkey = (plan.stream, plan.key, idx.kind, A.row_text(idx.predicate), idx.attr, atom.window_ms)
            g = self.groups.get(gkey)
            if g is None:
                g = Group(st, idx, agg_structs[atom.agg_id], idx.kind == "ci_sum", atom.window_ms)  # type: ignore[index]
                self.groups[gkey] = g
            g.members[name] = atom
            g.uids[name] = rule.uid
            if extra:
                g.extras[name] = [
                    (agg_structs[plan.agg_id(x)], plan.aggs[plan.agg_id(x)], a)
                    for a in extra
                    for x in (a.left if isinstance(a.left, A.Agg) else a.right,)
                    if isinstance(x, A.Agg)
                ]
            g.arrays = None
            rule.group = gkey

    def add_rules(self, rules: Iterable[tuple[str, Plan]]) -> None:
        """Register many rules; those reading value R-INTs first, so COUNTs can share them."""
        items = list(rules)
        items.sort(key=lambda r: 0 if any(a.structure[0] == "values" for a in r[1].aggs) else 1)
        for name, plan in items:
            self.add_rule(name, plan)

    def remove_rule(self, name: str) -> None:
        """Unregister a rule; structures nobody uses any more are dropped."""
        rule = self.rules.pop(name)
        alert_values.forget_plan(self)
        st = rule.state
        st.domain_users.pop(name, None)
        st.domain_readers.pop(name, None)
        if rule.group is not None:
            g = self.groups[rule.group]
            g.members.pop(name)
            g.extras.pop(name, None)
            g.arrays = None
            uid = g.uids.pop(name)
            g.prev_pairs = g.prev_pairs[(g.prev_pairs >> SHIFT) != uid]
            if not g.members:
                del self.groups[rule.group]
        for k, s in list(st.structs.items()):
            s.users.pop(name, None)
            s.rows_n.pop(name, None)
            if not s.users:
                del st.structs[k]
        if not st.domain_users:
            del self.states[(st.stream, st.key)]
        forget_reach(self)

    def _replay(
        self,
        st: KeyState,
        fresh: list[Structure],
        new_state: bool,
        domain_fresh: bool | None,
        history: HistorySource | None = None,
    ) -> None:
        """PSoup: fill new structures (and a domain R-INT when it starts being read) from the
        retained history (``domain_fresh``: the feed of that domain R-INT, None: none).  Units
        retained as pane rows only (``span``) that cannot feed them are read again, once, from
        ``history``: the events of every retained unit's span, as one unit."""
        if new_state:
            raw_s = pane_s = None  # every structure, and the live domains
            raw_d = pane_d = None
        else:
            raw_s = [s for s in fresh if s.raw]
            pane_s = [s for s in fresh if not s.raw]
            raw_d = domain_fresh is True
            pane_d = domain_fresh is False
        g = self.pane_ms or 1
        if raw_s is None or raw_s or raw_d:
            # raw rows older than the time retention that ROWS windows can read (oldest first)
            for piece in self._history.tail_of(st.stream):
                st.apply(BatchView(st.stream, piece), raw_s, domain=raw_d)
        units = self._history.units_of(st.stream)
        if history is not None:
            units = self._reread(st, units, history, raw_s is None or bool(raw_s) or bool(raw_d), pane_s)
        for unit in units:
            cols = unit.raw
            rows = unit.rows.get(st.key)
            if cols is not None and (raw_s is None or raw_s or raw_d):
                st.apply(BatchView(st.stream, cols), raw_s, domain=raw_d)
            if self.pane_ms is None or not (pane_s is None or pane_s or pane_d):
                continue
            todo = st.pane_structs() if pane_s is None else pane_s
            dom = pane_d if pane_d is not None else st.domain_live[False]
            if rows is None and cols is None:
                continue
            if rows is None:
                assert cols is not None
                rows = aggregate(cols, self._spec(st, BatchView(st.stream, cols), todo), g)
                st.apply_panes(rows, todo, domain=dom)
                continue
            missing = st.apply_panes(rows, todo, domain=dom)
            if missing and cols is not None:
                view = BatchView(st.stream, cols)
                st.apply_panes(aggregate(cols, self._spec(st, view, missing), g), missing, False)
            elif missing:
                self.stats["backfill_missing"] = self.stats.get("backfill_missing", 0) + len(missing)

    def _reread(
        self,
        st: KeyState,
        units: list[Unit],
        history: HistorySource,
        want_raw: bool,
        pane_s: list[Structure] | None,
    ) -> list[Unit]:
        """``units``, or (when some unit without raw events cannot feed what is to be filled)
        one unit of the events of every unit's span, read from ``history``."""
        todo = st.pane_structs() if pane_s is None else pane_s
        short = [
            u
            for u in units
            if u.raw is None
            and u.span is not None
            and (want_raw or any(not _covers(u.rows.get(st.key), s) for s in todo) or pane_s is None)
        ]
        if not short:
            return units
        spans = [u.span for u in units if u.span is not None]
        if len(spans) < len(units):
            return units  # units of another origin: not one span to read
        cols = history(st.stream, min(a for a, _ in spans), max(b for _, b in spans))
        return [] if cols is None or not len(cols["ts"]) else [Unit(cols)]

    def retained(self, stream: str) -> list[Unit]:
        """The retained units of ``stream``, oldest first -- to be read, never changed (the key
        page's charts: :mod:`engine.evaluation.key_series`)."""
        return list(self._history.units_of(stream))

    def history_floor(self, stream: str) -> int | None:
        """The lower bound of the spans of ``stream``'s retained units (events with a larger
        ``ts`` may be read again); None when no unit has a span."""
        spans = [u.span[0] for u in self._history.units_of(stream) if u.span is not None]
        return min(spans) if spans else None

    def note_span(self, stream: str, lo: int, hi: int) -> None:
        """Events of ``stream`` with ``lo < ts <= hi`` were applied though no rule reads the
        stream (executors mode: none of them reached this process): retained as a span, so a
        rule added later is filled from their events read again."""
        self._note(stream, None, hi, hi, n=0)
        self._retain(stream, Unit(None, {}, span=(int(lo), int(hi))))

    # ------------------------------------------------------------ events
    @staticmethod
    def _sorted_cols(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Columns of a batch sorted by ts (stable), ts as int64; None when empty."""
        ts = np.asarray(batch["ts"], dtype=np.int64)
        n = ts.shape[0]
        if n == 0:
            return None
        if n > 1 and np.any(ts[1:] < ts[:-1]):
            order = np.argsort(ts, kind="stable")
            cols = {k: np.asarray(v)[order] for k, v in batch.items()}
        else:
            cols = {k: np.asarray(v) for k, v in batch.items()}
        cols["ts"] = np.asarray(cols["ts"], dtype=np.int64)
        return cols

    def apply(
        self,
        stream: str,
        batch: dict[str, np.ndarray],
        factorized: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
        span: tuple[int, int] | None = None,
    ) -> None:
        """Apply one micro-batch of a stream (columns of equal length; any order within it).

        With panes, the batch is also pre-aggregated into (key, pane) rows
        (:func:`engine.evaluation.panes.aggregate`) for the pane-fed structures. ``factorized``: string
        columns already factorized over a larger input, field -> (codes of the batch's rows,
        the input's uniques), e.g. the backtest's whole file (saves hashing strings per batch).
        ``span``: as for :meth:`apply_panes`."""
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        ts_in = np.asarray(batch["ts"], dtype=np.int64)
        cols = self._sorted_cols(batch)
        if cols is None:
            return
        pre = factorized
        if pre and ts_in.shape[0] > 1 and np.any(ts_in[1:] < ts_in[:-1]):
            order = np.argsort(ts_in, kind="stable")
            pre = {k: (np.asarray(c)[order], u) for k, (c, u) in pre.items()}
        view = BatchView(stream, cols, pre)
        for st in self.states.values():
            if st.stream != stream:
                continue
            if pre and st.key in pre:  # keys factorized over the whole input: its domain size
                st.key_hint = max(st.key_hint, len(pre[st.key][1]))
            st.apply(view)
            if self.pane_ms is not None:
                todo = st.pane_structs()
                if todo or st.domain_live[False]:
                    first, last = pane_of(cols["ts"][[0, -1]], self.pane_ms)
                    if first == last:  # one pane (the backtest, the engine): group by key only
                        rows, ids = st.one_pane_rows(view, todo, int(last))
                        st.apply_panes(rows, todo, domain=st.domain_live[False], ids=ids)
                    else:
                        rows = aggregate(cols, self._spec(st, view, todo), self.pane_ms)
                        st.apply_panes(rows, todo, domain=st.domain_live[False])
        self._note(stream, cols, int(cols["ts"][0]), int(cols["ts"][-1]))
        self._retain(stream, Unit(cols, span=span))

    def apply_panes(
        self,
        stream: str,
        rows: PaneRows,
        key: str | None = None,
        raw: dict[str, np.ndarray] | None = None,
        span: tuple[int, int] | None = None,
    ) -> None:
        """Apply (key, pane) rows built with :meth:`pane_spec` (e.g. by Spark) to the pane-fed
        structures of ``(stream, key)`` (``key`` may be omitted when the stream has one key field
        in use); rows of keys whose events were already applied must have later panes.

        ``raw``: the same events, raw -- required when ``pane_spec(...).needs_raw``; it feeds the
        raw-fed structures of that key field and is retained for rules added later (PSoup:
        without it, structures for predicates no column set aggregates cannot be backfilled).
        Results equal applying the raw events for lookups at pane boundaries.  ``span``: ``(lo,
        hi)``, the rows stand for the events with ``lo < ts <= hi`` (retained with the rows, so
        that without ``raw`` a rule added later can have them read again: :meth:`add_rule`)."""
        if self.pane_ms is None:
            raise ValueError("apply_panes needs an Evaluator(pane_ms=...)")
        st = self._state_of(stream, key)
        if st is None:
            return
        raw_cols = None if raw is None else self._sorted_cols(raw)
        if raw_cols is not None:
            st.apply(BatchView(stream, raw_cols))
        st.apply_panes(rows)
        if rows.key_codes is not None:  # retained without them (the history's memory)
            rows = dataclasses.replace(rows, key_codes=None, key_global=None)
        if len(rows):
            pane = np.asarray(rows.pane, np.int64)
            self._note(stream, None, int(pane.min()), int(pane.max()), n=int(np.asarray(rows.total).sum()))
            last = self._history.newest(stream)
            if raw is not None and last is not None and last.source is raw and st.key not in last.rows:
                last.rows[st.key] = rows  # another key field's rows of the same batch
            elif raw is None and span is not None and last is not None and last.span == span:
                last.rows.setdefault(st.key, rows)  # another key field's rows of the same span
            else:
                self._retain(stream, Unit(raw_cols, {st.key: rows}, raw, span))

    def _state_of(self, stream: str, key: str | None) -> KeyState | None:
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        if key is not None:
            return self.states.get((stream, key))
        mine = [st for st in self.states.values() if st.stream == stream]
        if len(mine) > 1:
            raise ValueError(f"rules use several key fields of {stream}: give key=")
        return mine[0] if mine else None

    def _note(
        self, stream: str, cols: dict[str, np.ndarray] | None, lo: int, hi: int, n: int | None = None
    ) -> None:
        self.stats["events"] += int(cols["ts"].shape[0]) if cols is not None else int(n or 0)
        self._max_ts[stream] = max(self._max_ts.get(stream, lo), hi)

    def _spec(
        self, st: KeyState, view: BatchView | None, structs: Iterable[Structure] | None = None
    ) -> PaneSpec:
        """The pane spec of the given pane-fed structures of ``st`` (default: all of them);
        predicates read the masks cached in ``view`` when given its columns."""
        sets = []
        stream = st.stream

        def mask_fn(pred: A.RowCond) -> Any:
            def f(cols: Any) -> np.ndarray:
                if view is not None and cols is view.cols:
                    return view.mask(pred)  # type: ignore[return-value]
                return BatchView(stream, dict(cols)).mask(pred)  # type: ignore[return-value]

            return f

        for pred, need in st.column_sets(structs):
            sets.append(
                ColumnSet(
                    set_name(pred),
                    None if pred is None else mask_fn(pred),
                    sums=tuple(sorted(need["sums"])),
                    minmax=tuple(sorted(need["minmax"])),
                    firstlast=tuple(sorted(need["firstlast"])),
                    distinct=tuple(sorted(need["distinct"])),
                )
            )
        needs_raw = any(s.raw for s in st.structs.values()) or st.domain_live[True]
        return EvalPaneSpec(st.key, tuple(sets), needs_raw=needs_raw, pane_ms=self.pane_ms or 0)

    def pane_specs(self, stream: str) -> list[EvalPaneSpec]:
        """One :class:`EvalPaneSpec` per key field of ``stream`` in use (see :meth:`pane_spec`)."""
        return [self._spec(st, None) for st in self.states.values() if st.stream == stream]  # type: ignore[misc]

    def pane_spec(self, stream: str, key: str | None = None) -> EvalPaneSpec:
        """What to pre-aggregate per (key, pane) for ``stream`` (``key``: the key field, may be
        omitted when the rules use one): one column set per distinct predicate (WHERE AND
        FILTER) of a pane-fed structure, named by the predicate's text ("all": none), with the
        fields it SUMs, MIN/MAXes, FIRST/LASTs and COUNT-DISTINCTs. ``needs_raw``: some rule
        reads a ROWS window or a window that is not a multiple of the pane width, so the raw
        events must be given too (``apply_panes(..., raw=...)``). The spec changes when rules
        are added or removed: ask again after each change."""
        if self.pane_ms is None:
            raise ValueError("pane_spec needs an Evaluator(pane_ms=...)")
        st = self._state_of(stream, key)
        if st is None:
            raise KeyError(f"no rule reads {stream}" + (f" by {key}" if key else ""))
        return self._spec(st, None)  # type: ignore[return-value]

    def _retain(self, stream: str, unit: Unit) -> None:
        keep, rows = self._reach().retention(stream)
        self._history.retain(stream, unit, self._max_ts[stream] - keep, rows)

    def expire(self, now: int) -> None:
        """Drop rows no window in use can read any more (windows end at ``now`` or later)."""
        for st in self.states.values():
            for feed, dom_rint in st.domains.items():
                dom = [
                    w
                    for n, w in st.domain_users.items()
                    if w is not None and st.domain_readers.get(n, True) == feed
                ]
                if dom and st.domain_live[feed]:
                    dom_rint.expire(now - max(dom))
            for s in st.structs.values():
                s.expire(now)

    def _reach(self) -> Reach:
        """The windows in use summed up once per rule set (:mod:`engine.evaluation.reach`):
        what the raw history keeps, the longest time window."""
        return reach_for(self, self.states.values(), self.history_ms or 0)

    def _maybe_expire(self, now: int) -> None:
        longest = self._reach().longest
        every = max(1000, longest // 8)
        if self._last_expire is None or now - self._last_expire >= every:
            self.expire(now)
            self._last_expire = now

    # ------------------------------------------------------------ lookups
    def step(self, now: int, skip: frozenset[str] = frozenset()) -> Changes:
        """Look every rule up at ``now`` (all events with ts <= now applied) and return the
        changes of each rule's result since its previous lookup.

        ``skip``: rules not looked up at ``now`` (the engine's overload policy,
        :mod:`engine.overload`): no change of theirs is reported and their change state is
        untouched, so their next lookup reports the changes since their last one.  A group all
        of whose members are skipped is not looked up at all; in a group partly skipped, the
        skipped members' pairs are carried over (:meth:`Group.carry`).  Expiry is unchanged."""
        self.stats["lookups"] += 1
        ctx = Lookup(self, now)
        changes = Changes(now)
        held: dict[tuple[Any, ...], set[int]] = {}  # group -> uids of its skipped members
        for name in skip:
            r = self.rules.get(name)
            if r is not None and r.group is not None:
                held.setdefault(r.group, set()).add(r.uid)
        for gkey, g in self.groups.items():
            uids = held.get(gkey)
            if uids is None:
                self._lookup_group(g, now, changes)
            elif len(uids) < len(g.members):
                self._lookup_group(g, now, changes, np.array(sorted(uids), np.int64))
        for rule in loose_rules(self, self.rules, self._uid):
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
        self._maybe_expire(now)
        return changes

    def _lookup_group(self, g: Group, now: int, changes: Changes, held: np.ndarray | None = None) -> None:
        """One index lookup at the group's loosest range, one exact pass, per-rule ranges by
        bisection; the members of uids ``held`` (sorted) keep their previous pairs."""
        if g.arrays is None or (g.extras and g.extra_checks is None):  # (a state from before ExtraChecks)
            g.prepare()
        assert g.arrays is not None
        names, los, his, lo_strict, hi_strict, uids, (loosest_lo, ls, hi_arg, hs) = g.arrays
        cand = g.index.obj.candidates(g.T, now, loosest_lo, hi_arg, ls, hs)
        self.stats["candidates"] += int(cand.shape[0])
        self.stats["post_checked"] += int(cand.shape[0])
        if cand.shape[0]:
            cnt, sums = g.exact.obj.window(cand, now - g.T, now)
            vals = np.ascontiguousarray(sums[:, 0]) if g.sum_kind else cnt.astype(np.float64)
            cand = np.ascontiguousarray(cand, dtype=np.int64)
        else:
            vals = np.zeros(0, np.float64)
            cand = EMPTY
        if not g.extras and held is None:
            pairs, enter, exit_ = group_pass(cand, vals, los, his, lo_strict, hi_strict, uids, g.prev_pairs)
        else:
            # members "driver AND more atoms": their pairs that fail an extra atom are dropped
            pairs = group_pass(cand, vals, los, his, lo_strict, hi_strict, uids, EMPTY)[0]
            if g.extras and pairs.shape[0]:
                ctx = Lookup(self, now)
                uid_of, key_of = pairs >> SHIFT, pairs & np.int64(0xFFFFFFFF)
                drop = g.extra_checks.check(ctx, uid_of, key_of) if g.extra_checks else None
                if drop is not None and drop.shape[0]:
                    pairs = np.delete(pairs, drop)
            if held is not None:
                pairs = g.carry(pairs, held)
            pairs, enter, exit_ = pair_diff(np.ascontiguousarray(pairs), g.prev_pairs)
        g.prev_pairs = pairs
        for arr, kind in ((enter, "ENTER"), (exit_, "EXIT")):
            if arr.shape[0]:
                names = g.name_of(arr >> SHIFT)
                changes.add(names, g.state.key_values(arr & np.int64(0xFFFFFFFF)), kind)

    def lookup(self, now: int) -> dict[str, set[str]]:
        """Current result set of every rule at ``now`` (as key values); advances the change state."""
        self.step(now)
        ids: dict[str, np.ndarray] = {}
        for g in self.groups.values():
            by_uid = {u: n for n, u in g.uids.items()}
            pairs = g.prev_pairs
            bounds = np.flatnonzero(np.diff(pairs >> SHIFT)) + 1
            for chunk in np.split(pairs, bounds) if pairs.size else []:
                ids[by_uid[int(chunk[0] >> SHIFT)]] = chunk & np.int64(0xFFFFFFFF)
        out: dict[str, set[str]] = {}
        for name, rule in self.rules.items():
            cur = rule.prev if rule.group is None else ids.get(name, EMPTY)
            out[name] = set(rule.state.interner.keys(cur))
        return out

    def current_ids(self, name: str) -> list[str]:
        """The rule's result at its last lookup, as key values."""
        rule = self.rules[name]
        if rule.group is not None:
            g = self.groups[rule.group]
            uid = g.uids[name]
            ids = g.prev_pairs[(g.prev_pairs >> SHIFT) == uid] & np.int64(0xFFFFFFFF)
        else:
            ids = rule.prev
        return rule.state.interner.keys(ids)

    def evaluate_now(self, name: str, now: int) -> set[str]:
        """PSoup: the rule's result at ``now`` from the state held, without touching change state."""
        rule = self.rules[name]
        return set(rule.state.interner.keys(Lookup(self, now).evaluate(rule)))

    def values(self, name: str, keys: Iterable[str], now: int) -> dict[str, dict[str, Any]]:
        """The aggregates rule ``name`` compares, per key at ``now`` (what made an alert fire):
        ``{key: {aggregate text: value}}``, COUNT / COUNT DISTINCT as int, others as float, NULL
        (AVG of an empty window) as None; keys never seen: an empty window's.  Reads the state as
        it is: call it right after the lookup at ``now``, before further events are applied."""
        return self.values_many({name: list(keys)}, now)[name]

    def values_many(self, wanted: Mapping[str, list[str]], now: int) -> dict[str, dict[str, dict[str, Any]]]:
        """:meth:`values` of many rules at once: ``{rule: {key: {aggregate text: value}}}``."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, (labels, cols) in self.value_columns(wanted, now).items():
            rows, ks = zip(*cols, strict=True) if cols else (() for _ in wanted[name]), wanted[name]
            out[name] = {k: dict(zip(labels, r, strict=True)) for k, r in zip(ks, rows, strict=True)}
        return out

    def value_columns(
        self, wanted: Mapping[str, list[str]], now: int
    ) -> dict[str, tuple[list[str], list[list[Any]]]]:
        """:meth:`values_many` as columns, no per-key Python: ``{rule: (labels, columns)}``, the value
        of ``labels[j]`` for ``wanted[rule][i]`` being ``columns[j][i]`` (a text twice in a rule: its
        last value at its first place, as ``dict(zip(...))``).  Rules reading the same aggregate
        (structure, aggregate text) share one computation over the union of their keys: one
        structure read per distinct aggregate at a lookup, not one per rule
        (:func:`engine.evaluation.alert_values.value_columns`)."""
        return alert_values.value_columns(self.rules, wanted, now, alert_values.plan_for(self, self.rules))

    def value_table(self, wanted: Mapping[str, list[str]], now: int) -> alert_values.ValueTable:
        """:meth:`value_columns` as flat columns over all the rules of ``wanted``: what a lookup's
        alerts carry as one block (:func:`engine.evaluation.alert_values.value_table`)."""
        return alert_values.value_table(self.rules, wanted, now, alert_values.plan_for(self, self.rules))

    def write_targets(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Where the next batch's rows are written in every per-key row buffer (the domains' and
        the structures' that have them: :meth:`engine.algorithms._base.PooledStructure.write_targets`)."""
        return [t for o in self._row_buffers("write_targets") for t in o.write_targets()]

    def take_spares(self) -> list[np.ndarray]:
        """The row columns the per-key row buffers made ahead of their next growth since the last
        call (:meth:`engine.algorithms._base.PooledStructure.take_spares`), for the runtime to
        fault in off the batch (:class:`engine.runtime.prefault.SpareWarmer`)."""
        return [a for o in self._row_buffers("take_spares") for a in o.take_spares()]

    def _row_buffers(self, method: str) -> Iterator[Any]:
        """Every domain and structure of every stream that has ``method`` (the per-key row buffers)."""
        for st in self.states.values():
            for o in (*st.domains.values(), *(s.obj for s in st.structs.values())):
                if hasattr(o, method):
                    yield o

    @property
    def nbytes(self) -> int:
        """Bytes held by every shared structure and index, and by the retained history."""
        n = self.history_nbytes
        for st in self.states.values():
            n += sum(d.nbytes for d in st.domains.values()) + st.interner.nbytes
            n += sum(int(s.obj.nbytes) for s in st.structs.values())
        return n

    @property
    def history_nbytes(self) -> int:
        """Bytes of the retained history's arrays (raw batches, pane rows, the ROWS tail)."""
        return self._history.nbytes

    def history_rows(self, stream: str | None = None) -> int:
        """Raw events the retained history holds (of ``stream``; default: every stream)."""
        return self._history.rows(None if stream is None else [stream])

    def rows_held(self) -> int:
        """Rows held, counted exactly (:attr:`nbytes` is the room allocated, which grows in steps):
        the history's raw events and the per-key row buffers' live rows (CI indexes hold levels)."""
        objs = (s.obj for st in self.states.values() for s in st.structs.values())
        return self._history.rows() + sum(int(getattr(o, "live_rows", 0)) for o in objs)

    def structure_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for st in self.states.values():
            for s in st.structs.values():
                out[s.kind] = out.get(s.kind, 0) + 1
        return out
