"""A batch's executor output, read by the driver: :func:`merge_output` turns the rows of
``mapInArrow(...).toArrow()`` (:mod:`engine.executors.collect`) into an :class:`ExecutorBatch`
-- the partial pane rows of each (stream, key field) merged exactly
(:class:`engine.executors.merge.PanePartial`), the dead letters in the driver path's order, the
events counted, the per-partition event-time maxima, the offset ranges, the raw events of the
streams that reach the driver raw, the subscription records and the tasks' process ids;
:func:`preaggregate_here` runs the executors' function in this process (a replay, the warm-up).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.dead_letter import REASONS, DeadLetters
from engine.decode import Decoded, arrival_order, column_numpy, empty
from engine.executors.merge import _I0, PanePartial, _Block, _combine
from engine.executors.preagg import (
    DEAD_SCHEMA,
    KINDS,
    PARTITION_SCHEMA,
    RECORD_SCHEMA,
    TOTAL,
    BatchParams,
    event_schema,
    ipc_table,
    preaggregate,
)

_PANE, _DISTINCT = KINDS.index("pane"), KINDS.index("distinct")
_REASON_RANK = {r: i for i, r in enumerate(("undecodable", "invalid", "future", "late", "lost"))}
assert set(_REASON_RANK) == set(REASONS)


def _np(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False)


def _ints(col: pa.ChunkedArray | pa.Array, fill: int = -1) -> np.ndarray:
    """An integer column as int64 (nulls -> ``fill``: never through float)."""
    return np.asarray(_np(col.fill_null(fill)), np.int64)


def _data(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An integer column's values as int64, read from its data buffers without looking at the
    validity (null slots hold whatever the buffer holds): only for rows known to be valid."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    out = []
    for c in chunks:
        dt = np.dtype(c.type.to_pandas_dtype())
        buf = c.buffers()[1]
        out.append(
            np.zeros(len(c), dt) if buf is None else np.frombuffer(buf, dt, len(c), c.offset * dt.itemsize)
        )
    return np.concatenate(out).astype(np.int64, copy=False) if out else _I0


class _Lists:
    """A list column as flat values + offsets: rows of a known width gathered without Arrow."""

    def __init__(self, col: pa.ChunkedArray | pa.Array, dtype: type) -> None:
        self.dtype = dtype
        offs, vals, base = [], [], 0
        for c in col.chunks if isinstance(col, pa.ChunkedArray) else [col]:
            o = np.asarray(_np(c.offsets), np.int64)  # into c.values, the whole child
            v: np.ndarray = np.asarray(_np(c.values), dtype)
            offs.append(o[:-1] + base)
            vals.append(v)
            base += len(v)
        self.offs = np.concatenate(offs) if offs else _I0
        self.vals = np.concatenate(vals) if vals else np.zeros(0, dtype)

    def rows(self, r: np.ndarray, width: int) -> np.ndarray:
        if width == 0:
            return np.zeros((len(r), 0), self.dtype)
        return self.vals[self.offs[r][:, None] + np.arange(width)]


def _at(ts: np.ndarray, batch: int, part: np.ndarray, off: np.ndarray) -> np.ndarray:
    out = np.empty((len(ts), 4), np.int64)
    out[:, 0], out[:, 1], out[:, 2], out[:, 3] = ts, batch, part, off
    return out


def _from_arrow(
    tbl: pa.Table, code: np.ndarray, params: BatchParams, batch: int
) -> dict[tuple[str, str], PanePartial]:
    """The pane and distinct rows of one batch's output (``code``: each row's kind), merged per
    key spec.  Columns are read once, whole, and rows picked in NumPy (no Arrow take)."""
    is_pane, is_dist = code == _PANE, code == _DISTINCT
    enc = tbl.column("key").combine_chunks().dictionary_encode()
    kc = _data(enc.indices)
    uniques = np.asarray(_np(enc.dictionary), dtype=object)
    # every row read below is a pane / distinct row, whose columns are valid: buffers as they are
    spec, cset, dfield = _data(tbl.column("spec")), _data(tbl.column("cset")), _data(tbl.column("dfield"))
    spec[~(is_pane | is_dist)] = -1
    pane, n = _data(tbl.column("pane")), _data(tbl.column("n"))
    part, off = _data(tbl.column("partition")), _data(tbl.column("offset"))
    fl = {
        c: _data(tbl.column(c))
        for c in ("first_ts", "first_partition", "first_offset", "last_ts", "last_partition", "last_offset")
    }
    lists = {
        c: _Lists(tbl.column(c), np.int64 if c.startswith("sum") else np.float64)
        for c in ("sum_hi", "sum_lo", "min", "max", "first", "last")
    }
    out: dict[tuple[str, str], PanePartial] = {}
    for i, ks in enumerate(params.panes):
        mine = spec == i
        t = np.flatnonzero(mine & is_pane & (cset == TOTAL))
        at = np.empty((len(t), 3), np.int64)
        at[:, 0], at[:, 1], at[:, 2] = batch, part[t], off[t]
        tot = _Block(kc[t], pane[t], (n[t], at))
        sets, dist = [], []
        for j, s in enumerate(ks.sets):
            aligned = j == ks.inline
            r = t if aligned else np.flatnonzero(mine & is_pane & (cset == j))
            if s.firstlast:
                fat = _at(fl["first_ts"][r], batch, fl["first_partition"][r], fl["first_offset"][r])
                lat = _at(fl["last_ts"][r], batch, fl["last_partition"][r], fl["last_offset"][r])
            else:
                fat = lat = np.zeros((len(r), 4), np.int64)
            f1, f2, f3 = len(s.sums), len(s.minmax), len(s.firstlast)
            cols = (
                n[r],
                lists["sum_hi"].rows(r, f1),
                lists["sum_lo"].rows(r, f1),
                lists["min"].rows(r, f2),
                lists["max"].rows(r, f2),
                lists["first"].rows(r, f3),
                lists["last"].rows(r, f3),
                fat,
                lat,
            )
            sets.append(_Block(kc[r], pane[r], cols, aligned))
            dblocks = []
            for k, f in enumerate(s.distinct):
                r = np.flatnonzero(mine & is_dist & (cset == j) & (dfield == k))
                typ = _field_type(ks.stream, f)
                vcol = tbl.column({"str": "d_str", "int": "d_int", "float": "d_float"}[typ]).take(
                    pa.array(r, pa.int64())
                )
                if typ == "str":
                    values = np.asarray(column_numpy(vcol.combine_chunks()), dtype=object)
                else:
                    values = np.asarray(_np(vcol), np.int64 if typ == "int" else np.float64)
                dblocks.append(_Block(kc[r], pane[r], (values, n[r])))
            dist.append(dblocks)
        out[(ks.stream, ks.key)] = _combine(ks, uniques, tot, sets, dist)
    return out


def _field_type(stream: str, name: str) -> str:
    from tidewatch.schema import STREAMS

    return STREAMS[stream].fields[name].type


@dataclass
class ExecutorBatch:
    """One batch's executor output, merged: what the driver needs instead of the raw records."""

    #: (stream, key field) -> the batch's pane rows, merged over its tasks (still partial for
    #: panes later batches may add to: :meth:`PanePartial.merge` with the pending ones)
    panes: dict[tuple[str, str], PanePartial]
    #: dead letters, in the order the driver path lists them (stream, reason, partition, offset)
    dead: DeadLetters
    #: valid, not-late events per stream (``BatchOutput.events``)
    events: dict[str, int]
    #: (stream, partition) -> largest valid event time in this batch (partitions with events):
    #: the update of ``EngineCore.part_max``; its keys are the batch's ``delivered`` partitions
    part_max: dict[tuple[str, int], int]
    #: stream -> smallest valid event time in this batch (the first lookup's start)
    ts_min: dict[str, int]
    #: ``{topic: {partition: [first, last]}}`` of every record (``engine.app.offset_ranges``)
    offsets: dict[str, dict[str, list[int]]]
    #: the valid events of the streams asked raw, in arrival (partition, offset) order
    raw: dict[str, Decoded]
    #: records of topics that are not event streams (subscriptions): ``engine.app.RECORD_COLUMNS``
    records: pa.Table
    #: process ids the rows came from (the Python workers)
    pids: set[int]


def merge_output(tbl: pa.Table, params: BatchParams, batch: int = 0) -> ExecutorBatch:
    """Everything of one batch's executor output (:data:`engine.executors.preagg.OUTPUT_SCHEMA`
    rows from any number of tasks, in any order); ``batch`` numbers the batch (increasing in the
    order the driver reads batches: the FIRST/LAST and key-order tie-break across batches)."""
    code = _ints(pc.index_in(tbl.column("kind"), value_set=pa.array(list(KINDS))))
    pids = {int(p) for p in pc.unique(tbl.column("pid")).to_pylist() if p is not None}
    panes = _from_arrow(tbl, code, params, batch)

    def payloads(kind: str, schema: pa.Schema, stream: str | None = None) -> pa.Table:
        """The tables the rows of ``kind`` (of ``stream``) carry, concatenated."""
        idx = np.flatnonzero(code == KINDS.index(kind))
        if stream is not None and len(idx):
            streams = tbl.column("stream").take(pa.array(idx, pa.int64())).to_pylist()
            idx = idx[np.array([s == stream for s in streams], bool)]
        blobs = tbl.column("payload").take(pa.array(idx, pa.int64())).to_pylist()
        tables = [ipc_table(b) for b in blobs if b is not None]
        return pa.concat_tables(tables) if tables else schema.empty_table()

    # dead letters, in the driver path's order
    dt = payloads("dead", DEAD_SCHEMA)
    dead = DeadLetters()
    if dt.num_rows:
        srank = {s: i for i, (s, _) in enumerate(params.topics)}
        s_rank = np.array([srank.get(s, len(srank)) for s in _np(dt.column("stream"))], np.int64)
        r_rank = np.array([_REASON_RANK[r] for r in _np(dt.column("reason"))], np.int64)
        order = np.lexsort((_np(dt.column("offset")), _np(dt.column("partition")), r_rank, s_rank))
        dt = dt.take(pa.array(order, pa.int64()))
        dead.source_topic = dt.column("topic").to_pylist()
        dead.source_partition = dt.column("partition").to_pylist()
        dead.source_offset = dt.column("offset").to_pylist()
        dead.key = dt.column("kafka_key").to_pylist()
        dead.value = dt.column("value").to_pylist()
        dead.reason = dt.column("reason").to_pylist()
        dead.detail = dt.column("detail").to_pylist()
        dead.event_ts = dt.column("event_ts").to_pylist()
        dead.watermark = dt.column("watermark").to_pylist()

    # partitions: offset ranges of all records, event-time extremes of the events
    part = payloads("partition", PARTITION_SCHEMA)
    offs = part.filter(pc.is_valid(part.column("offset")))
    offsets: dict[str, dict[str, list[int]]] = {}
    if offs.num_rows:
        g = (
            offs.group_by(["topic", "partition"])
            .aggregate([("offset", "min"), ("offset_max", "max")])
            .to_pydict()
        )
        for t, p, lo, hi in zip(
            g["topic"], g["partition"], g["offset_min"], g["offset_max_max"], strict=True
        ):
            offsets.setdefault(str(t), {})[str(int(p))] = [int(lo), int(hi)]
    ev = part.filter(pc.is_valid(part.column("stream")))
    events: dict[str, int] = {s: 0 for s, _ in params.topics}
    part_max: dict[tuple[str, int], int] = {}
    ts_min: dict[str, int] = {}
    if ev.num_rows:
        g = (
            ev.group_by(["stream", "partition"])
            .aggregate([("n", "sum"), ("ts_min", "min"), ("ts_max", "max")])
            .to_pydict()
        )
        for s, p, n, lo, hi in zip(
            g["stream"], g["partition"], g["n_sum"], g["ts_min_min"], g["ts_max_max"], strict=True
        ):
            events[s] = events.get(s, 0) + int(n)
            part_max[(s, int(p))] = int(hi)
            ts_min[s] = min(ts_min.get(s, int(lo)), int(lo))

    # raw events of the streams asked for them, in arrival order
    raw: dict[str, Decoded] = {}
    for stream in sorted(params.raw_streams):
        st = payloads("event", event_schema(stream), stream)
        if not st.num_rows:
            raw[stream] = empty(stream)
            continue
        pa_ = np.asarray(_np(st.column("partition")), np.int32)
        o = np.asarray(_np(st.column("offset")), np.int64)
        arrival = arrival_order(pa_, o)
        if arrival is not None:
            st = st.take(pa.array(arrival, pa.int64()))
            pa_, o = pa_[arrival], o[arrival]
        cols = {f: column_numpy(st.column(f).combine_chunks()) for f in list(empty(stream).columns)}
        raw[stream] = Decoded(stream, cols, pa_, o)

    records = payloads("record", RECORD_SCHEMA)
    return ExecutorBatch(panes, dead, events, part_max, ts_min, offsets, raw, records, pids)


def preaggregate_here(records: pa.Table, params: BatchParams, batch: int = 0) -> ExecutorBatch:
    """The executors' pure function (:func:`engine.executors.preagg.preaggregate`) run on
    ``records`` in this process, merged (:func:`merge_output`): what a micro-batch's tasks
    would have sent, for the batches the driver re-reads (a replay) and the driver's warm-up."""
    return merge_output(preaggregate(records, params), params, batch=batch)
