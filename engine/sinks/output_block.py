"""A committed batch's alerts as one row of ``engine_outputs`` (migration 0011), and back.

The engine's commit (:meth:`engine.sinks.store.Store.commit`) writes a batch's alerts as ONE row
-- whatever their number -- and the expansion behind it (:meth:`engine.sinks.store.Store.project`)
writes them into ``alerts`` and ``current_results``; a row left by a crash is read back with
:func:`decode` and expanded at the restart.  What the row holds is exactly what the expansion
needs from a :class:`~engine.messages.BatchOutput`:

* the alerts (ENTER, EXIT and CAPPED records, in the batch's order) as two Arrow tables -- one
  row per alert (subscription, rule, stream, key, kind, ``as_of``, its values' count), one per
  value entry (label, the value as a double, whether it was None, an int or a float) -- each an
  Arrow IPC stream compressed with zstd; the values' JSON text is the expansion's to compute, off
  the commit's path (a batch with a value that is none of those types stores the text instead:
  :meth:`AlertColumns.to_tables <engine.sinks.alert_columns.AlertColumns.to_tables>`);
* the changes the alert cap withheld (:attr:`~engine.messages.BatchOutput.withheld`), the same way;
* the subscriptions the batch removed.

Pure: bytes in, bytes out.  Decoded, the values are the Python objects they were, so the
expansion writes the same text the inline write did (tests/engine/sinks/test_output_block.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.messages import AlertSeq, BatchOutput
from engine.sinks.alert_columns import AlertColumns, table_column
from tidewatch.db.models import ALERT_KINDS

_KINDS = pa.array(ALERT_KINDS, pa.large_string())

#: Arrow IPC's zstd: a 20,000-alert batch is ≈ 0.57 MB instead of ≈ 2.0 MB, in ≈ 14 ms instead of
#: ≈ 7 (docs/measurements/engine.md, "The alert log behind the commit")
_IPC = pa.ipc.IpcWriteOptions(compression="zstd")
#: below this many rows a table is written uncompressed (the reader needs no flag: Arrow marks
#: each buffer): zstd's fixed cost, ≈ 0.3 ms of CPU for the two tables of a batch of one alert
#: against 0.07 ms uncompressed, is the commit's largest step when batches have few alerts, and
#: saves a few KB (docs/measurements/engine.md, "The sharded driver's fixed cost per batch")
_COMPRESS_FROM_ROWS = 256
_PLAIN = pa.ipc.IpcWriteOptions()


def _ipc(tbl: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    opts = _IPC if tbl.num_rows >= _COMPRESS_FROM_ROWS else _PLAIN
    with pa.ipc.new_stream(sink, tbl.schema, options=opts) as w:
        w.write_table(tbl)
    return bytes(sink.getvalue())


def _table(body: bytes | memoryview) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(body)).read_all()


@dataclass(frozen=True)
class OutputRow:
    """The columns of one ``engine_outputs`` row but its keys (``None``: no alerts); its fields
    are the columns' names (``dataclasses.asdict``: the statement's parameters)."""

    alert_rows: bytes | None
    alert_items: bytes | None
    withheld_rows: bytes | None
    withheld_items: bytes | None
    removed: list[str]


def _typed(cols: AlertColumns) -> tuple[pa.Table, pa.Table] | None:
    """``cols`` as the two tables of a row, values as typed doubles: one row per alert (its
    strings dictionary-encoded, ``as_of``, its value entries' count) and one per value entry (its
    label, the double's bits, the Python type's tag: None / int / float), so that the values'
    JSON text -- the expansion's work -- is not computed on the commit's path.  None when a value
    cannot be said that way (another type, an int past 2**53, labels that are not ``str``): the
    tags are :attr:`AlertColumns.value_tags <engine.sinks.alert_columns.AlertColumns.value_tags>`,
    the core's own when it gave them (:class:`~engine.messages.LookupBlock`)."""
    tags = cols.value_tags
    if cols.value_labels is None or tags is None:
        return None
    bits, _ = cols.value_floats
    rows = pa.table(
        {
            "subscription_id": cols.subscription_id.dictionary_encode(),
            "rule_name": cols.rule_name.dictionary_encode(),
            "stream": cols.stream.dictionary_encode(),
            "key": cols.key,
            "kind": cols.kind.dictionary_encode(),
            "as_of": pa.array(cols.as_of, pa.int64()),
            "counts": pa.array(cols.counts, pa.int64()),
        }
    )
    vals = pa.table(
        {
            "label": cols.value_labels.dictionary_encode(),
            "bits": pa.array(bits, pa.uint64()),
            "tag": pa.array(tags, pa.int8()),
        }
    )
    return rows, vals


def _from_typed(rows: pa.Table, vals: pa.Table) -> AlertColumns:
    """The columns :func:`_typed` wrote, the values as the Python objects they were (their JSON
    text computed again by :attr:`AlertColumns.values_json
    <engine.sinks.alert_columns.AlertColumns.values_json>`: the text the batch in memory gives)."""
    bits = np.asarray(table_column(vals, "bits"), np.uint64)
    tags = np.asarray(table_column(vals, "tag"), np.int8)
    return AlertColumns.from_rows(rows, vals, (bits.view(np.float64), tags))


def _encode(cols: AlertColumns) -> tuple[bytes, bytes]:
    """The two IPC streams of ``cols`` (:func:`_typed`, else the tables of
    :meth:`AlertColumns.to_tables <engine.sinks.alert_columns.AlertColumns.to_tables>`, the
    values' JSON text with them); ValueError naming the first kind ``alerts`` would refuse (its
    CHECK constraint), so that no row the expansion cannot write is ever committed."""
    ok = pc.is_in(cols.kind, value_set=_KINDS)
    if not pc.all(ok).as_py():
        bad = cols.kind.filter(pc.invert(ok))[0].as_py()
        raise ValueError(f"alert kind {bad!r} is not one of {', '.join(ALERT_KINDS)}: the batch is refused")
    rows, items = _typed(cols) or cols.to_tables()
    return _ipc(rows), _ipc(items)


def encode(out: BatchOutput) -> OutputRow:
    """``out``'s alerts, withheld changes and removed subscriptions as an ``engine_outputs`` row
    (the alerts' columns are the batch's :meth:`AlertColumns.of
    <engine.sinks.alert_columns.AlertColumns.of>`, built once for both sinks)."""
    a_rows = a_items = w_rows = w_items = None
    if len(out.alerts):
        a_rows, a_items = _encode(AlertColumns.of(out.alerts))
    if out.withheld:
        w_rows, w_items = _encode(AlertColumns.of(out.withheld, slot="withheld"))
    return OutputRow(a_rows, a_items, w_rows, w_items, list(out.removed))


def _columns(rows: bytes | memoryview | None, items: bytes | memoryview | None) -> AlertColumns | None:
    if rows is None or items is None:
        return None
    r, i = _table(rows), _table(items)
    return AlertColumns.from_tables(r, i) if "values_json" in r.column_names else _from_typed(r, i)


def decode(batch_id: int, row: OutputRow) -> BatchOutput:
    """The :class:`~engine.messages.BatchOutput` an ``engine_outputs`` row was written from, as
    far as the expansion reads it: its alerts (one block of columns), its withheld changes
    (Alert objects: the alert cap's rare path) and its removed subscriptions."""
    alerts = AlertSeq()
    cols = _columns(row.alert_rows, row.alert_items)
    if cols is not None and len(cols):
        alerts.add_block(cols)
    withheld = _columns(row.withheld_rows, row.withheld_items)
    return BatchOutput(
        batch_id=batch_id,
        alerts=alerts,
        removed=list(row.removed),
        withheld=[] if withheld is None else withheld.alerts(),
    )


def expands(out: BatchOutput) -> bool:
    """Whether ``out`` has anything for ``alerts`` or ``current_results`` (else no row is written)."""
    return bool(len(out.alerts) or out.withheld or out.removed)


def with_columns(out: BatchOutput, cols: AlertColumns | None) -> BatchOutput:
    """What the expansion reads of ``out``, its alerts as the columns ``cols`` already built for
    both sinks (:meth:`AlertColumns.of <engine.sinks.alert_columns.AlertColumns.of>` returns them
    as they are: their derived columns are not computed twice)."""
    alerts = AlertSeq()
    if cols is not None and len(cols):
        alerts.add_block(cols)
    return BatchOutput(batch_id=out.batch_id, alerts=alerts, removed=list(out.removed), withheld=out.withheld)
