"""Kafka records -> validated event columns (and dead letters).

Input is one micro-batch of Kafka records of one stream as Arrow columns
``partition, offset, timestamp (Kafka's, epoch ms), key, value`` -- what Spark's Kafka
source gives, collected with ``DataFrame.toArrow()`` or seen in ``mapInArrow``.  The
values are framed Avro (``ingest.avro``); they are decoded column-wise by the Numba
kernel of :func:`ingest.avro.decode_batch` (no per-record Python) and checked
against the invariants of the stream:

* ``undecodable`` -- not a framed record of the stream's current schema;
* ``invalid``     -- negative ``size`` / ``length`` / port, NaN or infinite ``price``, a
  number above 2**53 in magnitude (window sums are exact only below that, see fixed128),
  empty key field (``symbol``; ``src_ip`` / ``dst_ip``);
* ``future``      -- ``ts`` more than ``max_future_ms`` after the Kafka record
  timestamp (deterministic: a replay of the same records decides the same way);
* ``late``        -- ``ts <= late_until``, the last lookup time the engine already
  applied (its watermark floored to the pane width, DESIGN.md "Time").

Records are returned in arrival order (partition, offset), which is the tie order
of FIRST/LAST (RULES.md "Meaning").  Decoding in the JVM with spark-avro's
``from_avro`` was measured against this path; see docs/engine.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.dead_letter import DeadLetters
from ingest.avro import decode_batch
from subscriptions.schema import MAX_NUMERIC


@dataclass(frozen=True)
class StreamSpec:
    """Invariants of one stream's records."""

    name: str
    key_fields: tuple[str, ...]  # must be non-empty strings
    nonneg_fields: tuple[str, ...]  # integer fields that must be >= 0
    finite_fields: tuple[str, ...]  # float fields that must be finite


STREAMS: dict[str, StreamSpec] = {
    "trades": StreamSpec("trades", ("symbol",), ("size",), ("price",)),
    "packets": StreamSpec("packets", ("src_ip", "dst_ip"), ("length", "src_port", "dst_port"), ()),
}


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
    for the evaluator's key interning."""
    if (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)) and col.null_count == 0:
        enc = pc.dictionary_encode(col)
        values = enc.dictionary.to_numpy(zero_copy_only=False)
        return values[enc.indices.to_numpy(zero_copy_only=False)]
    return col.to_numpy(zero_copy_only=False)


def _binary_list(col: pa.Array | pa.ChunkedArray, idx: np.ndarray) -> list[bytes | None]:
    if len(idx) == 0:
        return []
    return col.take(pa.array(idx, pa.int64())).to_pylist()


def decode_records(
    stream: str,
    records: pa.Table,
    *,
    late_until: int | None,
    max_future_ms: int,
    dead: DeadLetters,
    watermark: int | None = None,
) -> Decoded:
    """Decode and validate one stream's Kafka records; bad ones are appended to ``dead``.

    ``records`` needs columns ``partition``, ``offset``, ``value`` and optionally ``topic``
    (named in dead letters; default: the stream name), ``timestamp`` (Kafka's; without it no ``future`` check) and ``key``.  ``late_until``
    is the engine's last applied lookup time (None before the first lookup).
    """
    spec = STREAMS[stream]
    if records.num_rows == 0:
        return empty(stream)
    topic = str(records.column("topic")[0]) if "topic" in records.column_names else stream
    order = np.lexsort(
        (
            records.column("offset").to_numpy(zero_copy_only=False),
            records.column("partition").to_numpy(zero_copy_only=False),
        )
    )
    if not np.array_equal(order, np.arange(len(order))):
        records = records.take(pa.array(order, pa.int64()))
    part = np.asarray(records.column("partition").to_numpy(zero_copy_only=False), np.int32)
    offs = np.asarray(records.column("offset").to_numpy(zero_copy_only=False), np.int64)
    values = records.column("value")
    keys = records.column("key") if "key" in records.column_names else None

    def bad(idx: np.ndarray, reason: str, details: list[str] | str, ts: np.ndarray | None = None) -> None:
        dead.add(
            topic,
            part[idx],
            offs[idx],
            _binary_list(keys, idx) if keys is not None else [None] * len(idx),
            _binary_list(values, idx),
            reason,
            details,
            None if ts is None else ts.tolist(),
            watermark,
        )

    rb, ok = decode_batch(stream, values)
    bad(np.flatnonzero(~ok), "undecodable", f"not a framed {stream} record (schema id / Avro body)")
    good = np.flatnonzero(ok)
    cols = {n: column_numpy(rb.column(n)) for n in rb.schema.names}
    ts = np.asarray(cols["ts"], np.int64)
    cols["ts"] = ts

    # invariants: one reason per record, the first that fails
    reason = np.zeros(len(good), np.int8)  # 0 ok, 1 invalid, 2 future, 3 late
    detail = np.full(len(good), "", dtype=object)

    def mark(mask: np.ndarray, code: int, text: str) -> None:
        m = mask & (reason == 0)
        reason[m] = code
        detail[m] = text

    for f in spec.key_fields:
        mark(pc.equal(rb.column(f), "").to_numpy(zero_copy_only=False), 1, f"empty {f}")
    for f in spec.nonneg_fields:
        mark(cols[f] < 0, 1, f"negative {f}")
    for f in spec.finite_fields:
        mark(~np.isfinite(cols[f]), 1, f"{f} is NaN or infinite")
    for f in (*spec.nonneg_fields, *spec.finite_fields):  # exact window sums (fixed128)
        mark(np.abs(cols[f]) > MAX_NUMERIC, 1, f"{f} above 2**53 in magnitude")
    if "timestamp" in records.column_names and max_future_ms is not None:
        kts = kafka_ts_ms(records.column("timestamp"))[good]
        mark(ts > kts + max_future_ms, 2, f"ts more than {max_future_ms} ms after the Kafka timestamp")
    if late_until is not None:
        mark(ts <= late_until, 3, f"ts <= {late_until}, the engine already looked up past it")
    for code, name in ((1, "invalid"), (2, "future"), (3, "late")):
        sel = np.flatnonzero(reason == code)
        if len(sel):
            bad(good[sel], name, detail[sel].tolist(), ts[sel])
    keep = np.flatnonzero(reason == 0)
    if len(keep) == len(part):  # every record good: no copy
        return Decoded(stream, cols, part, offs)
    return Decoded(
        stream,
        {k: v[keep] for k, v in cols.items()},
        part[good[keep]],
        offs[good[keep]],
    )
