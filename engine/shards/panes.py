"""A sharded micro-batch on pane rows: decode and (key, pane) pre-aggregation in the routing
tasks, the shards evaluate (issue #19 on the sharded mode of issue #23).

The routing tasks (:class:`engine.shards.route.Router`) run the default path's executor function
(:class:`engine.executors.preagg.Preaggregator`: Avro decode, validation, dead letters, the
one-pass (key, pane) pre-aggregation of every column set in use, Arasu & Widom 2004, section 4's
per-pane partial aggregates) over their Kafka records, with the batch's
:class:`~engine.executors.preagg.BatchParams`, and :func:`split_output` sends each shard the rows
it needs:

* ``pane`` and ``distinct`` rows to the shard owning their key (:func:`engine.shards.route.shard_of`
  of the row's key; a row of a (stream, key field) spec is keyed by that field, so ``packets``'
  destination-address rows go to the destination's shard -- no event reaches a shard for a key it
  does not own);
* ``dead`` rows to shard 0 (one dead letter each);
* ``partition`` rows (the batch's offset ranges and per-partition event-time extremes: the clock)
  and ``record`` rows (rule changes) to every shard -- every shard runs the whole batch's clock
  and every rule;
* ``event`` rows (the raw events of the streams a ROWS window or a new rule reads) split by key:
  an event to the shards of each of its key fields, as the record routing does.

So a shard's Python worker evaluates only: the decode and the pre-aggregation, per event, run in
every routing task in parallel, and the shard merges the tasks' partial rows exactly
(:func:`engine.executors.output.merge_output`) and runs
:meth:`engine.core.EngineCore.process_preaggregated` -- the default path's evaluation, whose
output equals the driver path's bit for bit (tests/engine/executors).

**The parameters.** A batch's parameters are the shards' state after the batch before (pane
specs, the ``late`` bound, the watermark: :meth:`EngineCore.batch_params`), the same in every shard
(every shard holds every rule and runs the whole batch's clock).  Each shard sends the next
batch's in its output (:attr:`engine.shards.step.ShardMeta.next_params`, opaque bytes); the driver
hands shard 0's to the next batch's tasks as the task-local property :data:`PARAMS_PROPERTY`
(as the default path does, :mod:`engine.executors.collect`), without reading them.  A shard takes
pane rows only when they were made with exactly the parameters its own state gives
(:func:`params_match`); otherwise -- the first batch after the driver starts, a routing task
without the property, parameters of another lineage -- it reads its batch's records again from
Kafka by the batch's offset ranges and pre-aggregates them itself (:func:`shard_rows`): the same
rows, as the pre-aggregation is a pure function of the records and the parameters.  The same
re-read rebuilds a shard from its snapshot (:mod:`engine.shards.processor`).

Pure functions, no Spark (the task-local property read by :func:`task_params` only).
"""

from __future__ import annotations

import base64
import hashlib
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.decode import Decoded
from engine.executors.history import HistoryIndex
from engine.executors.output import merge_output
from engine.executors.preagg import (
    KINDS,
    OUTPUT_SCHEMA,
    BatchParams,
    Preaggregator,
    ipc_bytes,
    ipc_table,
    params_property,
)
from engine.messages import BatchOutput
from engine.shards.route import held_by, key_owners, shard_of

__all__ = [
    "PARAMS_PROPERTY",
    "event_partitions",
    "owned_events",
    "owned_source",
    "params_bytes",
    "params_match",
    "params_tag",
    "property_value",
    "run_shard_panes",
    "shard_rows",
    "split_output",
    "task_params",
]

#: the task-local property carrying a sharded batch's parameters to its routing tasks:
#: ``<batch id>:<base64 of the pickled BatchParams>`` (:func:`params_bytes`)
PARAMS_PROPERTY = "tidewatch.shards.params"

EventSource = Callable[[str, HistoryIndex, "int | None", "int | None"], Decoded]


def params_bytes(params: BatchParams) -> bytes:
    """``params`` as the shards send them to the driver (which passes them on unread)."""
    return base64.b64encode(pickle.dumps(params))


def property_value(batch_id: int, blob: bytes) -> str:
    """The :data:`PARAMS_PROPERTY` value giving batch ``batch_id`` the parameters ``blob``
    (:func:`params_bytes`)."""
    return f"{int(batch_id)}:{blob.decode('ascii')}"


def params_tag(value: str) -> str:
    """A short name of a :data:`PARAMS_PROPERTY` value: its batch and a digest of its parameters."""
    batch, _, body = value.partition(":")
    return f"{batch}:{hashlib.sha256(body.encode('ascii')).hexdigest()[:32]}"


def task_params() -> tuple[str, BatchParams] | None:
    """(:func:`params_tag`, parameters) the driver gave the running task's batch; None without
    them, or when they name another batch than the task's (a stale property)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    got = params_property(PARAMS_PROPERTY)
    if tc is None or got is None or got[0] != tc.getLocalProperty("streaming.sql.batchId"):
        return None
    return params_tag(str(tc.getLocalProperty(PARAMS_PROPERTY))), got[1]


def params_match(made: list[str | None], given: tuple[str, BatchParams] | None, own: BatchParams) -> bool:
    """Whether a shard takes its pane rows: every routing task's rows were made (``made``: each
    task's tag, None for a task that routed records) with the parameters the driver gave the
    batch (``given``: :func:`task_params` in the shard's task), and those are ``own``, the
    parameters of the shard's state."""
    return given is not None and bool(made) and all(m == given[0] for m in made) and given[1] == own


def event_partitions(out: pa.Table, params: BatchParams) -> pa.Table:
    """A task's span table (:data:`engine.shards.route.SPAN_SCHEMA`) on pane rows: every stream
    partition it had records of, with the smallest and largest event time of its valid, not-late
    events (0 and 0 where it had none).  Only its partitions are read (the marks of partitions
    with records in Kafka and none here, :meth:`engine.shards.route.Router._marks`)."""
    from engine.executors.preagg import PARTITION_SCHEMA
    from engine.shards.route import SPAN_SCHEMA

    code = _kind_rows(out)
    blobs = out.column("payload").take(pa.array(np.flatnonzero(code == KINDS.index("partition")), pa.int64()))
    tables = [ipc_table(b) for b in blobs.to_pylist() if b is not None]
    part = pa.concat_tables(tables) if tables else PARTITION_SCHEMA.empty_table()
    stream_of = params.stream_of
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for s, t, p, lo, hi in zip(
        *(part.column(c).to_pylist() for c in ("stream", "topic", "partition", "ts_min", "ts_max")),
        strict=True,
    ):
        if s is not None:
            spans[(str(s), int(p))] = (int(lo), int(hi))
        elif t in stream_of:
            spans.setdefault((stream_of[str(t)], int(p)), (0, 0))
    keys = sorted(spans)
    return pa.table(
        {
            "stream": pa.array([k[0] for k in keys], pa.string()),
            "partition": pa.array([k[1] for k in keys], pa.int32()),
            "lo": pa.array([spans[k][0] for k in keys], pa.int64()),
            "hi": pa.array([spans[k][1] for k in keys], pa.int64()),
        },
        schema=SPAN_SCHEMA,
    )


def _kind_rows(tbl: pa.Table) -> np.ndarray:
    code = pc.index_in(tbl.column("kind"), value_set=pa.array(list(KINDS)))
    return np.asarray(code.to_numpy(zero_copy_only=False), np.int64)


def owned_events(d: Decoded, shard: int, n: int) -> Decoded:
    """The events of ``d`` with a key field (any of its stream's) owned by ``shard`` of ``n``."""
    if n <= 1 or not len(d):
        return d
    return d.take(held_by(key_owners(d.stream, d.columns.__getitem__, n), shard))


def _split_events(payload: bytes, stream: str, n: int) -> list[bytes | None]:
    """An ``event`` payload split by key: per shard the events with a key field it owns."""
    tbl = ipc_table(payload)
    owner = key_owners(stream, lambda k: tbl.column(k).to_numpy(zero_copy_only=False), n)
    out: list[bytes | None] = []
    for s in range(n):
        mine = held_by(owner, s)
        out.append(ipc_bytes(tbl.filter(pa.array(mine))) if mine.any() else None)
    return out


def split_output(tbl: pa.Table, n: int) -> list[pa.Table]:
    """Executor output rows (:data:`engine.executors.preagg.OUTPUT_SCHEMA`, one task's or many)
    split for ``n`` shards (module docstring): each shard's rows, in the input's order."""
    if n <= 1:
        return [tbl]
    code = _kind_rows(tbl)
    keyed = (code == KINDS.index("pane")) | (code == KINDS.index("distinct"))
    everyone = (code == KINDS.index("partition")) | (code == KINDS.index("record"))
    owner = np.full(tbl.num_rows, -1, np.int64)
    if keyed.any():
        keys = tbl.column("key").take(pa.array(np.flatnonzero(keyed), pa.int64()))
        owner[keyed] = shard_of(keys.to_numpy(zero_copy_only=False), n)
    owner[code == KINDS.index("dead")] = 0
    parts: list[list[pa.Table]] = [[] for _ in range(n)]
    for s in range(n):
        sel = np.flatnonzero(everyone | (owner == s))
        if len(sel):
            parts[s].append(tbl.take(pa.array(sel, pa.int64())))
    ev = np.flatnonzero(code == KINDS.index("event"))
    for i in ev.tolist():
        row = tbl.slice(i, 1)
        stream = str(row.column("stream")[0].as_py())
        for s, blob in enumerate(_split_events(row.column("payload")[0].as_py(), stream, n)):
            if blob is not None:
                parts[s].append(
                    row.set_column(row.schema.get_field_index("payload"), "payload", pa.array([blob]))
                )
    return [pa.concat_tables(p) if p else tbl.schema.empty_table() for p in parts]


def shard_rows(records: pa.Table, params: BatchParams, shard: int, n: int) -> pa.Table:
    """What the routing tasks would have sent ``shard`` of ``n`` for ``records`` (a whole batch's
    Kafka records, e.g. read again by offsets) with ``params``: their pre-aggregation here, split."""
    out = pa.Table.from_batches(list(Preaggregator(params)(records.to_batches())), schema=OUTPUT_SCHEMA)
    return split_output(out, n)[shard]


def owned_source(source: EventSource, shard: int, n: int) -> EventSource:
    """``source`` (the events a rule's history reads again from Kafka) kept to the events with a
    key field ``shard`` owns, as the routing sends them."""

    def read(stream: str, index: HistoryIndex, lo: int | None, hi: int | None) -> Decoded:
        return owned_events(source(stream, index, lo, hi), shard, n)

    return read


def run_shard_panes(
    core: Any,
    batch_id: int,
    shard: int,
    n: int,
    rows: pa.Table,
    params: BatchParams,
    waiting: list[tuple[str, int]],
    history: EventSource | None,
    strides: dict[str, int] | None = None,
) -> BatchOutput:
    """Shard ``shard`` of ``n`` runs batch ``batch_id`` on its executor rows (``rows``:
    :func:`split_output`'s, of tasks that all used ``params``, its :meth:`EngineCore.batch_params`):
    :meth:`EngineCore.process_preaggregated` with the rule changes the rows carry, ``waiting`` the
    partitions the routing found holding records without events here (:mod:`engine.shards.route`),
    ``history`` where events are read again (kept to this shard's keys: :func:`owned_source`).
    Every shard got every ``partition`` row, so the batch's events are counted by shard 0 only;
    alerts of keys another shard owns (events brought by a second key field, raw or read again)
    are dropped as :func:`engine.shards.step.run_shard` drops them."""
    from engine.shards.step import MULTI_KEY, drop_unowned
    from engine.sources.readers import subscription_changes

    eb = merge_output(rows, params, batch=batch_id)
    changes = subscription_changes(eb.records)
    src = None if history is None else owned_source(history, shard, n)
    out: BatchOutput = core.process_preaggregated(
        batch_id, eb, params, changes, waiting=waiting, history=src, strides=strides or {}
    )
    if shard != 0:
        out.events = {s: 0 for s in out.events}
    if n > 1:
        drop_unowned(out, shard, n, any(r.stream in MULTI_KEY for r in core.rules.values()))
    return out
