"""A batch's alerts as Kafka records, encoded column-wise: Avro ``alerts`` and ``results`` values
and their keys, for the whole batch in one Numba kernel.

What :mod:`engine.sinks.publish` produced record by record before (fastavro per alert; the two
side by side: docs/measurements/engine.md, "Alert delivery"), with the same bytes
(tests/engine/sinks/test_alert_wire.py checks them against fastavro): for alert i

* ``alerts``: key ``subscription_id``, value the framed Avro ``Alert`` (``values`` as the Avro
  ``map<null|double>``: one block of all entries, then the end block; COUNTs as doubles);
* ``results``: key ``subscription_id|key``, value the framed Avro ``Result`` (``present`` is
  ``kind == "ENTER"``); on EXIT a tombstone (null value) follows with the same key.

The kernel reads the batch's columns (:class:`engine.sinks.alert_columns.AlertColumns`, built
once per batch and shared with the PostgreSQL commit): strings as Arrow arrays (UTF-8 + offsets),
and writes every record into three buffers, cut into the records' ``bytes`` by Arrow.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np
import pyarrow as pa

from engine.messages import Alert, AlertSeq
from engine.sinks.alert_columns import AlertColumns, split_bytes, utf8_buffers
from tidewatch.wire.avro import header, put_long, schema_id


@nb.njit(cache=True, nogil=True, inline="always")
def _put_str(out, pos, data, offs, s, i):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """String ``i`` of column ``s`` (``data[offs[s, i]:offs[s, i + 1]]``) as an Avro string."""
    a = offs[s, i]
    b = offs[s, i + 1]
    pos = put_long(out, pos, np.int64(b - a))
    out[pos : pos + (b - a)] = data[a:b]  # a slice copy: ≈ 1.4x faster than a loop of bytes
    return pos + (b - a)


@nb.njit(cache=True, nogil=True, inline="always")
def _put_map(out, pos, first, count, ldata, loffs, lcode, vbytes, vnull):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Entries ``first .. first + count - 1`` as one block of an Avro ``map<null|double>``: each
    label's Avro string written once per batch (``ldata[loffs[c]:loffs[c + 1]]`` for label code
    ``c = lcode[e]``), each double's 8 bytes as they lie in memory (little endian, as Avro's)."""
    if count > 0:
        pos = put_long(out, pos, np.int64(count))
        for e in range(first, first + count):
            c = lcode[e]
            a, b = loffs[c], loffs[c + 1]
            out[pos : pos + (b - a)] = ldata[a:b]
            pos += b - a
            if vnull[e]:
                out[pos] = 0  # union branch 0: null
                pos += 1
            else:
                out[pos] = 2  # union branch 1: double
                out[pos + 1 : pos + 9] = vbytes[e * 8 : e * 8 + 8]
                pos += 9
    out[pos] = 0  # end of the map
    return pos + 1


@nb.njit(cache=True, nogil=True)
def _avro_strings(data, offs, out, out_offs):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Each string of ``data`` / ``offs[0]`` as an Avro string (length, bytes) into ``out``."""
    pos = 0
    for i in range(offs.shape[1] - 1):
        out_offs[i] = pos
        pos = _put_str(out, pos, data, offs, 0, i)
    out_offs[offs.shape[1] - 1] = pos
    return pos


@nb.njit(cache=True, nogil=True)
def _encode_kernel(  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    n, sdata, soffs, as_of, present, counts, ldata, loffs, lcode, vbytes, vnull, batch_id, emitted_at,
    ahdr, rhdr, aout, aoff, rout, roff, kout, koff,
):  # fmt: skip
    """Alert record i -> ``aout[aoff[i]:aoff[i+1]]``, result -> ``rout``, results key -> ``kout``.
    ``soffs[s]``: offsets into ``sdata`` (UTF-8) of string column s: id, subscription_id, rule_name, stream, key, kind."""
    ap = 0
    rp = 0
    kp = 0
    first = 0
    for i in range(n):
        aoff[i] = ap
        aout[ap : ap + ahdr.shape[0]] = ahdr
        ap += ahdr.shape[0]
        for s in range(6):
            ap = _put_str(aout, ap, sdata, soffs, s, i)
        ap = put_long(aout, ap, as_of[i])
        ap = _put_map(aout, ap, first, counts[i], ldata, loffs, lcode, vbytes, vnull)
        ap = put_long(aout, ap, batch_id)
        ap = put_long(aout, ap, emitted_at)
        roff[i] = rp
        rout[rp : rp + rhdr.shape[0]] = rhdr
        rp += rhdr.shape[0]
        rp = _put_str(rout, rp, sdata, soffs, 1, i)
        rp = _put_str(rout, rp, sdata, soffs, 4, i)
        rout[rp] = 1 if present[i] else 0
        rp += 1
        rp = put_long(rout, rp, as_of[i])
        rp = _put_map(rout, rp, first, counts[i], ldata, loffs, lcode, vbytes, vnull)
        rp = put_long(rout, rp, batch_id)
        first += counts[i]
        koff[i] = kp
        for s in (1, 4):  # subscription_id | key
            a, b = soffs[s, i], soffs[s, i + 1]
            kout[kp : kp + (b - a)] = sdata[a:b]
            kp += b - a
            if s == 1:
                kout[kp] = 124  # "|"
                kp += 1
    aoff[n] = ap
    roff[n] = rp
    koff[n] = kp
    return ap, rp, kp


@dataclass
class AlertRecords:
    """The Kafka records of a batch's alerts (see the module docstring), alert by alert."""

    alert_keys: list[bytes]
    alert_values: list[bytes]
    result_keys: list[bytes]
    result_values: list[bytes]
    present: list[bool]

    def __len__(self) -> int:
        return len(self.alert_values)


#: sets of the encoder's output buffers free for the next batch (a set per thread encoding at once)
_FREE: list[dict[str, np.ndarray]] = []
_FREE_LOCK = threading.Lock()
#: a buffer larger than this is not kept (an alert storm's, ≈ 200 bytes per alert: not held on to)
KEEP_MAX_BYTES = 32 << 20


@contextmanager
def _buffers() -> Iterator[dict[str, np.ndarray]]:
    """A set of output buffers kept from batch to batch (their pages written once, not faulted
    in again every batch: ≈ 7 MB of fresh pages a batch at 20,000 alerts cost the kernel more
    than its own work), returned for the next batch once the records are copied out of them
    (:func:`~engine.sinks.alert_columns.split_bytes`), but for those larger than
    :data:`KEEP_MAX_BYTES`.  A set is taken whole by one caller: threads encoding at once never
    share one."""
    with _FREE_LOCK:
        got = _FREE.pop() if _FREE else {}
    yield got
    kept = {k: v for k, v in got.items() if v.nbytes <= KEEP_MAX_BYTES}
    with _FREE_LOCK:
        if len(_FREE) < 2:
            _FREE.append(kept)


def _scratch(have: dict[str, np.ndarray], name: str, size: int) -> np.ndarray:
    """Buffer ``name`` of the set ``have``, of at least ``size`` bytes (grown by half again)."""
    buf = have.get(name)
    if buf is None or len(buf) < size:
        buf = have[name] = np.empty(max(size, len(buf) * 3 // 2 if buf is not None else 0), np.uint8)
    return buf


def encode_alerts(
    alerts: AlertColumns | AlertSeq | Sequence[Alert] | Sequence[dict[str, Any]],
    batch_id: int,
    emitted_at: int,
    slot: str = "alerts",
) -> AlertRecords:
    """The ``alerts`` and ``results`` records of a batch's alerts (bytes as fastavro writes them):
    from their columns (:class:`~engine.sinks.alert_columns.AlertColumns`, built here from Alert
    objects or the alert rows of :meth:`engine.sinks.store.Store.alerts_of_batch` when not given;
    ``slot``: :meth:`AlertColumns.of`'s)."""
    n = len(alerts)
    if n == 0:
        return AlertRecords([], [], [], [], [])
    c = AlertColumns.of(alerts, slot)
    strings = (c.ids, c.subscription_id, c.rule_name, c.stream, c.key, c.kind)
    cols = [utf8_buffers(a) for a in strings]
    sdata = np.concatenate([d for d, _ in cols])
    base = np.cumsum([0] + [len(d) for d, _ in cols[:-1]])
    soffs = np.stack([o + b for (_, o), b in zip(cols, base, strict=True)])
    if c.value_labels is None:  # labels that are not str: as str, as before
        labels = pa.array([str(k) for v in c.values for k in v], pa.large_string())
    else:
        labels = c.value_labels
    # each distinct label written as an Avro string once (a null one as an empty string, as before)
    coded = labels.dictionary_encode(null_encoding="encode")
    kdata, koffs = utf8_buffers(coded.dictionary)
    ldata = np.empty(len(kdata) + 10 * len(coded.dictionary), np.uint8)
    loffs = np.empty(len(coded.dictionary) + 1, np.int64)
    _avro_strings(kdata, koffs.reshape(1, -1), ldata, loffs)
    lcode = np.asarray(coded.indices, np.int64)
    vbits, vnull = c.value_floats
    vbytes = np.ascontiguousarray(vbits).view(np.uint8)
    present = c.present
    str_bytes = len(sdata)
    map_bytes = int(np.diff(loffs)[lcode].sum()) + 9 * len(vbits) + 11 * n
    ahdr = np.frombuffer(header(schema_id("alerts")), np.uint8)
    rhdr = np.frombuffer(header(schema_id("results")), np.uint8)
    aoff = np.empty(n + 1, np.int64)
    roff = np.empty(n + 1, np.int64)
    koff = np.empty(n + 1, np.int64)
    with _buffers() as have:
        aout = _scratch(have, "alerts", n * (5 + 6 * 10 + 3 * 10) + str_bytes + map_bytes)
        rout = _scratch(have, "results", n * (5 + 2 * 10 + 1 + 2 * 10) + str_bytes + map_bytes)
        kout = _scratch(have, "keys", str_bytes + n)
        _encode_kernel(
            n, sdata, soffs, c.as_of, present, c.counts, ldata, loffs, lcode, vbytes, vnull,
            int(batch_id), int(emitted_at), ahdr, rhdr, aout, aoff, rout, roff, kout, koff,
        )  # fmt: skip
        return AlertRecords(
            split_bytes(*cols[1]),
            split_bytes(aout, aoff),
            split_bytes(kout, koff),
            split_bytes(rout, roff),
            present.tolist(),
        )


def warm_up() -> None:
    """Compile (or load from Numba's cache) the kernel, so the first batch does not wait for it."""
    encode_alerts([Alert("s", "r", "trades", "k", "EXIT", 0, {"v": 1.0, "w": None})], 0, 0)
