"""Routing a micro-batch's Kafka records to the shards that own their keys (issue #23).

A shard owns the keys ``k`` with :func:`shard_of` ``(k) == shard``: the CRC-32 of the key's UTF-8
text, modulo the number of shards ``n``.  Every rule is per key and every structure of the
evaluator is keyed by it (Arasu & Widom 2004, section 4: one collective index per (stream,
predicate, attribute), each entry a key), so a shard holding every event of its keys evaluates
every rule exactly for them, with no exchange between shards.

:class:`Router` is the ``mapInArrow`` function of the first stage (Spark tasks, one per Kafka
partition range): it decodes each stream's records with the engine's own decoder
(:func:`engine.decode.predecode`) to read their keys, and emits for every shard one row
(:data:`ROUTED_SCHEMA`) holding, as Arrow IPC:

* ``records``: the Kafka records (:data:`engine.sources.readers.RECORD_COLUMNS`) the shard needs --
  the valid events of its keys (an event of a stream with two key fields, ``packets``' source and
  destination address, goes to the shards of both), every ``subscriptions`` record (every rule
  reaches every shard) and, for shard 0, every record that does not decode or is invalid (the
  shard decodes them again and dead-letters them: one place, one dead letter each) -- with a
  ``primary`` flag: the event's first key field's shard, the one that counts it and dead-letters
  it if it is late;
* ``span``: per (stream, Kafka partition) the smallest and largest valid event time of the task's
  records, the same in every shard's row: each shard's clock is the whole batch's
  (:meth:`engine.core.EngineCore.process`'s ``span``), so every shard looks up at the same times.
  A task with valid events also marks (``lo = hi =`` :data:`PRESENT`) every other stream
  partition that holds records in Kafka (:func:`engine.sources.retention.partitions_with_records`,
  known once per worker): a partition none of whose events a shard has seen yet but which has
  records is *waiting* (:func:`engine.watermark.advance`) -- a Kafka transaction's records become
  readable partition by partition, and without the mark a batch reading one partition's first
  events would move the watermark past the events of a partition whose commit marker Spark had
  not seen yet, making them ``late`` (the driver's engine asks Kafka the same on the driver:
  ``EngineApp._waiting``).  The marks are in the span the shards log, so a rebuild decides the
  same way;
* ``ranges``: the task's Kafka offset ranges (JSON, :func:`engine.sources.readers.offset_ranges`),
  what a shard logs in Spark's state store to read the batch again if it must be rebuilt;
* ``panes`` and ``made``, on pane rows (``engine_shard_input = "panes"``, the default): when the
  driver gave the task the batch's parameters (:mod:`engine.shards.panes`), the task decodes and
  pre-aggregates its records instead of routing them -- ``records`` is null, ``panes`` the
  shard's rows of :data:`engine.executors.preagg.OUTPUT_SCHEMA` (Arrow IPC) and ``made`` the
  parameters' :func:`engine.shards.panes.params_tag`; the span then only marks partitions (its
  times are not read on this path).  Without parameters ``panes`` and ``made`` are null.

The shards decode their records again (the Avro decode is the cheap part, ~0.1 µs per record)
instead of receiving decoded columns: the records are what the driver path of the core takes,
and what a late dead letter carries.  Pure functions and a picklable class: no Spark here.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from engine.decode import STREAMS, predecode
from engine.runtime.gc_tuning import freeze_worker
from engine.sources.readers import RECORD_COLUMNS, offset_ranges

log = logging.getLogger("tidewatch.engine")

#: the first stage's output: one row per (task, shard)
ROUTED_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("records", pa.binary()),
        ("span", pa.binary()),
        ("ranges", pa.binary()),
        ("panes", pa.binary()),
        ("made", pa.string()),
    ]
)
ROUTED_DDL = "shard INT, records BINARY, span BINARY, ranges BINARY, panes BINARY, made STRING"
#: a span table: per (stream, partition) the smallest and largest valid event time
SPAN_SCHEMA = pa.schema(
    [("stream", pa.string()), ("partition", pa.int32()), ("lo", pa.int64()), ("hi", pa.int64())]
)
PRIMARY = "primary"  #: the routed records' flag column (see the module docstring)
#: ``lo`` and ``hi`` of a span row that only says "this partition holds records in Kafka"
PRESENT = -1
#: per worker and (bootstrap, topics): the (topic, partition)s known to hold records (once there,
#: always: a mark only matters before a partition's first event), every partition listed, and
#: when Kafka was last asked
_PRESENT: dict[tuple[str, tuple[str, ...]], tuple[set[tuple[str, int]], set[tuple[str, int]], float]] = {}
#: seconds between two questions to Kafka while a partition is not known to hold records (a
#: topic's first records), and once every one is (partitions added while running)
_ASK_EVERY_S = (1.0, 30.0)


def shard_of(keys: np.ndarray | list[str], n: int) -> np.ndarray:
    """The shard (0..n-1) of each key: CRC-32 of its UTF-8 text mod ``n``; computed once per
    distinct key (a batch has far fewer keys than events)."""
    if n <= 1 or not len(keys):
        return np.zeros(len(keys), np.int32)
    enc = pa.array(keys, pa.string()).dictionary_encode()
    uniq = enc.dictionary.to_pylist()
    of = np.fromiter((zlib.crc32(u.encode()) % n for u in uniq), np.int32, len(uniq))
    return of[np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int64)]


def ipc_bytes(tbl: pa.Table) -> bytes:
    """``tbl`` as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tbl.schema) as w:
        w.write_table(tbl)
    return sink.getvalue().to_pybytes()


def ipc_table(data: bytes) -> pa.Table:
    """The table of an Arrow IPC stream written by :func:`ipc_bytes`."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _flagged(tbl: pa.Table, primary: np.ndarray | bool) -> pa.Table:
    flag = np.full(tbl.num_rows, primary, np.bool_) if isinstance(primary, bool) else primary
    return tbl.append_column(PRIMARY, pa.array(flag, pa.bool_()))


def key_owners(stream: str, column: Callable[[str], np.ndarray], n: int) -> list[np.ndarray]:
    """The owning shard of each row's key, per key field of ``stream`` (``column``: field name ->
    its values as a NumPy array, e.g. a decoded batch's ``columns.__getitem__``)."""
    return [shard_of(column(k), n) for k in STREAMS[stream].keys]


def held_by(owners: list[np.ndarray], shard: int) -> np.ndarray:
    """The rows a shard gets: those with a key field it owns (``owners``: :func:`key_owners`)."""
    mine = owners[0] == shard
    for o in owners[1:]:
        mine = mine | (o == shard)
    return mine


@dataclass(frozen=True)
class Route:
    """One stream's records of a chunk, decoded: which rows go to which shard."""

    shards: list[np.ndarray]  #: per shard, the rows of the records it gets (sorted)
    primary: list[np.ndarray]  #: per shard, whether each of those rows is primary there
    span: dict[int, tuple[int, int]]  #: partition -> (smallest, largest) valid event time


def route_stream(stream: str, records: pa.Table, n: int, max_future_ms: int | None) -> Route:
    """Which rows of ``records`` (one stream's Kafka records) each of the ``n`` shards gets: the
    valid events to the shards of their keys, the rest (undecodable, invalid, future) to shard 0."""
    pre = predecode(stream, records, max_future_ms=max_future_ms)
    d = pre.decoded
    rows = np.arange(len(d)) if pre.rows is None else np.asarray(pre.rows, np.int64)
    owner = key_owners(stream, d.columns.__getitem__, n)
    bad = np.ones(records.num_rows, np.bool_)
    bad[rows] = False
    shards, primary = [], []
    for s in range(n):
        mine = held_by(owner, s)
        take = rows[mine]
        prim = (owner[0] == s)[mine]
        if s == 0 and bad.any():
            extra = np.flatnonzero(bad)
            take = np.concatenate([take, extra])
            prim = np.concatenate([prim, np.ones(len(extra), np.bool_)])
        order = np.argsort(take, kind="stable")
        shards.append(take[order])
        primary.append(prim[order])
    span: dict[int, tuple[int, int]] = {}
    if len(d):
        part, ts = d.partition, d.ts
        order = np.argsort(part, kind="stable")
        part, ts = part[order], ts[order]
        starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]])
        lo, hi = np.minimum.reduceat(ts, starts), np.maximum.reduceat(ts, starts)
        for p, a, b in zip(part[starts].tolist(), lo.tolist(), hi.tolist(), strict=True):
            span[int(p)] = (int(a), int(b))
    return Route(shards, primary, span)


def route_records(
    records: pa.Table, topics: dict[str, str], n: int, max_future_ms: int | None
) -> tuple[list[pa.Table], pa.Table]:
    """A chunk of Kafka records (any of the engine's topics, :data:`RECORD_COLUMNS`) split for
    ``n`` shards: each shard's records with the :data:`PRIMARY` flag, and the chunk's span table."""
    records = records.select(RECORD_COLUMNS)
    by_topic = {t: r for r, t in topics.items()}
    per_shard: list[list[pa.Table]] = [[] for _ in range(n)]
    spans: list[tuple[str, int, int, int]] = []
    topic_col = records.column("topic")
    for topic in pa.compute.unique(topic_col).to_pylist():
        part = records.filter(pa.compute.equal(topic_col, topic))
        role = by_topic.get(str(topic))
        if role == "subscriptions":
            for s in range(n):
                per_shard[s].append(_flagged(part, True))
            continue
        if role not in STREAMS:  # a topic the engine does not read: not subscribed, never here
            continue
        r = route_stream(role, part, n, max_future_ms)
        for s in range(n):
            if len(r.shards[s]):
                sel = part.take(pa.array(r.shards[s], pa.int64()))
                per_shard[s].append(_flagged(sel, r.primary[s]))
        spans += [(role, p, lo, hi) for p, (lo, hi) in r.span.items()]
    empty = _flagged(records.slice(0, 0), True)
    tables = [pa.concat_tables(t) if t else empty for t in per_shard]
    span = pa.table(
        {
            "stream": pa.array([x[0] for x in spans], pa.string()),
            "partition": pa.array([x[1] for x in spans], pa.int32()),
            "lo": pa.array([x[2] for x in spans], pa.int64()),
            "hi": pa.array([x[3] for x in spans], pa.int64()),
        },
        schema=SPAN_SCHEMA,
    )
    return tables, span


Ranges = dict[str, dict[str, list[int]]]  #: ``{topic: {partition: [first, last]}}`` (inclusive)


def merge_ranges(docs: Iterable[Ranges]) -> Ranges:
    """The offset ranges of a whole batch from its chunks' (each (topic, partition) from the
    smallest first to the largest last offset)."""
    out: Ranges = {}
    for doc in docs:
        for topic, parts in doc.items():
            mine = out.setdefault(topic, {})
            for p, (lo, hi) in parts.items():
                old = mine.get(p)
                mine[p] = [lo, hi] if old is None else [min(old[0], lo), max(old[1], hi)]
    return out


def merge_spans(tables: Iterable[pa.Table]) -> dict[tuple[str, int], tuple[int, int]]:
    """The span of a whole batch from its chunks' span tables: per (stream, partition) the
    smallest ``lo`` and largest ``hi`` (a partition's records may be split over several tasks);
    a partition only marked :data:`PRESENT` by the tasks is ``(PRESENT, PRESENT)``."""
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for t in tables:
        for s, p, lo, hi in zip(*(t.column(c).to_pylist() for c in SPAN_SCHEMA.names), strict=True):
            k = (str(s), int(p))
            old = out.get(k)
            if hi == PRESENT:
                out.setdefault(k, (PRESENT, PRESENT))
            elif old is None or old[1] == PRESENT:
                out[k] = (lo, hi)
            else:
                out[k] = (min(old[0], lo), max(old[1], hi))
    return out


def split_span(
    span: dict[tuple[str, int], tuple[int, int]],
) -> tuple[dict[tuple[str, int], tuple[int, int]], list[tuple[str, int]]]:
    """A batch's span as :meth:`engine.core.EngineCore.process` takes it: the partitions' event
    times, and the partitions only marked :data:`PRESENT` (``waiting``)."""
    times = {k: v for k, v in span.items() if v[1] != PRESENT}
    return times, sorted(k for k, v in span.items() if v[1] == PRESENT)


def present_partitions(bootstrap: str, settings: Any, topics: list[str]) -> set[tuple[str, int]]:
    """The (topic, partition)s of ``topics`` known to hold records, asked of Kafka
    (:func:`engine.sources.retention.partitions_with_records`) at most every
    :data:`_ASK_EVERY_S` seconds by this worker."""
    from engine.sources.retention import partitions_with_records, topic_partitions

    key = (bootstrap, tuple(topics))
    known, every, asked = _PRESENT.get(key, (set(), set(), float("-inf")))
    now = time.monotonic()
    if now - asked >= _ASK_EVERY_S[known >= every and bool(every)]:
        every = set(topic_partitions(bootstrap, settings, topics))
        known = known | set(partitions_with_records(bootstrap, settings, sorted(every - known)))
        _PRESENT[key] = (known, every, now)
    return known


class Router:
    """``mapInArrow`` function of the first stage: Kafka record batches -> :data:`ROUTED_SCHEMA`
    rows, one per shard and input batch (``labels[s]``: the grouping value Spark's hash
    partitioning sends to shuffle partition ``s``, :func:`engine.shards.query.shard_labels`).
    Picklable: plain attributes."""

    def __init__(
        self,
        topics: dict[str, str],
        labels: list[int],
        max_future_ms: int | None,
        bootstrap: str | None = None,
        settings: Any = None,
        panes: bool = False,
    ) -> None:
        self.topics, self.labels, self.max_future_ms = dict(topics), list(labels), max_future_ms
        #: pre-aggregate when the driver gives the batch's parameters (``engine_shard_input``)
        self.panes = panes
        #: where to ask which partitions hold records (None: no :data:`PRESENT` marks)
        self.bootstrap, self.settings = bootstrap, settings

    def _marks(self, span: pa.Table) -> pa.Table:
        """``span`` with a :data:`PRESENT` row for every stream partition that holds records in
        Kafka and has none in ``span`` (module docstring); ``span`` as it is when it has no
        event or Kafka cannot say (logged)."""
        if self.bootstrap is None or not span.num_rows:
            return span
        by_topic = {t: r for r, t in self.topics.items() if r in STREAMS}
        try:
            present = present_partitions(self.bootstrap, self.settings, sorted(by_topic))
        except Exception as exc:  # noqa: BLE001 -- the marks only hold the watermark back
            log.warning("cannot ask Kafka which partitions hold records (%s): no partition marked", exc)
            return span
        have = set(zip(span.column("stream").to_pylist(), span.column("partition").to_pylist(), strict=True))
        marks = sorted({(by_topic[t], p) for t, p in present if t in by_topic} - have)
        if not marks:
            return span
        extra = pa.table(
            {
                "stream": pa.array([m[0] for m in marks], pa.string()),
                "partition": pa.array([m[1] for m in marks], pa.int32()),
                "lo": pa.array([PRESENT] * len(marks), pa.int64()),
                "hi": pa.array([PRESENT] * len(marks), pa.int64()),
            },
            schema=SPAN_SCHEMA,
        )
        return pa.concat_tables([span, extra])

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker()  # PySpark's collection after the task: over this task's objects only
        chunks = [b for b in batches if b.num_rows]
        if not chunks:
            return
        records = pa.Table.from_batches(chunks)
        n = len(self.labels)
        given = self._params()
        blobs: list[bytes | None] = [None] * n
        panes: list[bytes | None] = [None] * n
        made = None
        if given is None:
            tables, span = route_records(records, self.topics, n, self.max_future_ms)
            blobs = [ipc_bytes(t) for t in tables]
        else:
            from engine.executors.preagg import Preaggregator
            from engine.shards.panes import event_partitions, split_output

            made, params = given
            out = pa.Table.from_batches(list(Preaggregator(params).process(records)))
            panes = [ipc_bytes(t) for t in split_output(out, n)]
            span = event_partitions(out, params)
        span_b = ipc_bytes(self._marks(span))
        ranges_b = json.dumps(offset_ranges(records)).encode()
        yield pa.RecordBatch.from_pydict(
            {
                "shard": pa.array(self.labels, pa.int32()),
                "records": pa.array(blobs, pa.binary()),
                "span": pa.array([span_b] * n, pa.binary()),
                "ranges": pa.array([ranges_b] * n, pa.binary()),
                "panes": pa.array(panes, pa.binary()),
                "made": pa.array([made] * n, pa.string()),
            },
            schema=ROUTED_SCHEMA,
        )

    def _params(self) -> tuple[str, Any] | None:
        """(tag, parameters) the driver gave this task's batch (:mod:`engine.shards.panes`); None
        when it gave none, or gave another batch's (a stale property), or when not in Spark."""
        if not self.panes:
            return None
        from engine.shards.panes import task_params

        return task_params()
