"""The executors' part of a micro-batch: Kafka records in, pane rows and dead letters out.

:class:`Preaggregator` is the function given to ``DataFrame.mapInArrow`` over Spark's Kafka
DataFrame (:func:`spark_preaggregate`).  It is a plain picklable object holding the batch's
:class:`BatchParams`, decided by the driver at the start of the batch; it maps an iterator of
Arrow record batches of Kafka rows (``topic, partition, offset, timestamp, key, value``) to
record batches of :data:`OUTPUT_SCHEMA`, and it reuses the driver's own code for every
per-event decision: :func:`engine.decode.predecode` / :func:`engine.decode.finish` (Avro
decode, validation, dead letters with reason, topic, partition, offset and raw bytes) and
:func:`engine.evaluation.panes.aggregate` (the one-pass (key, pane) pre-aggregation, every
column set of every key field in use), with the predicates evaluated by the evaluator's
:class:`~engine.evaluation.batches.BatchView`.  Nothing of that logic is written again here.

Which per-record decisions of today's driver (``EngineCore.process``) depend on driver state,
and how each is taken in the executor:

* ``undecodable`` / ``invalid`` / ``future`` -- functions of the record alone (its bytes and its
  Kafka timestamp; ``max_future_ms`` is configuration): :func:`engine.decode.predecode`, the
  same call the driver makes.
* ``late`` (``ts <= applied_until``, the engine's last lookup time) -- the driver reads
  ``applied_until`` *before* it looks at the batch's events (subscription changes applied first
  do not move it; only the lookups after the events do), so within a batch it is a constant:
  :attr:`BatchParams.late_until`, passed to :func:`engine.decode.finish` as the driver does.
* the ``watermark`` written into every dead letter -- ``EngineCore.watermark`` at batch start
  (it advances only after all of the batch's events are read): :attr:`BatchParams.watermark`.
* which records are events -- by topic (:attr:`BatchParams.topics`, stream -> topic); the
  records of any other topic (the subscriptions) are not events: they are passed through as
  ``record`` rows with their raw key and value, and parsed and applied on the driver, first,
  as today.
* the watermark's advance, *now*, which panes are due (``pane <= tau`` for a lookup time
  ``tau``, a multiple of the pane width: the same as ``ts <= tau`` for every event of the
  pane), what stays pending -- driver decisions over the whole batch; the executors send what
  they need: per (stream, partition) the number of valid, not-late events and their smallest
  and largest event time (``partition`` rows, what ``EngineCore._note_partitions`` reads), and
  per (topic, partition) the offset range of all records (what ``offset_ranges`` logs).
* FIRST / LAST ties -- the driver orders a pane's events by ``ts``, ties in arrival order:
  (partition, offset) within a batch (:func:`engine.decode.arrival_order`), older batches
  first across batches.  Each partial row carries the (ts, partition, offset) of the event its
  FIRST and its LAST come from (found by ``aggregate`` itself, through a pseudo column holding
  each event's arrival index), and the merge keeps the smallest / largest
  (ts, batch, partition, offset): the same event the driver picks.

So for the same records and the same parameters, the merged output equals today's driver path
bit for bit (see :mod:`engine.executors.merge` for the merge's contract and its two documented
orderings that are canonical instead: COUNT DISTINCT pairs within a row, and the sign of a
MIN/MAX over equal zeros ``0.0`` / ``-0.0``).

Output rows (:data:`OUTPUT_SCHEMA`; one schema, a ``kind`` column, ``pid`` = the worker's
``os.getpid()`` on every row; columns a kind does not use are null):

==========  ==================================================================================
kind        columns
==========  ==================================================================================
pane        ``spec`` (index into :attr:`BatchParams.panes`), ``cset``, ``key``, ``pane``, ``n``.
            ``cset = -1``: the (key, pane)'s total row -- ``n`` its events before any predicate,
            ``partition`` / ``offset`` its earliest event in arrival order (the key order of
            ``aggregate``: first seen), and the aggregates of the spec's first column set
            without a predicate (:attr:`KeySpec.inline`: its count is the total), which has no
            rows of its own.  ``cset = j >= 0``: column set ``j``, only where its
            count ``n`` > 0 -- ``sum_hi`` / ``sum_lo`` the exact sums of its ``sums`` fields as
            fixed128 words (:mod:`engine.algorithms.fixed128`: integers, no float, no DECIMAL),
            ``min`` / ``max`` / ``first`` / ``last`` lists in the order of its fields,
            ``first_ts`` / ``first_partition`` / ``first_offset`` and ``last_*`` the event FIRST
            and LAST come from (null when the set has no FIRST/LAST field).
distinct    ``spec``, ``cset``, ``dfield`` (index into the set's ``distinct`` fields), ``key``,
            ``pane``, the value in ``d_str`` / ``d_int`` / ``d_float`` (by the field's type),
            ``n`` its multiplicity.
dead        ``stream`` and ``payload``: an Arrow IPC stream of :data:`DEAD_SCHEMA` rows, one
            :class:`DeadLetters` entry each (topic, partition, offset, raw key and value bytes,
            reason, detail, event_ts, watermark).
partition   ``payload`` of :data:`PARTITION_SCHEMA`: per (topic, partition) of all records the
            offset range and count; per (stream, partition) of the valid, not-late events their
            number and smallest / largest event time.
event       ``stream`` and ``payload`` of :func:`event_schema` (``partition``, ``offset``, the
            decoded fields): the valid, not-late events of :attr:`BatchParams.raw_streams`,
            at most :data:`EVENT_BLOB_ROWS` a row.
record      ``payload`` of :data:`RECORD_SCHEMA`: records of topics that are not event streams,
            raw: ``topic``, ``partition``, ``offset``, ``timestamp`` (epoch ms), ``key``, ``value``.
==========  ==================================================================================

The low-volume kinds travel as IPC payloads (a few rows per task) so that the rows that are
many -- pane and distinct rows -- stay narrow: Spark turns ``mapInArrow``'s output into rows and
back for ``toArrow``, at a cost per column per row, null or not (measured on ``local[2]``, 1M
trades, 140k partial rows: 60 columns took 0.5-0.8 s more per batch than 21).

A task aggregates its whole input at once (up to :attr:`BatchParams.chunk_rows` records, then
per chunk), so it sends one partial row per (key, pane, column set) it saw -- with Spark's Kafka
source, one task per topic-partition.
"""

from __future__ import annotations

import base64
import os
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.dead_letter import DeadLetters
from engine.decode import Decoded, finish, kafka_ts_ms, predecode
from engine.errors import BatchParamsMismatch
from engine.evaluation.panes import ColumnSet, PaneRows, PaneSpec, aggregate
from engine.runtime.gc_tuning import freeze_worker
from tidewatch.schema import STREAMS as STREAM_FIELDS

KAFKA_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value")
KINDS = ("pane", "distinct", "dead", "partition", "event", "record")
TOTAL = -1  #: ``cset`` of a (key, pane)'s total row
ROW = "__row"  #: pseudo column given to ``aggregate``: each event's arrival index in the chunk
_ARRIVAL = "\x00arrival"  #: pseudo column set: per (key, pane) the smallest arrival index

_ARROW_OF = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}


OUTPUT_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("pid", pa.int64()),
        ("spec", pa.int32()),
        ("cset", pa.int32()),
        ("key", pa.string()),
        ("pane", pa.int64()),
        ("n", pa.int64()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("sum_hi", pa.list_(pa.int64())),
        ("sum_lo", pa.list_(pa.int64())),
        ("min", pa.list_(pa.float64())),
        ("max", pa.list_(pa.float64())),
        ("first", pa.list_(pa.float64())),
        ("last", pa.list_(pa.float64())),
        ("first_ts", pa.int64()),
        ("first_partition", pa.int32()),
        ("first_offset", pa.int64()),
        ("last_ts", pa.int64()),
        ("last_partition", pa.int32()),
        ("last_offset", pa.int64()),
        ("dfield", pa.int32()),
        ("d_str", pa.string()),
        ("d_int", pa.int64()),
        ("d_float", pa.float64()),
        ("stream", pa.string()),
        ("payload", pa.binary()),
    ]
)

#: ``dead`` payload: one :class:`DeadLetters` entry a row
DEAD_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kafka_key", pa.binary()),
        ("value", pa.binary()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("event_ts", pa.int64()),
        ("watermark", pa.int64()),
    ]
)
#: ``partition`` payload: per (topic, partition) of all records ``offset`` (smallest),
#: ``offset_max``, ``records``; per (stream, partition) of the valid, not-late events ``n``,
#: ``ts_min``, ``ts_max`` (separate rows; the driver groups them)
PARTITION_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("offset_max", pa.int64()),
        ("records", pa.int64()),
        ("n", pa.int64()),
        ("ts_min", pa.int64()),
        ("ts_max", pa.int64()),
    ]
)
#: ``record`` payload: the Kafka records of other topics (``engine.app.RECORD_COLUMNS``)
RECORD_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)
EVENT_BLOB_ROWS = 200_000  #: raw events per ``event`` payload


def event_schema(stream: str) -> pa.Schema:
    """``event`` payload of ``stream``: ``partition``, ``offset`` and the decoded fields."""
    fields = STREAM_FIELDS[stream].fields
    return pa.schema(
        [("partition", pa.int32()), ("offset", pa.int64())]
        + [(name, _ARROW_OF[f.type]) for name, f in fields.items()]
    )


def ipc_bytes(tbl: pa.Table | pa.RecordBatch) -> bytes:
    """A table as an Arrow IPC stream (a ``payload``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tbl.schema) as w:
        w.write(tbl)
    return bytes(sink.getvalue().to_pybytes())


def ipc_table(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(payload).read_all()


def _ddl_type(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"array<{_ddl_type(t.value_type)}>"
    return {
        pa.string(): "string",
        pa.binary(): "binary",
        pa.int32(): "int",
        pa.int64(): "bigint",
        pa.float64(): "double",
    }[t]


#: :data:`OUTPUT_SCHEMA` as Spark DDL (the schema argument of ``mapInArrow``)
def ddl_of(schema: pa.Schema) -> str:
    """Spark's DDL string of an Arrow schema (``mapInArrow``'s output schema)."""
    return ", ".join(f"`{f.name}` {_ddl_type(f.type)}" for f in schema)


OUTPUT_DDL = ddl_of(OUTPUT_SCHEMA)


# ---------------------------------------------------------------- what the driver decides
@dataclass(frozen=True)
class SetSpec:
    """One column set of a key field's pane spec (an :class:`engine.evaluation.panes.ColumnSet`
    whose predicate is the rule AST's row condition, so it pickles: ``None`` = every event)."""

    name: str
    predicate: Any = None  # subscriptions.rule_ast RowCond | None
    sums: tuple[str, ...] = ()
    minmax: tuple[str, ...] = ()
    firstlast: tuple[str, ...] = ()
    distinct: tuple[str, ...] = ()


@dataclass(frozen=True)
class KeySpec:
    """What to pre-aggregate for one (stream, key field): ``Evaluator.pane_spec(stream, key)``."""

    stream: str
    key: str
    sets: tuple[SetSpec, ...]

    @property
    def inline(self) -> int | None:
        """The first column set without a predicate (its count is the total), whose aggregates
        ride in the total rows instead of rows of their own; None when every set has one."""
        return next((j for j, s in enumerate(self.sets) if s.predicate is None), None)


@dataclass(frozen=True)
class BatchParams:
    """Everything a task needs, decided by the driver at the start of the batch (constants)."""

    pane_ms: int
    #: (stream, topic) of each event stream; records of other topics pass through (``record``)
    topics: tuple[tuple[str, str], ...]
    max_future_ms: int
    panes: tuple[KeySpec, ...] = ()
    #: ``EngineCore.applied_until`` at batch start: events with ``ts <=`` it are ``late``
    late_until: int | None = None
    #: ``EngineCore.watermark`` at batch start: written into every dead letter
    watermark: int | None = None
    #: streams whose valid events are sent raw too (ROWS windows, a new rule's history)
    raw_streams: frozenset[str] = frozenset()
    #: records a task aggregates at once (its memory bound); more make one more partial row
    #: per (key, pane) seen in several chunks
    chunk_rows: int = 2_000_000

    @property
    def topic_of(self) -> dict[str, str]:
        return dict(self.topics)

    @property
    def stream_of(self) -> dict[str, str]:
        return {t: s for s, t in self.topics}


def batch_params(
    *,
    pane_ms: int,
    topics: Mapping[str, str],
    max_future_ms: int,
    panes: Iterable[KeySpec] = (),
    late_until: int | None = None,
    watermark: int | None = None,
    raw_streams: Iterable[str] = (),
    chunk_rows: int = 2_000_000,
) -> BatchParams:
    """:class:`BatchParams` from a ``{stream: topic}`` mapping (only event streams kept)."""
    return BatchParams(
        pane_ms=int(pane_ms),
        topics=tuple((s, t) for s, t in topics.items() if s in STREAM_FIELDS),
        max_future_ms=int(max_future_ms),
        panes=tuple(panes),
        late_until=None if late_until is None else int(late_until),
        watermark=None if watermark is None else int(watermark),
        raw_streams=frozenset(raw_streams),
        chunk_rows=int(chunk_rows),
    )


def key_specs(evaluator: Any, streams: Iterable[str] | None = None) -> tuple[tuple[KeySpec, ...], set[str]]:
    """The pane specs of every (stream, key field) an ``Evaluator(pane_ms=...)`` uses, and the
    streams one of whose specs ``needs_raw`` -- read after the batch's subscription changes.

    Names and fields come from the public ``Evaluator.pane_specs``; the row conditions (which
    the spec holds as closures, not picklable) from the key states' ``column_sets()``, which
    ``pane_specs`` walks in the same order."""
    specs: list[KeySpec] = []
    raw: set[str] = set()
    for stream in streams if streams is not None else sorted({st.stream for st in evaluator.states.values()}):
        states = [st for st in evaluator.states.values() if st.stream == stream]
        for st, spec in zip(states, evaluator.pane_specs(stream), strict=True):
            conds = [pred for pred, _ in st.column_sets()]
            sets = tuple(
                SetSpec(
                    cs.name, cond, tuple(cs.sums), tuple(cs.minmax), tuple(cs.firstlast), tuple(cs.distinct)
                )
                for cs, cond in zip(spec.column_sets, conds, strict=True)
            )
            specs.append(KeySpec(stream, spec.key, sets))
            if getattr(spec, "needs_raw", False):
                raw.add(stream)
    return tuple(specs), raw


def _batch_view() -> Any:
    try:
        from engine.evaluation.batches import BatchView
    except ImportError:  # the evaluator before its split into modules
        from engine.evaluation.evaluator import BatchView  # type: ignore[attr-defined,no-redef]
    return BatchView


@dataclass(frozen=True)
class _Masked:
    """A column set's predicate: the mask of row condition ``cond`` from ``mask`` (a batch's
    cached ``BatchView.mask``), whatever columns ``aggregate`` passes (the same batch's)."""

    mask: Callable[[Any], np.ndarray | None]
    cond: Any

    def __call__(self, _cols: Any) -> np.ndarray:
        m = self.mask(self.cond)
        assert m is not None
        return m


def column_sets(ks: KeySpec, mask: Callable[[Any], np.ndarray | None]) -> tuple[ColumnSet, ...]:
    """The :class:`ColumnSet` of each :class:`SetSpec` of ``ks`` (``mask``: row condition -> mask,
    e.g. ``BatchView.mask``) -- what ``Evaluator.pane_spec`` gives the driver's ``aggregate``."""
    return tuple(
        ColumnSet(
            s.name,
            None if s.predicate is None else _Masked(mask, s.predicate),
            sums=s.sums,
            minmax=s.minmax,
            firstlast=s.firstlast,
            distinct=s.distinct,
        )
        for s in ks.sets
    )


# ---------------------------------------------------------------- the mapInArrow function
class Preaggregator:
    """``mapInArrow`` function: Kafka record batches -> :data:`OUTPUT_SCHEMA` batches (module
    docstring).  Picklable (a module-level class holding frozen dataclasses).  ``token``: written
    into the schema metadata (:data:`TOKEN_KEY`) of its payloads when not empty."""

    def __init__(self, params: BatchParams, token: str = "") -> None:
        self.params = params
        self.token = token

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker()  # PySpark's collection after the task: over this task's objects only
        pending: list[pa.RecordBatch] = []
        n = 0
        for b in batches:
            if b.num_rows == 0:
                continue
            pending.append(b)
            n += b.num_rows
            if n >= self.params.chunk_rows:
                yield from self.process(pa.Table.from_batches(pending))
                pending, n = [], 0
        if pending:
            yield from self.process(pa.Table.from_batches(pending))

    # -------------------------------------------------------------- one chunk
    def process(self, records: pa.Table) -> Iterator[pa.RecordBatch]:
        """The output rows of one chunk of Kafka records (any topics, any order)."""
        if records.num_rows == 0:
            return
        p = self.params
        out = _Out(os.getpid(), self.token)
        yield out.offsets(records)
        topic = records.column("topic")
        for stream, name in p.topics:
            mask = pc.equal(topic, name)
            hits = pc.sum(mask).as_py() or 0
            if hits:
                recs = records if hits == records.num_rows else records.filter(mask)
                yield from self._stream(out, stream, recs)
        others = pc.invert(pc.is_in(topic, value_set=pa.array([t for _, t in p.topics], pa.string())))
        if pc.any(others).as_py():
            yield out.records(records.filter(others))

    def _stream(self, out: _Out, stream: str, records: pa.Table) -> Iterator[pa.RecordBatch]:
        p = self.params
        pre = predecode(stream, records, max_future_ms=p.max_future_ms)
        dead = DeadLetters()
        d = finish(pre, late_until=p.late_until, dead=dead, watermark=p.watermark)
        if len(dead):
            yield out.dead(stream, dead)
        if not len(d):
            return
        yield out.partitions(stream, d)
        if stream in p.raw_streams:
            yield from out.events(stream, d)
        cols = dict(d.columns)
        cols[ROW] = np.arange(len(d), dtype=np.int64)
        view = _batch_view()(stream, cols)  # predicate masks cached across key fields
        for i, ks in enumerate(p.panes):
            if ks.stream == stream:
                yield from self._panes(out, i, ks, d, cols, view)

    def _panes(
        self, out: _Out, i: int, ks: KeySpec, d: Decoded, cols: dict[str, np.ndarray], view: Any
    ) -> Iterator[pa.RecordBatch]:
        sets = list(column_sets(ks, view.mask))
        for j, cs in enumerate(sets):  # FIRST/LAST: which event they come from, by arrival index
            if cs.firstlast:
                sets[j] = ColumnSet(
                    cs.name, cs.predicate, cs.sums, cs.minmax, (*cs.firstlast, ROW), cs.distinct
                )
        sets.append(ColumnSet(_ARRIVAL, None, minmax=(ROW,)))
        rows = aggregate(cols, PaneSpec(ks.key, tuple(sets)), self.params.pane_ms)
        yield from out.panes(i, ks, d, rows)


# ---------------------------------------------------------------- output rows
def _table(schema: pa.Schema, n: int, cols: Mapping[str, Any]) -> pa.Table:
    """A table of ``schema`` from the given columns (the others null)."""
    arrays = []
    for f in schema:
        v = cols.get(f.name)
        if v is None:
            arrays.append(pa.nulls(n, f.type))
        else:
            arr = v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v
            arrays.append(arr if arr.type == f.type else arr.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _lists(mat: np.ndarray, typ: pa.DataType) -> pa.Array | None:
    """A (rows, fields) matrix as a list column (None: no fields)."""
    r, f = mat.shape
    if f == 0:
        return None
    offsets = pa.array(np.arange(0, r * f + 1, f, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(mat).ravel(), typ))


class _Out:
    """Builds :data:`OUTPUT_SCHEMA` record batches (absent columns null); ``token``: written
    into the schema metadata of every payload (:data:`TOKEN_KEY`) when not empty."""

    def __init__(self, pid: int, token: str = "") -> None:
        self.pid = pid
        self.token = token

    def batch(self, kind: str, nrows: int, /, **cols: Any) -> pa.RecordBatch:
        arrays = []
        for f in OUTPUT_SCHEMA:
            if f.name == "kind":
                arrays.append(pa.array(np.full(nrows, kind, dtype=object), pa.string()))
            elif f.name == "pid":
                arrays.append(pa.array(np.full(nrows, self.pid, np.int64)))
            else:
                v = cols.get(f.name)
                if v is None:
                    arrays.append(pa.nulls(nrows, f.type))
                elif isinstance(v, pa.ChunkedArray):
                    arrays.append(v.combine_chunks().cast(f.type))
                elif isinstance(v, pa.Array):
                    arrays.append(v if v.type == f.type else v.cast(f.type))
                elif isinstance(v, str | int | bytes) and not isinstance(v, bool):
                    arrays.append(pa.array([v] * nrows, f.type))
                else:
                    arrays.append(pa.array(v, f.type))
        return pa.RecordBatch.from_arrays(arrays, schema=OUTPUT_SCHEMA)

    def blob(self, kind: str, stream: str | None, tbl: pa.Table) -> pa.RecordBatch:
        """One row carrying ``tbl`` as an Arrow IPC ``payload`` (the low-volume kinds: no
        column of theirs widens the rows every pane row travels in)."""
        if self.token:  # which call's parameters made it (collect_preaggregated checks it)
            tbl = tbl.replace_schema_metadata({TOKEN_KEY: self.token})
        return self.batch(kind, 1, stream=stream, payload=ipc_bytes(tbl))

    def offsets(self, records: pa.Table) -> pa.RecordBatch:
        g = (
            records.select(["topic", "partition", "offset"])
            .group_by(["topic", "partition"])
            .aggregate([("offset", "min"), ("offset", "max"), ("offset", "count")])
        )
        cols = {
            "topic": g.column("topic"),
            "partition": g.column("partition"),
            "offset": g.column("offset_min"),
            "offset_max": g.column("offset_max"),
            "records": g.column("offset_count"),
        }
        return self.blob("partition", None, _table(PARTITION_SCHEMA, g.num_rows, cols))

    def records(self, records: pa.Table) -> pa.RecordBatch:
        cols = {
            "topic": records.column("topic"),
            "partition": records.column("partition"),
            "offset": records.column("offset"),
            "timestamp": pa.array(kafka_ts_ms(records.column("timestamp")))
            if "timestamp" in records.column_names
            else None,
            "key": records.column("key") if "key" in records.column_names else None,
            "value": records.column("value"),
        }
        return self.blob("record", None, _table(RECORD_SCHEMA, records.num_rows, cols))

    def dead(self, stream: str, dead: DeadLetters) -> pa.RecordBatch:
        cols = {
            "stream": pa.array([stream] * len(dead), pa.string()),
            "topic": pa.array(dead.source_topic, pa.string()),
            "partition": pa.array(dead.source_partition, pa.int32()),
            "offset": pa.array(dead.source_offset, pa.int64()),
            "kafka_key": pa.array(dead.key, pa.binary()),
            "value": pa.array(dead.value, pa.binary()),
            "reason": pa.array(dead.reason, pa.string()),
            "detail": pa.array(dead.detail, pa.string()),
            "event_ts": pa.array(dead.event_ts, pa.int64()),
            "watermark": pa.array(dead.watermark, pa.int64()),
        }
        return self.blob("dead", stream, _table(DEAD_SCHEMA, len(dead), cols))

    def partitions(self, stream: str, d: Decoded) -> pa.RecordBatch:
        """Per partition of ``d`` (in (partition, offset) order): events, smallest and largest ts."""
        part = d.partition
        starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]])
        cols = {
            "stream": pa.array([stream] * len(starts), pa.string()),
            "partition": pa.array(part[starts], pa.int32()),
            "n": pa.array(np.diff(np.r_[starts, len(part)]).astype(np.int64)),
            "ts_min": pa.array(np.minimum.reduceat(d.ts, starts)),
            "ts_max": pa.array(np.maximum.reduceat(d.ts, starts)),
        }
        return self.blob("partition", stream, _table(PARTITION_SCHEMA, len(starts), cols))

    def events(self, stream: str, d: Decoded) -> Iterator[pa.RecordBatch]:
        schema = event_schema(stream)
        for a in range(0, len(d), EVENT_BLOB_ROWS):
            part = d if len(d) <= EVENT_BLOB_ROWS else d.take(np.arange(a, min(a + EVENT_BLOB_ROWS, len(d))))
            cols = {"partition": pa.array(part.partition), "offset": pa.array(part.offset)}
            cols.update({name: pa.array(v, schema.field(name).type) for name, v in part.columns.items()})
            yield self.blob("event", stream, _table(schema, len(part), cols))

    def panes(self, i: int, ks: KeySpec, d: Decoded, rows: PaneRows) -> Iterator[pa.RecordBatch]:
        keys = pa.array(rows.keys, pa.string())
        earliest = rows.sets[_ARRIVAL].mins[ROW].astype(np.int64)
        every = np.arange(len(rows))
        inline = ks.inline
        yield self.batch(
            "pane",
            len(rows),
            spec=i,
            cset=TOTAL,
            key=keys,
            pane=rows.pane,
            n=rows.total,
            partition=d.partition[earliest],
            offset=d.offset[earliest],
            **(
                {}
                if inline is None
                else _set_columns(ks.sets[inline], rows.sets[ks.sets[inline].name], every, d)
            ),
        )
        fields = STREAM_FIELDS[ks.stream].fields
        for j, s in enumerate(ks.sets):
            agg = rows.sets[s.name]
            if j != inline:
                sel = np.flatnonzero(agg.count > 0)
                if len(sel):
                    yield self.batch(
                        "pane",
                        len(sel),
                        spec=i,
                        cset=j,
                        key=keys.take(pa.array(sel, pa.int64())),
                        pane=rows.pane[sel],
                        n=agg.count[sel],
                        **_set_columns(s, agg, sel, d),
                    )
            for k, f in enumerate(s.distinct):
                r, v, mult = agg.distinct[f]
                r = np.asarray(r, np.int64)
                typ = fields[f].type
                col = {"str": "d_str", "int": "d_int", "float": "d_float"}[typ]
                yield self.batch(
                    "distinct",
                    len(r),
                    spec=i,
                    cset=j,
                    dfield=k,
                    key=keys.take(pa.array(r, pa.int64())),
                    pane=rows.pane[r],
                    n=np.asarray(mult, np.int64),
                    **{col: pa.array(np.asarray(v) if typ != "str" else v, _ARROW_OF[typ])},
                )


def _set_columns(s: SetSpec, agg: Any, sel: np.ndarray, d: Decoded) -> dict[str, Any]:
    """The list columns (and FIRST/LAST's events) of column set ``s`` for the rows ``sel``."""
    cols: dict[str, Any] = {}
    if s.sums:
        cols["sum_hi"] = _lists(np.column_stack([agg.exact[f][0][sel] for f in s.sums]), pa.int64())
        cols["sum_lo"] = _lists(np.column_stack([agg.exact[f][1][sel] for f in s.sums]), pa.int64())
    if s.minmax:
        cols["min"] = _lists(np.column_stack([agg.mins[f][sel] for f in s.minmax]), pa.float64())
        cols["max"] = _lists(np.column_stack([agg.maxs[f][sel] for f in s.minmax]), pa.float64())
    if s.firstlast:
        cols["first"] = _lists(np.column_stack([agg.first[f][sel] for f in s.firstlast]), pa.float64())
        cols["last"] = _lists(np.column_stack([agg.last[f][sel] for f in s.firstlast]), pa.float64())
        fi = agg.first[ROW][sel].astype(np.int64)
        li = agg.last[ROW][sel].astype(np.int64)
        cols.update(
            first_ts=d.ts[fi],
            first_partition=d.partition[fi],
            first_offset=d.offset[fi],
            last_ts=d.ts[li],
            last_partition=d.partition[li],
            last_offset=d.offset[li],
        )
    return cols


def preaggregate(records: pa.Table | Iterable[pa.RecordBatch], params: BatchParams) -> pa.Table:
    """The output of :class:`Preaggregator` on ``records`` in this process, as one table
    (tests, benchmarks; ``records`` as one task's input)."""
    batches = records.to_batches() if isinstance(records, pa.Table) else records
    return pa.Table.from_batches(list(Preaggregator(params)(batches)), schema=OUTPUT_SCHEMA)


def spark_preaggregate(df: Any, params: BatchParams) -> Any:
    """``df`` (Spark's Kafka source, batch or micro-batch DataFrame) through the executors with
    a function made for this call: ``mapInArrow(Preaggregator(params), OUTPUT_DDL)``, lazy.
    The engine uses :func:`engine.executors.collect.collect_preaggregated` (the same output,
    one function per Spark context); this form stays for the benchmarks and probes that
    compare the two."""
    return df.select(*KAFKA_COLUMNS).mapInArrow(Preaggregator(params), OUTPUT_DDL)


# ---------------------------------------------------------------- one function per context
#: the task-local property (``SparkContext.setLocalProperty``) carrying a batch's parameters
#: to the tasks of :func:`engine.executors.collect.collect_preaggregated`'s function:
#: ``token`` ``:`` base64(pickle)
PARAMS_PROPERTY = "tidewatch.preagg.params"
#: the schema-metadata key of a payload holding the token of the parameters it was made with
TOKEN_KEY = b"tidewatch.params_token"


class TaskParamsPreaggregator:
    """The ``mapInArrow`` function of :func:`engine.executors.collect.collect_preaggregated`,
    made once per Spark context: each task reads its batch's parameters and their token from
    the task's local property :data:`PARAMS_PROPERTY` and runs ``Preaggregator(params, token)``."""

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        token, params = _task_params()
        yield from Preaggregator(params, token)(batches)


def _task_params() -> tuple[str, BatchParams]:
    """(token, parameters) of the running task: its local property :data:`PARAMS_PROPERTY`."""
    got = params_property(PARAMS_PROPERTY)
    if got is None:
        raise BatchParamsMismatch(
            f"a task of the shared pre-aggregation ran without its parameters (no {PARAMS_PROPERTY!r} "
            "local property): run it through engine.executors.collect.collect_preaggregated"
        )
    return got


def params_property(name: str) -> tuple[str, BatchParams] | None:
    """The running task's local property ``name`` holding parameters, ``<head>:<base64 of the
    pickled BatchParams>`` (the driver's: :func:`engine.executors.collect.collect_preaggregated`,
    the sharded engine's :mod:`engine.shards.panes`), as (head, parameters); None outside a task
    or without it."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    raw = tc.getLocalProperty(name) if tc is not None else None
    if not raw:
        return None
    head, _, body = raw.partition(":")
    params = pickle.loads(base64.b64decode(body))
    assert isinstance(params, BatchParams)
    return head, params
