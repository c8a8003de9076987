"""The engine's driver-side core: one micro-batch in, alerts and result changes out.

No Spark and no I/O here, so the whole batch logic is unit-testable and a replay
after a restart runs exactly the same code.  Per micro-batch (docs/ARCHITECTURE.md "Data flow";
docs/engine.md "Time and exactness"):

1. **Rule changes first** (PSoup, Chandrasekaran & Franklin 2002, section 3): each
   subscription change is applied to the evaluator before anything else; a new
   rule is looked up at once at the last lookup time against the state already
   held, so its first result does not wait for its window to refill.
2. **Decode and validate** every stream (:mod:`engine.decode`); bad records become
   dead letters.  Records with ``ts`` at or before the last lookup time are ``late``.
3. **Time**: the watermark is per Kafka partition -- the smallest, over the active
   partitions, of each one's largest event time, minus the allowed lateness
   (:meth:`EngineCore._advance_watermark`); *now* is the watermark floored to the lookup
   period ``L`` (a multiple of the pane width ``g``; ``L = g`` by default).  Lookups happen
   at every multiple of ``L`` after the previous lookup up to *now* (the first one at
   the smallest event time floored to ``L``, like ``tidewatch backtest --every L``).
   Before the lookup at ``tau`` every pending event with ``ts <= tau`` is applied, in
   ``ts`` order with ties in arrival order; events with ``ts > now`` stay pending.
4. **Lookups** of every active rule; a change of a rule's result set is an alert
   (``ENTER`` / ``EXIT``) with the stable id ``subscription|key|kind|as_of``.  Overloaded, the
   lookups of subscriptions with a staleness budget are spaced on a grid (:mod:`engine.overload`).

The state (evaluator, rule table, current results, pending events, time) round-trips
through :meth:`EngineCore.to_bytes` / :meth:`EngineCore.from_bytes`; replaying the
same batches after a restore gives the same state and the same alerts.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from engine.cap import DIFF_PART, LOOKUP_PART, cap_alerts, mark_segment
from engine.decode import STREAMS, Decoded, Predecoded, empty, finish, predecode
from engine.errors import BatchParamsMismatch, SnapshotUnreadable
from engine.evaluation.alert_values import ValueTable
from engine.evaluation.panes import PaneRows
from engine.executors.history import HistoryIndex
from engine.executors.merge import PanePartial
from engine.executors.output import ExecutorBatch
from engine.executors.preagg import BatchParams, KeySpec, batch_params, key_specs
from engine.lookup_changes import ENTER, EXIT, Accepted, accepted
from engine.messages import Alert, AlertBlock, BatchOutput, LookupBlock, RuleInfo, SubscriptionChange
from engine.overload import Marks, Overload, batch_strides, by_stride, decide, ladder, skipped
from engine.rule_evaluator import RuleEvaluator, make_evaluator, rule_compiler
from engine.runtime import state_codec
from engine.runtime.state_capture import CaptureCache, Captured, capture
from engine.watermark import advance, last_lookup, merged_maxima

log = logging.getLogger("tidewatch.engine")

#: executors mode: ``source(stream, index, lo, hi)`` -- the events of ``stream`` the batches of
#: ``index`` took with ``lo < ts <= hi`` (None: unbounded), in arrival order, read again from
#: Kafka (:func:`engine.executors.history.spark_history` live, or in this process on a replay)
EventSource = Callable[[str, HistoryIndex, "int | None", "int | None"], Decoded]

#: (stream, Kafka partition) -> (smallest, largest) valid event time of a batch's records there
Span = dict[tuple[str, int], tuple[int, int]]

_NO_TS = -(2**62)  #: the lower bound of the first lookup's span (before every event time)


def _concat(a: Decoded, b: Decoded) -> Decoded:
    if len(a) == 0:
        return b
    if len(b) == 0:
        return a
    return Decoded(
        a.stream,
        {k: np.concatenate([a.columns[k], b.columns[k]]) for k in a.columns},
        np.concatenate([a.partition, b.partition]),
        np.concatenate([a.offset, b.offset]),
    )


class _Reader:
    """One batch's reads of events again from Kafka (an :data:`EventSource` over the core's
    :class:`HistoryIndex`), each (stream, lo, hi) read once: rules added in one batch share it."""

    def __init__(self, source: EventSource, index: HistoryIndex) -> None:
        self.source, self.index = source, index
        self._cache: dict[tuple[str, int | None, int | None], Decoded] = {}

    def __call__(self, stream: str, lo: int | None, hi: int | None) -> Decoded:
        k = (stream, lo, hi)
        if k not in self._cache:
            self._cache[k] = self.source(stream, self.index, lo, hi)
        return self._cache[k]

    def columns(self, stream: str, lo: int, hi: int) -> dict[str, np.ndarray] | None:
        """The events as the evaluator's ``history`` gives them: columns sorted by ts (ties in
        arrival order); None when there are none."""
        d = self(stream, lo, hi)
        if not len(d):
            return None
        order = np.argsort(d.ts, kind="stable")
        return {k: np.asarray(v)[order] for k, v in d.columns.items()}


def _of(specs: dict[tuple[str, str], KeySpec], stream: str) -> dict[str, KeySpec]:
    """The pane specs of ``stream`` by key field."""
    return {k: ks for (s, k), ks in specs.items() if s == stream}


#: attributes of :class:`EngineCore` that are not state (the callables given to the constructor);
#: every other attribute set in ``__init__`` is saved by ``to_bytes`` and restored by ``from_bytes``
#: (``alert_cap`` too, but :meth:`EngineCore.from_bytes` sets it from its argument: a setting)
_NOT_STATE = frozenset({"_compile", "_grid"})  # _grid: made by each batch (_use_strides)
#: per core, the nodes of its compiled rules of its last capture, reused by the next
#: (:class:`~engine.runtime.state_capture.CaptureCache`); kept out of the core's attributes, which
#: are its state
_CAPTURE_CACHES: weakref.WeakKeyDictionary[Any, CaptureCache] = weakref.WeakKeyDictionary()


class EngineCore:
    """Driver-side state of the engine and the per-batch logic (see module docstring)."""

    def __init__(
        self,
        *,
        pane_ms: int,
        allowed_lateness_ms: int,
        max_future_ms: int,
        evaluator_factory: Callable[[], RuleEvaluator],
        compile_rule: Callable[[str, Any], tuple[Any, str]],
        idle_timeout_ms: int = 5_000,
        lookup_every_ms: int | None = None,
        alert_cap: int = 0,
    ) -> None:
        self.g = int(pane_ms)
        #: at most this many alerts per subscription and lookup time, the rest withheld
        #: (``engine_alert_cap_per_lookup``, :mod:`engine.cap`); 0: no cap.  A setting: the
        #: snapshot's value is replaced by the one given to :meth:`from_bytes`
        self.alert_cap = int(alert_cap)
        #: lookups at every multiple of L (a multiple of g; default g): the alert log equals
        #: ``tidewatch backtest --every L``; a larger L divides the lookup cost of many rules by L/g
        self.L = int(lookup_every_ms or pane_ms)
        if self.L % self.g:
            raise ValueError(f"lookup_every_ms ({self.L}) must be a multiple of pane_ms ({self.g})")
        self.lateness = int(allowed_lateness_ms)
        self.max_future_ms = int(max_future_ms)
        self._compile = compile_rule
        self.evaluator: RuleEvaluator = evaluator_factory()
        self.rules: dict[str, RuleInfo] = {}
        self.current: dict[str, set[str]] = {}
        self.pending: dict[str, Decoded] = {s: empty(s) for s in STREAMS}
        self.max_ts: int | None = None  # largest valid event time seen (all streams, all partitions)
        self.idle_timeout = int(idle_timeout_ms)
        #: largest valid event time per (stream, Kafka partition): the watermark is the smallest of
        #: these over the partitions that are not idle, minus the allowed lateness
        self.part_max: dict[tuple[str, int], int] = {}
        self._wm: int | None = None
        #: stream partitions no event has come from yet that held the watermark back (see
        #: :meth:`_advance_watermark`) -> how many batches they held it
        self.unheard: dict[tuple[str, int], int] = {}
        self.applied_until: int | None = None  # last lookup time
        self.last_batch: int = -1
        self._fresh: set[str] = set()  # rules added since the last lookup step
        self._versions: dict[str, int] = {}  # last applied version per subscription
        #: executors mode (``engine_preaggregate``, :meth:`process_preaggregated`): the pending
        #: (key, pane) rows per (stream, key field), merged across batches, covering the same
        #: events as ``pending`` (kept raw too) -- except for the streams of ``raw_fed``
        self.panes: dict[tuple[str, str], PanePartial] = {}
        #: stream -> event time: the stream's pane specs changed while events were pending, so
        #: it is fed its raw events (the driver path) until every event pending then (``ts <=``
        #: this) is applied; its pane rows cover only the events of the batches since
        self.raw_fed: dict[str, int] = {}
        #: executors mode: the batches whose events a rule may still need read again from Kafka
        #: (PSoup backfill, a spec change while events are pending): :mod:`engine.executors.history`
        self.history_index = HistoryIndex()
        #: executors mode: the smallest valid event time seen before the first lookup
        self.first_ts: int | None = None
        #: the overload policy (:mod:`engine.overload`): the controller's state, the staleness
        #: budgets of the active subscriptions that have one, the subscriptions not looked up yet
        #: (their first lookup is never skipped) and this batch's strided ones by stride
        self.overload = Overload()
        self._budgets: dict[str, int] = {}
        self._new: set[str] = set()
        self._grid: dict[int, frozenset[str]] = {}

    # ------------------------------------------------------------------ time
    @property
    def watermark(self) -> int | None:
        """The event-time watermark (never decreases; None before the first valid event)."""
        return self._wm

    def _note_partitions(self, stream: str, d: Decoded, delivered: set[tuple[str, int]]) -> None:
        """Record the largest event time of each Kafka partition present in ``d``.

        ``d`` is in (partition, offset) order (:func:`engine.decode.decode_records`), so each
        partition is one run of rows."""
        part = d.partition
        starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]])
        tops = np.maximum.reduceat(d.ts, starts)
        for p, top in zip(part[starts].tolist(), tops.tolist(), strict=True):
            k = (stream, int(p))
            delivered.add(k)
            old = self.part_max.get(k)
            self.part_max[k] = int(top) if old is None else max(old, int(top))

    def _note_span(self, span: Span, delivered: set[tuple[str, int]]) -> None:
        """:meth:`_note_partitions` from a batch's per-partition event-time span (``process``)."""
        for k, (lo, top) in span.items():
            if self.applied_until is None:  # before the first lookup: where the lookups start
                self.first_ts = lo if self.first_ts is None else min(self.first_ts, lo)
            elif top <= self.applied_until:
                continue  # every event of it is late: not delivered
            delivered.add(k)
            old = self.part_max.get(k)
            self.part_max[k] = top if old is None else max(old, top)

    def _advance_watermark(
        self, delivered: set[tuple[str, int]], waiting: Iterable[tuple[str, int]] | None = None
    ) -> None:
        """Advance the watermark after a batch (``part_max`` already holds its events):
        :func:`engine.watermark.advance`, whose docstring defines it."""
        step = advance(
            self.part_max,
            self.unheard,
            self._wm,
            delivered,
            waiting,
            idle_timeout_ms=self.idle_timeout,
            lateness_ms=self.lateness,
        )
        self.unheard = step.unheard
        if step.max_ts is not None:
            self.max_ts = step.max_ts
        self._wm = step.wm

    def _now(self) -> int | None:
        wm = self.watermark
        return None if wm is None else (wm // self.L) * self.L

    # ------------------------------------------------------------------ rules
    def _apply_change(self, ch: SubscriptionChange, out: BatchOutput, history: Any = None) -> None:
        sid = ch.subscription_id
        seen = self._versions.get(sid)
        if ch.version is not None and seen is not None and ch.version <= seen:
            log.info("subscription %s version %d ignored (version %d already applied)", sid, ch.version, seen)
            return
        if ch.version is not None:
            self._versions[sid] = ch.version
        # removed by an earlier change of this batch (deleted, then subscribed again): its old
        # results are already dropped, and stay dropped (``out.removed``, ``out.removed_keys``)
        dropped = sid in out.removed
        before: set[str] = set()  # a changed rule's result until now: the new one is diffed with it
        if sid in self.rules:
            self.evaluator.remove_rule(sid)
            del self.rules[sid]
            self._budgets.pop(sid, None)
            before = self.current.pop(sid, set())
            if not dropped:
                out.removed.append(sid)
                out.removed_keys[sid] = sorted(before)
        if ch.op != "upsert":
            log.info("subscription %s %sd; its results are dropped", sid, ch.op)
            return
        try:
            plan, stream = self._compile(ch.text, ch.plan)
            if history is None:
                self.evaluator.add_rule(sid, plan)
            else:
                self.evaluator.add_rule(sid, plan, history=history)
        except Exception as exc:  # a bad rule must not stop the engine
            log.warning("subscription %s (%s) refused: %s", sid, ch.name, exc)
            out.rule_errors.append((sid, str(exc)))
            return
        if sid in out.removed and not dropped:  # a changed rule: diffed with its old result
            out.removed.remove(sid)
            del out.removed_keys[sid]
        self.rules[sid] = RuleInfo(sid, ch.name, ch.text, stream, ch.version, ch.staleness_budget_ms)
        self._new.add(sid)
        if ch.staleness_budget_ms is not None:
            self._budgets[sid] = int(ch.staleness_budget_ms)
        # a new version's result is diffed with the old one's: ENTER for the keys it adds, EXIT
        # for those it drops (so the alert log, current results and the compacted results topic
        # stay consistent); the keys of both are not alerted again
        self.current[sid] = before
        log.info("subscription %s (%s) on %s is active", sid, ch.name, stream)
        if self.applied_until is not None:  # PSoup: new query over the state already held
            first = len(out.alerts)
            self._segment(out, DIFF_PART)
            found = self.evaluator.evaluate_now(sid, self.applied_until)
            self._fresh.add(sid)  # its change state in the evaluator starts empty
            self._diff(sid, found, self.applied_until, out)
            if self.alert_cap:
                cap_alerts(out, first, self.alert_cap)

    def _segment(self, out: BatchOutput, part: int, *, same: bool = False) -> None:
        """:func:`engine.cap.mark_segment` where the core would cap, when it does not cap itself
        (a shard's: the driver caps); a capping core shortens its alerts, so it marks none."""
        if not self.alert_cap:
            mark_segment(out, part, same=same)

    def _diff(self, sid: str, found: Iterable[str], tau: int, out: BatchOutput) -> None:
        """The alerts of rule ``sid``'s whole result ``found`` at ``tau`` against the keys it had:
        ENTERs, then EXITs, each in key order, with their values (:meth:`_emit`)."""
        new = set(found)
        old = self.current.get(sid, set())
        if new == old:
            return
        enter, gone = sorted(new - old), sorted(old - new)
        self.current[sid] = new
        n = len(enter) + len(gone)
        self._emit(
            Accepted([sid], np.array([n], np.int64), enter + gone, [ENTER] * len(enter) + [EXIT] * len(gone)),
            tau,
            out,
        )

    # ------------------------------------------------------------------ batch
    def process(
        self,
        batch_id: int,
        records: dict[str, pa.Table | Predecoded],
        changes: list[SubscriptionChange] | None = None,
        waiting: Iterable[tuple[str, int]] | None = None,
        strides: dict[str, int] | None = None,
        span: Span | None = None,
    ) -> BatchOutput:
        """Run one micro-batch: ``records`` maps stream name -> Kafka records (see decode), or
        the records already through :func:`engine.decode.predecode` (the reading thread's part);
        ``waiting``: partitions with records not yet readable (see :meth:`_advance_watermark`);
        ``strides``: the overload policy's for this batch, those it committed when it is replayed
        (None: the controller's, :meth:`_use_strides`).

        ``span``: a shard of the engine (:mod:`engine.shards`) is given the records of its keys
        only; the clock must still be the whole batch's, so ``span`` gives the largest and
        smallest valid event time of every (stream, partition) over all the batch's records
        (``late`` ones included: a partition counts as delivered when its largest is past the
        last lookup, which is exactly when it has an event that is not late, and then that
        largest is the one :meth:`_note_partitions` would find)."""
        out = BatchOutput(batch_id)
        for ch in changes or []:
            self._apply_change(ch, out)
        self._use_strides(strides, out)
        delivered: set[tuple[str, int]] = set()
        for stream, tbl in records.items():
            pre = (
                tbl
                if isinstance(tbl, Predecoded)
                else predecode(stream, tbl, max_future_ms=self.max_future_ms)
            )
            d = finish(pre, late_until=self.applied_until, dead=out.dead, watermark=self.watermark)
            out.events[stream] = len(d)
            if len(d):
                if span is None:
                    self._note_partitions(stream, d, delivered)
                self.pending[stream] = _concat(self.pending[stream], d)
        if span is not None:
            self._note_span(span, delivered)
        self._advance_watermark(delivered, waiting)
        self._lookups(out, self._run_lookups)
        self.last_batch = batch_id
        return out

    # ------------------------------------------------------------------ executors mode
    def batch_params(self, topics: dict[str, str]) -> BatchParams:
        """What the executors need for the next batch (``engine_preaggregate = "executors"``),
        decided now, at batch start: the evaluator's pane specs (:func:`key_specs`), the late
        bound (``applied_until``) and watermark the driver path would use, and the streams
        whose events must reach the driver raw: those a ROWS window (or a window that is not a
        multiple of the pane width) reads, and those fed raw after a spec change (``raw_fed``).
        Every other stream's events stay in the executors: a rule added later has them read
        again from Kafka (:mod:`engine.executors.history`)."""
        specs, raw = key_specs(self.evaluator)
        return batch_params(
            pane_ms=self.g,
            topics=topics,
            max_future_ms=self.max_future_ms,
            panes=specs,
            late_until=self.applied_until,
            watermark=self.watermark,
            raw_streams=[s for s in topics if s in STREAMS and (s in raw or s in self.raw_fed)],
        )

    def params_after(
        self, topics: dict[str, str], eb: ExecutorBatch, waiting: Iterable[tuple[str, int]] | None
    ) -> BatchParams | None:
        """The parameters for the batch after ``eb``, decided before ``eb`` is processed (the
        executors mode's pipeline, :meth:`engine.app.EngineApp.on_batch_executors`): the ``late``
        bound and watermark are exactly those :meth:`batch_params` gives once
        :meth:`process_preaggregated` has taken ``eb`` with ``waiting`` -- both depend only on
        the batch's per-partition event-time maxima (:mod:`engine.watermark`) -- and the pane
        specs and raw streams are today's (a rule change in ``eb`` makes them stale, which
        :meth:`process_preaggregated` handles as any spec change: exact, the events read again).
        None before the first lookup (when the first lookup time depends on the events
        pending): the caller waits and asks :meth:`batch_params` then."""
        if self.applied_until is None:
            return None
        step = advance(
            merged_maxima(self.part_max, eb.part_max),
            self.unheard,
            self._wm,
            set(eb.part_max),
            waiting,
            idle_timeout_ms=self.idle_timeout,
            lateness_ms=self.lateness,
        )
        until = last_lookup(self.applied_until, step.wm, self.L)
        return replace(self.batch_params(topics), late_until=until, watermark=step.wm)

    def process_preaggregated(
        self,
        batch_id: int,
        eb: ExecutorBatch,
        params: BatchParams,
        changes: list[SubscriptionChange] | None = None,
        waiting: Iterable[tuple[str, int]] | None = None,
        history: EventSource | None = None,
        strides: dict[str, int] | None = None,
    ) -> BatchOutput:
        """:meth:`process` of a batch the executors decoded and pre-aggregated (``eb``, made with
        ``params`` = :meth:`batch_params` at its start): the same output and state.

        ``history``: where events are read again from Kafka by offsets (see :data:`EventSource`);
        the batch is in :attr:`history_index` before anything reads it.  Subscription changes
        first, as :meth:`process`; a rule added is filled from the evaluator's retained history,
        whose events are read again where it holds pane rows only (PSoup).  When the changes (or
        a restored state) change a stream's pane specs, the pending pane rows of that stream
        (and this batch's, made with the old specs) cannot serve the new specs: the stream is
        fed its raw events (the driver path, exact; read again unless they came raw) until every
        event pending now is applied (``raw_fed``), its pane rows restarting empty under the new
        specs with the next batch."""
        if (params.late_until, params.watermark) != (self.applied_until, self.watermark):
            raise BatchParamsMismatch(
                f"batch {batch_id} was made for late bound {params.late_until} and watermark "
                f"{params.watermark}, the state is at {self.applied_until} / {self.watermark}"
            )
        out = BatchOutput(batch_id)
        tops = list(eb.part_max.values())
        self.history_index.add(batch_id, eb.offsets, params.late_until, max(tops) if tops else None)
        read = self._history_reader(history)
        needs_before = key_specs(self.evaluator)[1] if changes else None  # read raw before the changes
        for ch in changes or []:
            self._apply_change(ch, out, None if read is None else read.columns)
        self._use_strides(strides, out)
        specs_now, raw_now = key_specs(self.evaluator)
        # the streams whose pending events this process holds raw, every one of them: kept raw
        # since (a ROWS window reads them, or fed raw after a spec change) and this batch's too
        complete = set(params.raw_streams) & (
            set(self.raw_fed) | set(raw_now if needs_before is None else needs_before)
        )
        specs = {(k.stream, k.key): k for k in specs_now}
        before = {(k.stream, k.key): k for k in params.panes}
        stale = {
            s
            for s in STREAMS
            if _of(specs, s) != _of(before, s)
            or _of({k: p.spec for k, p in self.panes.items()}, s) != _of(before, s)
            or (s in raw_now and s not in params.raw_streams)  # read raw from now: its pending too
            or (s in self.raw_fed and s not in params.raw_streams)  # made before it was fed raw
        }
        out.dead = eb.dead
        delivered = set(eb.part_max)
        self.part_max = merged_maxima(self.part_max, eb.part_max)  # as params_after forecasts it
        if self.applied_until is None:
            for lo in eb.ts_min.values():
                self.first_ts = lo if self.first_ts is None else min(self.first_ts, lo)
        for stream, _ in params.topics:
            out.events[stream] = int(eb.events.get(stream, 0))
            d = eb.raw.get(stream)
            if d is not None and len(d):
                self.pending[stream] = _concat(self.pending[stream], d)
        for key, part in eb.panes.items():
            if key[0] not in stale:
                self.panes[key] = PanePartial.merge([self.panes[key], part])
        for s in stale:
            for key in [k for k in self.panes if k[0] == s]:
                del self.panes[key]
            for key, ks in specs.items():
                if key[0] == s:
                    self.panes[key] = PanePartial.empty(ks)
            if s not in complete:  # (some of) its pending events came as pane rows: read them
                if read is None:
                    raise ValueError(f"the pane specs of {s} changed with events pending: give history")
                self.pending[s] = read(s, self.applied_until, None)
            if len(self.pending[s]):
                top = int(self.pending[s].ts.max())
                self.raw_fed[s] = max(self.raw_fed.get(s, top), top)
        self._advance_watermark(delivered, waiting)
        self._lookups(out, self._run_pane_lookups)
        self.history_index.prune(self._history_bound())
        self.last_batch = batch_id
        return out

    def _history_reader(self, source: EventSource | None) -> _Reader | None:
        return None if source is None else _Reader(source, self.history_index)

    def _history_bound(self) -> int | None:
        """Events with ``ts`` at or below this are read again by nobody: not pending (``<=
        applied_until``) and older than every retained unit's span."""
        if self.applied_until is None:
            return None
        floor = getattr(self.evaluator, "history_floor", None)
        lows = [f for f in (floor(s) for s in STREAMS) if f is not None] if floor else []
        return min([self.applied_until, *lows])

    def _lookups(self, out: BatchOutput, run: Callable[[range, BatchOutput], None]) -> None:
        """Look up at every lookup time from the last one (or the first event) up to *now*."""
        now = self._now()
        if now is None:
            return
        if self.applied_until is None:
            lows = [int(p.ts.min()) for p in self.pending.values() if len(p)]
            lows += [] if self.first_ts is None else [self.first_ts]
            start = (min(lows) // self.L) * self.L if lows else now
        else:
            start = self.applied_until + self.L
        if start <= now:
            run(range(start, now + 1, self.L), out)

    def _run_pane_lookups(self, taus: range, out: BatchOutput) -> None:
        """:meth:`_run_lookups` with the pending pane rows: per ``tau`` each (stream, key field)'s
        rows with ``pane <= tau`` (cut for all the ``taus`` at once, :meth:`PanePartial.rows_at`)
        go to ``Evaluator.apply_panes`` with the same events raw (one dict for every key field of
        the stream, as the evaluator retains them for PSoup); a stream with no key field in use
        or in ``raw_fed`` gets its raw events (``apply``), its due pane rows dropped."""
        bufs: dict[str, tuple[Decoded, np.ndarray]] = {}
        for stream, p in self.pending.items():
            if len(p) > 1 and np.any(p.ts[1:] < p.ts[:-1]):
                p = p.take(np.argsort(p.ts, kind="stable"))
            bufs[stream] = (p, p.ts)
        cursor = dict.fromkeys(bufs, 0)
        ev: Any = self.evaluator
        needs_raw = key_specs(ev)[1]  # raw events kept with pane rows only where rules read them
        due_at: dict[tuple[str, str], dict[int, PaneRows]] = {}  # per key field: tau index -> rows due
        for key in [k for k in self.panes if k[0] in bufs]:
            due_at[key], self.panes[key] = self.panes[key].rows_at(taus)
        for i, tau in enumerate(taus):
            span = (_NO_TS if self.applied_until is None else self.applied_until, tau)
            for stream, (p, ts) in bufs.items():
                lo = cursor[stream]
                hi = int(np.searchsorted(ts, tau, "right")) if len(p) else 0
                raw = {k: v[lo:hi] for k, v in p.columns.items()} if hi > lo else None
                cursor[stream] = max(hi, lo)
                keys = [k for k in self.panes if k[0] == stream]
                fed = bool(keys) and stream not in self.raw_fed
                for key in keys:
                    due = due_at[key].get(i)
                    if fed and due is not None:
                        keep = raw if stream in needs_raw else None
                        ev.apply_panes(stream, due, key=key[1], raw=keep, span=span)
                if not fed and raw is not None:
                    ev.apply(stream, raw, span=span)
                elif not keys and raw is None and self._seen_after(stream, span[0]):
                    ev.note_span(stream, *span)  # no rule reads it: retained as a span
            self._lookup_at(tau, out)
            for stream, until in list(self.raw_fed.items()):
                if tau >= until:
                    del self.raw_fed[stream]
        for stream, (p, _) in bufs.items():
            lo = cursor[stream]
            if stream in needs_raw or stream in self.raw_fed:
                self.pending[stream] = p if lo == 0 else p.slice(lo)
            else:  # raw only while it was fed raw: its pane rows stand for the rest
                self.pending[stream] = empty(stream)

    def _seen_after(self, stream: str, lo: int) -> bool:
        """Whether a valid event of ``stream`` later than ``lo`` was seen."""
        return any(m > lo for (s, _), m in self.part_max.items() if s == stream)

    def _run_lookups(self, taus: range, out: BatchOutput) -> None:
        """Apply the pending events pane by pane and look up at every ``tau`` of ``taus``.

        Each stream's pending buffer is sorted by ``ts`` once (stable: ties keep arrival order,
        older batches first, then (partition, offset)); the events due at ``tau`` are then the
        next slice of it (no per-lookup scan or copy of the whole buffer)."""
        bufs: dict[str, tuple[Decoded, np.ndarray]] = {}
        for stream, p in self.pending.items():
            if len(p) == 0:
                continue
            ts = p.ts
            if len(p) > 1 and np.any(ts[1:] < ts[:-1]):
                p = p.take(np.argsort(ts, kind="stable"))
            bufs[stream] = (p, p.ts)
        cursor = dict.fromkeys(bufs, 0)
        for tau in taus:
            for stream, (p, ts) in bufs.items():
                lo = cursor[stream]
                hi = int(np.searchsorted(ts, tau, "right"))
                if hi > lo:
                    self.evaluator.apply(stream, {k: v[lo:hi] for k, v in p.columns.items()})
                    cursor[stream] = hi
            self._lookup_at(tau, out)
        for stream, (p, _) in bufs.items():
            lo = cursor[stream]
            self.pending[stream] = p if lo == 0 else p.slice(lo)

    def _emit(self, changes: Accepted, tau: int, out: BatchOutput) -> None:
        """Append the rules' alerts at ``tau`` (in order) to ``out`` with the values that made them
        fire (:meth:`_value_columns`: right after the lookup at ``tau``, before later events are
        applied) -- one :class:`LookupBlock` of columns for them all, taken from ``changes`` as
        they are, no Alert object made (one block per rule where the evaluator has no
        ``value_table``)."""
        got = self._value_columns(changes.keys_by_rule, tau)
        out.changed.update(changes.sids)
        if isinstance(got, ValueTable):
            infos = [self.rules[sid] for sid in changes.sids]
            out.alerts.add_block(
                LookupBlock(
                    tau,
                    changes.sids,
                    [i.name for i in infos],
                    [i.stream for i in infos],
                    changes.sizes,
                    changes.keys,
                    changes.kinds,
                    *got,
                )
            )
            return
        for sid, (keys, kinds) in changes.by_rule().items():
            info, v = self.rules[sid], got.get(sid)
            if isinstance(v, dict):  # an evaluator's values per key (no value_columns)
                vals: dict[str, Any] = v
                out.alerts.extend(
                    Alert(sid, info.name, info.stream, k, kind, tau, dict(vals.get(k) or {}))
                    for k, kind in zip(keys, kinds, strict=True)
                )
            else:
                labels, cols = v or ([], [])
                out.alerts.add_block(AlertBlock(sid, info.name, info.stream, tau, keys, kinds, labels, cols))

    def _lookup_at(self, tau: int, out: BatchOutput) -> None:
        """Look every rule up at ``tau`` (every event with ``ts <= tau`` already applied)."""
        self.applied_until = tau
        out.lookups.append(tau)
        if not self.rules:
            return
        start = len(out.alerts)
        self._segment(out, LOOKUP_PART)
        ev = self.evaluator
        # the evaluator's own changes (cheap with thousands of rules), checked against our result
        # sets for the whole lookup at once (engine.lookup_changes.accepted: no Python per rule)
        skip = skipped(self._grid, tau, self.L, self._new) if self._grid else frozenset()
        changes = ev.step(tau, skip) if skip else ev.step(tau)
        self._new.clear()
        got = accepted(changes.parts, self._fresh, self.rules, self.current)
        self._emit(got, tau, out)  # (rule, key) order
        if self._fresh:
            self._segment(out, DIFF_PART, same=True)
        for sid in sorted(self._fresh):  # rules evaluated at once when added: diff their whole result
            if sid in self.rules:
                self._diff(sid, ev.current_ids(sid), tau, out)
        self._fresh.clear()
        if self.alert_cap:
            cap_alerts(out, start, self.alert_cap)

    def _use_strides(self, strides: dict[str, int] | None, out: BatchOutput) -> None:
        """This batch's strides (``strides`` when given, a replay's: the ones it committed), in
        ``out`` with the budgets: :func:`engine.overload.batch_strides`."""
        out.strides, out.degraded = batch_strides(self.overload.level, self._budgets, self.L, strides)
        self._grid = by_stride(out.strides)

    def budgets(self) -> dict[str, int]:
        """The staleness budgets (ms) of the active subscriptions that declared one."""
        return dict(self._budgets)

    def observe_load(self, load: float | None, marks: Marks) -> None:
        """Feed the overload controller a batch's utilisation (evaluation time / trigger interval,
        :func:`engine.overload.decide`); the next batch's strides follow its level."""
        self.overload = decide(self.overload, load, len(ladder(self._budgets, self.L)), marks)

    def _value_columns(self, wanted: Mapping[str, list[str]], tau: int) -> ValueTable | dict[str, Any]:
        """The values of the alerts of many rules at ``tau``: a ``ValueTable`` from
        ``RuleEvaluator.value_table``, else ``{rule: (labels, columns)}`` from ``value_columns``, or
        ``{rule: {key: values}}`` from ``values_many`` (or ``values``, one rule at a time); a rule
        whose values are unavailable gets none and its alerts still go out (never lose an alert
        for a value)."""
        if not wanted:
            return {}
        ev = self.evaluator
        try:
            table, many = getattr(ev, "value_table", None), getattr(ev, "value_columns", None)
            if table is not None:
                return table(wanted, tau)  # type: ignore[no-any-return]
            return dict(many(wanted, tau) if many is not None else ev.values_many(wanted, tau))
        except Exception as exc:
            log.warning("values at %d unavailable in one pass (%s): trying rule by rule", tau, exc)
        out: dict[str, Any] = {}
        for sid, keys in wanted.items():
            try:
                out[sid] = dict(ev.values(sid, keys, tau))
            except Exception as exc:
                log.warning("values of subscription %s at %d unavailable: %s", sid, tau, exc)
                out[sid] = {}
        return out

    # ------------------------------------------------------------------ state
    @property
    def pending_events(self) -> int:
        return sum(len(p) for p in self.pending.values())

    def state_nbytes(self) -> int:
        """Approximate size of the state in bytes (the evaluator's ``nbytes`` and the pending events)."""
        n = int(self.evaluator.nbytes)
        for p in self.pending.values():
            n += sum(getattr(v, "nbytes", 0) for v in p.columns.values())
        for pp in self.panes.values():  # executors mode: the pending pane rows (arrays only)
            n += pp.pane.nbytes * 3 + pp.key_at.nbytes
            n += sum(sp.count.nbytes + sp.sum_hi.nbytes * 2 + sp.mins.nbytes * 4 for sp in pp.sets)
        return n

    def to_bytes(self) -> bytes:
        """Snapshot of the whole state (exact round trip with :meth:`from_bytes`): every attribute
        set in ``__init__`` but the callables (``_NOT_STATE``), the evaluator included, in the
        format of :mod:`engine.runtime.state_codec` (reading it cannot run code; no pickle)."""
        return state_codec.dumps(self._state())

    def capture(self, *, private_image: bool = False) -> Captured:
        """The first phase of :meth:`to_bytes` (:mod:`engine.runtime.state_capture`), between two
        batches: ``b"".join(self.capture().finish())`` is ``self.to_bytes()`` of now, wherever
        and whenever ``finish`` runs and however the state changes meanwhile.  Compacts the
        algorithm structures, as :meth:`to_bytes` does (no chart read meanwhile).  The nodes of
        the compiled rules of this core's previous capture are reused (:class:`CaptureCache`:
        the same bytes, cheaper).  ``private_image=True`` (the forked child that writes a
        snapshot: its image of the state never changes): nothing copied, the same bytes
        (:func:`~engine.runtime.state_capture.capture`)."""
        cache = _CAPTURE_CACHES.get(self)
        if cache is None:
            cache = _CAPTURE_CACHES[self] = CaptureCache()
        return capture(self._state(), cache, private_image=private_image)

    def _state(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k not in _NOT_STATE}

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        compile_rule: Callable[[str, Any], tuple[Any, str]],
        alert_cap: int = 0,
    ) -> EngineCore:
        """Restore a snapshot written by :meth:`to_bytes` (``compile_rule``: as for the constructor,
        e.g. :func:`rule_compiler`; ``alert_cap``: the setting, not part of the state).
        :class:`~engine.errors.SnapshotUnreadable` when this engine
        cannot read it (another state format, a class moved, renamed or not allowed, attributes
        this engine does not have, a damaged file)."""
        try:
            return cls._restore(data, compile_rule, alert_cap)
        except SnapshotUnreadable:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotUnreadable(f"{type(exc).__name__}: {exc}") from exc

    @classmethod
    def _restore(
        cls, data: bytes, compile_rule: Callable[[str, Any], tuple[Any, str]], alert_cap: int = 0
    ) -> EngineCore:
        """A core made by ``__init__`` (its defaults: an attribute a snapshot of an older engine
        lacks keeps them), then every attribute the snapshot holds."""
        state = state_codec.loads(data)
        if type(state) is not dict or "evaluator" not in state:
            raise SnapshotUnreadable("not the state of an engine core")
        ev = state["evaluator"]
        self = cls(
            pane_ms=state["g"],
            allowed_lateness_ms=state["lateness"],
            max_future_ms=state["max_future_ms"],
            evaluator_factory=lambda: ev,
            compile_rule=compile_rule,
            idle_timeout_ms=state.get("idle_timeout", 5_000),
            lookup_every_ms=state.get("L"),
            alert_cap=alert_cap,
        )
        unknown = set(state) - (set(vars(self)) - _NOT_STATE)
        if unknown:
            raise SnapshotUnreadable(
                f"the snapshot holds attributes this engine has not: {sorted(map(str, unknown))}"
            )
        vars(self).update(state)
        self.alert_cap = int(alert_cap)  # the setting now, not the one the snapshot was taken with
        return self


def default_core(settings: Any) -> EngineCore:
    """An empty :class:`EngineCore` with the shared-strategy evaluator configured by ``settings``
    (the driver's engine and every shard of the sharded one build theirs with it)."""
    return EngineCore(
        pane_ms=settings.pane_ms,
        allowed_lateness_ms=settings.allowed_lateness_ms,
        max_future_ms=settings.max_future_ms,
        idle_timeout_ms=getattr(settings, "engine_idle_timeout_ms", 5_000),
        lookup_every_ms=getattr(settings, "engine_lookup_every_ms", None),
        alert_cap=getattr(settings, "engine_alert_cap_per_lookup", 0),
        evaluator_factory=lambda: make_evaluator(settings),
        compile_rule=rule_compiler(settings),
    )
