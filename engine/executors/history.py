"""A stream's past events, re-read from Kafka when a rule needs them (executors mode).

With ``engine_preaggregate = "executors"`` the driver receives pane rows, not events
(:mod:`engine.executors.preagg`).  Two moments still need a stream's events themselves:

* **PSoup backfill** (Chandrasekaran & Franklin 2002, section 3.2: a new query is answered at
  once over the data already held): a rule whose structures nobody had -- a new predicate, a
  new key field, a longer window -- is filled from the evaluator's retained history, and the
  pane rows retained there were aggregated for the column sets in use *then*.  The events of
  that history are re-read instead (:meth:`engine.evaluation.evaluator.Evaluator.add_rule`'s
  ``history``).
* **a spec change while events are pending**: the pending pane rows were made for the old
  column sets, so the stream is fed the pending events raw until they are applied
  (:meth:`engine.core.EngineCore.process_preaggregated`).

Kafka is the log: every batch's offset ranges are known (the batch log), so the events are
re-read by offsets, not kept in memory.  :class:`HistoryIndex` is the part of the engine's
state that makes the re-read exact: per batch still able to hold such events, its offset
ranges, its ``late`` bound (``EngineCore.applied_until`` at batch start: an event re-read is
taken iff the batch took it then) and its largest valid event time (to drop batches whose
events no rule can read any more).  :func:`history_events` is the pure function that turns
the records of those ranges into the events the batches took -- run by Spark's tasks live
(:func:`spark_history`, ``mapInArrow``) and in this process on a replay after a restart (the
records read by :func:`engine.sources.readers.read_ranges`), so both give the same events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from engine.dead_letter import DeadLetters
from engine.decode import Decoded, column_numpy, empty, finish, predecode
from engine.runtime.gc_tuning import freeze_worker

BATCH = "__batch"  #: the column of :func:`spark_history`'s output naming each event's batch


@dataclass
class HistoryIndex:
    """Per batch (engine batch id) whose events a rule may still need: ``ranges``
    (``{topic: {partition: [first, last]}}``, inclusive, as the batch log), ``late_until`` and
    ``max_ts`` (largest valid event time; None: no event).  Part of the engine's state
    (snapshotted with it)."""

    ranges: dict[int, dict[str, dict[str, list[int]]]] = field(default_factory=dict)
    late_until: dict[int, int | None] = field(default_factory=dict)
    max_ts: dict[int, int | None] = field(default_factory=dict)

    def add(
        self, batch: int, ranges: dict[str, dict[str, list[int]]], late_until: int | None, max_ts: int | None
    ) -> None:
        self.ranges[batch] = ranges
        self.late_until[batch] = late_until
        self.max_ts[batch] = max_ts

    def prune(self, bound: int | None) -> None:
        """Drop the batches none of whose events has ``ts > bound`` (``None``: keep all)."""
        if bound is None:
            return
        for b in [b for b, m in self.max_ts.items() if m is None or m <= bound]:
            del self.ranges[b], self.late_until[b], self.max_ts[b]

    def __len__(self) -> int:
        return len(self.ranges)

    def of_topic(self, topic: str) -> HistoryIndex:
        """The batches with records of ``topic`` (only that topic's ranges)."""
        out = HistoryIndex()
        for b, r in self.ranges.items():
            if r.get(topic):
                out.add(b, {topic: r[topic]}, self.late_until[b], self.max_ts[b])
        return out

    def span(self, topic: str) -> dict[str, list[int]]:
        """``{partition: [first, last]}``: the offsets to read for ``topic``'s batches (from the
        first to the last; records of batches no longer held are read and dropped)."""
        out: dict[str, list[int]] = {}
        for r in self.ranges.values():
            for p, (a, b) in r.get(topic, {}).items():
                lo, hi = out.get(p, (a, b))
                out[p] = [min(lo, a), max(hi, b)]
        return out

    def batch_of(self, topic: str, part: np.ndarray, offs: np.ndarray) -> np.ndarray:
        """The batch of each record (``-1``: none held), by its topic partition and offset."""
        out = np.full(len(offs), -1, np.int64)
        by_part: dict[int, list[tuple[int, int, int]]] = {}
        for b, r in self.ranges.items():
            for p, (a, z) in r.get(topic, {}).items():
                by_part.setdefault(int(p), []).append((int(a), int(z), int(b)))
        for pn, spans in by_part.items():
            sel = np.flatnonzero(part == pn)
            if not len(sel):
                continue
            spans.sort()
            starts = np.array([a for a, _, _ in spans], np.int64)
            ends = np.array([z for _, z, _ in spans], np.int64)
            ids = np.array([b for _, _, b in spans], np.int64)
            o = offs[sel]
            i = np.searchsorted(starts, o, "right") - 1
            ok = i >= 0
            ok[ok] = o[ok] <= ends[i[ok]]
            out[sel[ok]] = ids[i[ok]]
        return out


def history_events(
    records: pa.Table,
    index: HistoryIndex,
    stream: str,
    topic: str,
    *,
    lo: int | None,
    hi: int | None,
    max_future_ms: int | None,
) -> Decoded:
    """The events of ``stream`` in ``records`` (Kafka rows of ``topic``) that the batches of
    ``index`` took -- decoded, valid, not late for their batch (:func:`engine.decode.predecode`
    / :func:`engine.decode.finish`, the calls the batch made) -- with ``lo < ts <= hi`` (None:
    unbounded), in arrival order: batch, then (partition, offset)."""
    if records.num_rows == 0:
        return empty(stream)
    part = np.asarray(records.column("partition").to_numpy(zero_copy_only=False), np.int32)
    offs = np.asarray(records.column("offset").to_numpy(zero_copy_only=False), np.int64)
    batch = index.batch_of(topic, part, offs)
    out = []
    for b in np.unique(batch[batch >= 0]).tolist():
        rows = records.take(pa.array(np.flatnonzero(batch == b), pa.int64()))
        pre = predecode(stream, rows, max_future_ms=max_future_ms)
        d = finish(pre, late_until=index.late_until[b], dead=DeadLetters(), watermark=None)
        keep = np.ones(len(d), bool)
        if lo is not None:
            keep &= d.ts > lo
        if hi is not None:
            keep &= d.ts <= hi
        out.append((b, d if keep.all() else d.take(np.flatnonzero(keep))))
    return concat([d for _, d in out], stream)


def concat(parts: Iterable[Decoded], stream: str) -> Decoded:
    """Events one after the other (arrival order kept)."""
    parts = [d for d in parts if len(d)]
    if not parts:
        return empty(stream)
    if len(parts) == 1:
        return parts[0]
    return Decoded(
        stream,
        {k: np.concatenate([d.columns[k] for d in parts]) for k in parts[0].columns},
        np.concatenate([d.partition for d in parts]),
        np.concatenate([d.offset for d in parts]),
    )


class HistoryTask:
    """The function given to ``mapInArrow`` by :func:`spark_history`: Kafka rows in, the events
    :func:`history_events` keeps out (``event`` columns of ``stream`` plus :data:`BATCH`)."""

    def __init__(
        self,
        index: HistoryIndex,
        stream: str,
        topic: str,
        lo: int | None,
        hi: int | None,
        max_future_ms: int | None,
    ) -> None:
        self.index, self.stream, self.topic = index, stream, topic
        self.lo, self.hi, self.max_future_ms = lo, hi, max_future_ms

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker()  # PySpark's collection after the task: over this task's objects only
        tbl = pa.Table.from_batches(list(batches))
        if tbl.num_rows == 0:
            return
        d = history_events(
            tbl, self.index, self.stream, self.topic, lo=self.lo, hi=self.hi, max_future_ms=self.max_future_ms
        )
        if not len(d):
            return
        schema = event_table_schema(self.stream)
        b = self.index.batch_of(self.topic, d.partition, d.offset)  # each kept event's batch
        cols: dict[str, Any] = {"partition": pa.array(d.partition), "offset": pa.array(d.offset)}
        cols.update({n: pa.array(v, schema.field(n).type) for n, v in d.columns.items()})
        cols[BATCH] = pa.array(b)
        yield pa.RecordBatch.from_pydict(cols, schema=schema)


def event_table_schema(stream: str) -> pa.Schema:
    """:func:`engine.executors.preagg.event_schema` plus :data:`BATCH`."""
    from engine.executors.preagg import event_schema

    return event_schema(stream).append(pa.field(BATCH, pa.int64()))


def decoded_of(tbl: pa.Table, stream: str) -> Decoded:
    """:class:`Decoded` of :func:`spark_history`'s collected output, in arrival order."""
    if tbl.num_rows == 0:
        return empty(stream)
    order = np.lexsort(
        (
            column_numpy(tbl.column("offset").combine_chunks()),
            column_numpy(tbl.column("partition").combine_chunks()),
            column_numpy(tbl.column(BATCH).combine_chunks()),
        )
    )
    tbl = tbl.take(pa.array(order, pa.int64()))
    cols = {f: column_numpy(tbl.column(f).combine_chunks()) for f in list(empty(stream).columns)}
    part = np.asarray(column_numpy(tbl.column("partition").combine_chunks()), np.int32)
    offs = np.asarray(column_numpy(tbl.column("offset").combine_chunks()), np.int64)
    return Decoded(stream, cols, part, offs)


def spark_history(
    spark: Any,
    reader_options: dict[str, str],
    index: HistoryIndex,
    stream: str,
    topic: str,
    *,
    lo: int | None,
    hi: int | None,
    max_future_ms: int | None,
) -> Decoded:
    """:func:`history_events` through Spark: a batch read of Spark's Kafka source over
    ``index.span(topic)`` (``reader_options``: bootstrap, security, isolation), decoded and
    filtered in the executors (:class:`HistoryTask`); only the kept events reach the driver."""
    import json

    from engine.executors.preagg import KAFKA_COLUMNS, ddl_of

    idx = index.of_topic(topic)
    span = idx.span(topic)
    if not span:
        return empty(stream)
    start = {topic: {p: a for p, (a, _) in span.items()}}
    end = {topic: {p: b + 1 for p, (_, b) in span.items()}}  # endingOffsets is exclusive
    df = (
        spark.read.format("kafka")
        .options(**reader_options)
        .option("assign", json.dumps({topic: sorted(int(p) for p in span)}))
        .option("startingOffsets", json.dumps(start))
        .option("endingOffsets", json.dumps(end))
        .load()
    )
    task = HistoryTask(idx, stream, topic, lo, hi, max_future_ms)
    tbl = df.select(*KAFKA_COLUMNS).mapInArrow(task, ddl_of(event_table_schema(stream))).toArrow()
    return decoded_of(tbl, stream)


def records_source(
    read: Callable[[dict[str, dict[str, list[int]]]], pa.Table],
    topics: Mapping[str, str],
    max_future_ms: int | None,
) -> Callable[[str, HistoryIndex, int | None, int | None], Decoded]:
    """An ``EventSource`` (:data:`engine.core.EventSource`) that reads the records in this process
    -- ``read({topic: {partition: [first, last]}})`` gives them as Kafka rows (e.g.
    :func:`engine.sources.readers.read_ranges`, the replay's reader) -- and keeps the events with
    :func:`history_events`, as :func:`spark_history` does in Spark's tasks."""

    def source(stream: str, index: HistoryIndex, lo: int | None, hi: int | None) -> Decoded:
        topic = topics[stream]
        idx = index.of_topic(topic)
        span = idx.span(topic)
        if not span:
            return empty(stream)
        return history_events(
            read({topic: span}), idx, stream, topic, lo=lo, hi=hi, max_future_ms=max_future_ms
        )

    return source
