"""Kafka records -> validated event columns (and dead letters).

Input is one micro-batch of Kafka records of one stream as Arrow columns
``partition, offset, timestamp (Kafka's, epoch ms), key, value`` -- what Spark's Kafka
source gives, collected with ``DataFrame.toArrow()`` or seen in ``mapInArrow``.  The
values are framed Avro (``tidewatch.wire.avro``); they are decoded column-wise by the Numba
kernel of :func:`tidewatch.wire.avro.decode_batch` (no per-record Python) and checked
against the invariants of the stream:

* ``undecodable`` -- not a framed record of the stream's current schema, or no value at all
  (a null-valued Kafka message: the dead letter's ``value`` stays null);
* ``invalid``     -- a field outside its domain (``tidewatch.schema``: ``price`` > 0, ``size``
  and ``length`` >= 0, ports in 0..65535, ``side`` / ``protocol`` / ``tcp_flags`` from their
  closed sets, non-empty names, every number finite and at most 2**53 in magnitude -- window
  sums are exact only below that, see fixed128); the detail names the field, the value and the
  rule, e.g. ``price -1e+12 is not > 0``;
* ``future``      -- ``ts`` more than ``max_future_ms`` after the Kafka record
  timestamp (deterministic: a replay of the same records decides the same way);
* ``late``        -- ``ts <= late_until``, the last lookup time the engine already
  applied (its watermark floored to the lookup period, docs/engine.md "Time and exactness").

Records are returned in arrival order (partition, offset), which is the tie order
of FIRST/LAST (RULES.md "Meaning").  Decoding in the JVM with spark-avro's
``from_avro`` was measured against this path (docs/engine.md "Decode"; the figures in
docs/measurements/engine.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.dead_letter import DeadLetters
from tidewatch.schema import STREAMS, FieldSpec, valid, valid_strings, violations
from tidewatch.wire.avro import decode_batch
from tidewatch.wire.frame_ids import FrameIds


@dataclass
class Decoded:
    """The valid events of one stream in one batch, in arrival order."""

    stream: str
    columns: dict[str, np.ndarray]  # field -> array; strings as object arrays of str
    partition: np.ndarray  # int32
    offset: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.offset)

    @property
    def ts(self) -> np.ndarray:
        return self.columns["ts"]

    def take(self, idx: np.ndarray) -> Decoded:
        """The rows ``idx`` (an index or boolean mask)."""
        return Decoded(
            self.stream,
            {k: v[idx] for k, v in self.columns.items()},
            self.partition[idx],
            self.offset[idx],
        )

    def slice(self, start: int) -> Decoded:
        """The rows from ``start`` on, as views (no copy)."""
        return Decoded(
            self.stream,
            {k: v[start:] for k, v in self.columns.items()},
            self.partition[start:],
            self.offset[start:],
        )


def empty(stream: str) -> Decoded:
    """A :class:`Decoded` with no rows."""
    rb, _ = decode_batch(stream, [])
    cols = {n: rb.column(n).to_numpy(zero_copy_only=False) for n in rb.schema.names}
    return Decoded(stream, cols, np.zeros(0, np.int32), np.zeros(0, np.int64))


#: the detail of a dead letter for a Kafka message with no value (null, e.g. a tombstone)
NULL_VALUE = "null value (a Kafka message with no record)"


def kafka_ts_ms(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Kafka record timestamps (Spark ``timestamp`` or int epoch ms) as int64 epoch ms."""
    t = col.type
    if pa.types.is_timestamp(t):
        unit = {"s": 1000, "ms": 1, "us": 1 / 1000, "ns": 1 / 1_000_000}[t.unit]
        raw = pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False)
        return (raw * unit).astype(np.int64) if unit != 1 else raw.astype(np.int64)
    return np.asarray(col.to_numpy(zero_copy_only=False), np.int64)


def column_numpy(col: pa.Array) -> np.ndarray:
    """One decoded column as NumPy; strings as an object array of ``str``.  Strings are few
    distinct values (symbols, sides, exchanges), so they are dictionary-encoded in Arrow first
    and each distinct value becomes one Python ``str`` that the array refers to: a Python object
    per record cost more than the whole Avro decode, and shared ``str`` objects keep their hash
    for the evaluator's key interning.  The decode kernel encodes them already
    (``decode_batch(..., dictionary=True)``); a plain string column is encoded here."""
    if (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)) and col.null_count == 0:
        col = pc.dictionary_encode(col)
    if pa.types.is_dictionary(col.type) and col.null_count == 0:
        values = col.dictionary.to_numpy(zero_copy_only=False)
        return values[col.indices.to_numpy(zero_copy_only=False)]
    return col.to_numpy(zero_copy_only=False)


def _string_domain(f: FieldSpec, col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(bad mask, violation text of each record)`` of a string column (plain or
    dictionary-encoded) against the domain of ``f``: tested and worded once per distinct
    value, the codes pick the answer (no per-record Python)."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    uniq = col.dictionary.to_numpy(zero_copy_only=False)
    codes = np.asarray(col.indices.to_numpy(zero_copy_only=False), np.int64)
    ok = valid_strings(f, uniq)
    return ~ok[codes], violations(f, uniq)[codes] if not ok.all() else np.zeros(0, dtype=object)


def arrival_order(part: np.ndarray, offs: np.ndarray) -> np.ndarray | None:
    """The permutation that puts records in (partition, offset) order (None: they are).  A
    source hands each partition's records over in offset order, interleaved: one stable sort
    by partition (radix, on int32) then orders them, checked, else a full lexsort."""
    if len(part) < 2:
        return None
    if np.all(part[1:] >= part[:-1]):
        same = part[1:] == part[:-1]
        if np.all(offs[1:][same] > offs[:-1][same]):
            return None
    order = np.argsort(part, kind="stable")
    p, o = part[order], offs[order]
    same = p[1:] == p[:-1]
    if not np.all(o[1:][same] > o[:-1][same]):
        order = np.lexsort((offs, part))
    return order


def _binary_list(col: pa.Array | pa.ChunkedArray, idx: np.ndarray) -> list[bytes | None]:
    if len(idx) == 0:
        return []
    return col.take(pa.array(idx, pa.int64())).to_pylist()


@dataclass
class Predecoded:
    """One stream's records of a batch, decoded and checked for everything that does not depend
    on the engine's state (undecodable, invalid, future) -- work the reading thread does while
    the previous batch is evaluated.  :func:`finish` adds the ``late`` check when the batch is
    processed; the dead letters found here get the watermark of that moment."""

    decoded: Decoded  # the records that passed, arrival order
    dead: DeadLetters  # their watermark is set by finish
    records: pa.Table  # the Kafka records, for the raw bytes of late ones
    rows: np.ndarray | None  # row of ``records`` of each decoded event (None: the same row)
    topic: str


def predecode(
    stream: str, records: pa.Table, *, max_future_ms: int | None, ids: FrameIds | None = None
) -> Predecoded:
    """Decode one stream's Kafka records and check the invariants that depend on the records
    alone; see :func:`decode_records`.  ``ids``: how frame ids are read (None: the process's,
    ``tidewatch.wire.frame_ids.frame_ids()``; a Schema Registry's with ``schema_registry_url``)."""
    spec = STREAMS[stream]
    dead = DeadLetters()
    if records.num_rows == 0:
        return Predecoded(empty(stream), dead, records, None, stream)
    topic = str(records.column("topic")[0]) if "topic" in records.column_names else stream
    part = np.asarray(records.column("partition").to_numpy(zero_copy_only=False), np.int32)
    offs = np.asarray(records.column("offset").to_numpy(zero_copy_only=False), np.int64)
    order = arrival_order(part, offs)
    if order is not None:  # the payloads are read in this order, not copied into it
        part, offs = part[order], offs[order]
    values = records.column("value")

    def bad(idx: np.ndarray, reason: str, details: list[str] | str, ts: np.ndarray | None = None) -> None:
        _dead_add(dead, records, topic, idx if order is None else order[idx], reason, details, ts, None)

    rb, ok = decode_batch(stream, values, order, dictionary=True, ids=ids)
    undecodable = np.flatnonzero(~ok)
    if len(undecodable):
        null = np.asarray(values.is_null().to_numpy(zero_copy_only=False), np.bool_)
        null = (null if order is None else null[order])[undecodable]
        texts = np.where(null, NULL_VALUE, f"not a framed {stream} record (schema id / Avro body)")
        bad(undecodable, "undecodable", texts.tolist())
    good = np.flatnonzero(ok)
    cols = {n: column_numpy(rb.column(n)) for n in rb.schema.names}
    ts = np.asarray(cols["ts"], np.int64)
    cols["ts"] = ts

    # invariants: one reason per record, the first that fails
    reason = np.zeros(len(good), np.int8)  # 0 ok, 1 invalid, 2 future
    detail = np.full(len(good), "", dtype=object)

    def mark(mask: np.ndarray, code: int, text: str) -> None:  # first failing check wins
        m = mask & (reason == 0)
        reason[m] = code
        detail[m] = text

    for name, f in spec.fields.items():  # the domains of tidewatch.schema, column-wise
        if f.numeric:
            out = ~valid(f, cols[name])
            if out.any():
                m = out & (reason == 0)
                reason[m] = 1
                detail[m] = violations(f, cols[name][m])
        else:
            out, texts = _string_domain(f, rb.column(name))
            if out.any():
                m = out & (reason == 0)
                reason[m] = 1
                detail[m] = texts[m]
    if "timestamp" in records.column_names and max_future_ms is not None:
        kts = kafka_ts_ms(records.column("timestamp"))
        kts = (kts if order is None else kts[order])[good]
        mark(ts > kts + max_future_ms, 2, f"ts more than {max_future_ms} ms after the Kafka timestamp")
    for code, name in ((1, "invalid"), (2, "future")):
        sel = np.flatnonzero(reason == code)
        if len(sel):
            bad(good[sel], name, detail[sel].tolist(), ts[sel])
    keep = np.flatnonzero(reason == 0)
    if len(keep) == len(part):  # every record good: no copy
        return Predecoded(Decoded(stream, cols, part, offs), dead, records, order, topic)
    kept = good[keep]
    return Predecoded(
        Decoded(stream, {k: v[keep] for k, v in cols.items()}, part[kept], offs[kept]),
        dead,
        records,
        kept if order is None else order[kept],
        topic,
    )


def finish(pre: Predecoded, *, late_until: int | None, dead: DeadLetters, watermark: int | None) -> Decoded:
    """The events of ``pre`` not late (``ts <= late_until``, the engine's last applied lookup
    time; None before the first lookup); its dead letters, then the late ones, go to ``dead``
    with ``watermark``."""
    pre.dead.watermark[:] = [watermark] * len(pre.dead)
    dead.extend(pre.dead)
    d = pre.decoded
    if late_until is None or not len(d):
        return d
    late = d.ts <= late_until
    if not late.any():
        return d
    idx = np.flatnonzero(late)
    rows = idx if pre.rows is None else pre.rows[idx]
    text = f"ts <= {late_until}, the engine already looked up past it"
    _dead_add(dead, pre.records, pre.topic, rows, "late", [text] * len(idx), d.ts[idx], watermark)
    return d.take(np.flatnonzero(~late))


def _dead_add(
    dead: DeadLetters,
    records: pa.Table,
    topic: str,
    rows: np.ndarray,
    reason: str,
    details: list[str] | str,
    ts: np.ndarray | None,
    watermark: int | None,
) -> None:
    """Dead letters of the rows ``rows`` of ``records`` (their position and raw bytes)."""
    if not len(rows):
        return
    keys = records.column("key") if "key" in records.column_names else None
    dead.add(
        topic,
        np.asarray(
            records.column("partition").take(pa.array(rows, pa.int64())).to_numpy(zero_copy_only=False)
        ),
        np.asarray(records.column("offset").take(pa.array(rows, pa.int64())).to_numpy(zero_copy_only=False)),
        _binary_list(keys, rows) if keys is not None else [None] * len(rows),
        _binary_list(records.column("value"), rows),
        reason,
        details,
        None if ts is None else ts.tolist(),
        watermark,
    )


def decode_records(
    stream: str,
    records: pa.Table,
    *,
    late_until: int | None,
    max_future_ms: int,
    dead: DeadLetters,
    watermark: int | None = None,
    ids: FrameIds | None = None,
) -> Decoded:
    """Decode and validate one stream's Kafka records; bad ones are appended to ``dead``.

    ``records`` needs columns ``partition``, ``offset``, ``value`` and optionally ``topic``
    (named in dead letters; default: the stream name), ``timestamp`` (Kafka's; without it no
    ``future`` check) and ``key``.  ``late_until`` is the engine's last applied lookup time
    (None before the first lookup); ``ids`` as in :func:`predecode`.  :func:`predecode`, then
    :func:`finish`.
    """
    pre = predecode(stream, records, max_future_ms=max_future_ms, ids=ids)
    return finish(pre, late_until=late_until, dead=dead, watermark=watermark)
