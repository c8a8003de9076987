"""A batch's alerts as Kafka records, encoded column-wise: Avro ``alerts`` and ``results`` values
and their keys, for the whole batch in one Numba kernel.

What :mod:`engine.sinks.publish` produced record by record before (fastavro per alert; the two
side by side: docs/measurements/engine.md, "Alert delivery"), with the same bytes
(tests/engine/sinks/test_alert_wire.py checks them against fastavro): for alert i

* ``alerts``: key ``subscription_id``, value the framed Avro ``Alert`` (``values`` as the Avro
  ``map<null|double>``: one block of all entries, then the end block; COUNTs as doubles);
* ``results``: key ``subscription_id|key``, value the framed Avro ``Result`` (``present`` is
  ``kind == "ENTER"``); on EXIT a tombstone (null value) follows with the same key.

The per-alert Python left is reading the alerts' fields into lists (and each values dict's
entries), done by comprehensions; strings become Arrow arrays (UTF-8 + offsets, in C) and the
kernel writes every record into three buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np
import pyarrow as pa

from engine.messages import Alert
from tidewatch.wire.avro import header, put_long, schema_id

#: string columns of an alert, in the order the kernel takes them
_STRINGS = ("id", "subscription_id", "rule_name", "stream", "key", "kind")


@nb.njit(cache=True, nogil=True)
def _put_str(out, pos, data, offs, i):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    a = offs[i]
    b = offs[i + 1]
    pos = put_long(out, pos, np.int64(b - a))
    for j in range(a, b):
        out[pos] = data[j]
        pos += 1
    return pos


@nb.njit(cache=True, nogil=True)
def _put_map(out, pos, first, count, kdata, koffs, vbits, vnull):  # type: ignore[no-untyped-def]  # pragma: no cover
    if count > 0:
        pos = put_long(out, pos, np.int64(count))
        for e in range(first, first + count):
            pos = _put_str(out, pos, kdata, koffs, e)
            if vnull[e]:
                out[pos] = 0  # union branch 0: null
                pos += 1
            else:
                out[pos] = 2  # union branch 1: double, 8 bytes little endian
                pos += 1
                z = vbits[e]
                for _ in range(8):
                    out[pos] = np.uint8(z & np.uint64(0xFF))
                    pos += 1
                    z >>= np.uint64(8)
    out[pos] = 0  # end of the map
    return pos + 1


@nb.njit(cache=True, nogil=True)
def _encode_kernel(  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    n, sdata, soffs, as_of, present, counts, kdata, koffs, vbits, vnull, batch_id, emitted_at,
    ahdr, rhdr, aout, aoff, rout, roff, kout, koff,
):  # fmt: skip
    """Alert record i -> ``aout[aoff[i]:aoff[i+1]]``, result -> ``rout``, results key -> ``kout``.
    ``soffs[s]``: offsets into ``sdata`` (UTF-8) of string column s of :data:`_STRINGS`."""
    ap = 0
    rp = 0
    kp = 0
    first = 0
    for i in range(n):
        aoff[i] = ap
        for h in range(ahdr.shape[0]):
            aout[ap] = ahdr[h]
            ap += 1
        for s in range(6):
            ap = _put_str(aout, ap, sdata, soffs[s], i)
        ap = put_long(aout, ap, as_of[i])
        ap = _put_map(aout, ap, first, counts[i], kdata, koffs, vbits, vnull)
        ap = put_long(aout, ap, batch_id)
        ap = put_long(aout, ap, emitted_at)
        roff[i] = rp
        for h in range(rhdr.shape[0]):
            rout[rp] = rhdr[h]
            rp += 1
        rp = _put_str(rout, rp, sdata, soffs[1], i)
        rp = _put_str(rout, rp, sdata, soffs[4], i)
        rout[rp] = 1 if present[i] else 0
        rp += 1
        rp = put_long(rout, rp, as_of[i])
        rp = _put_map(rout, rp, first, counts[i], kdata, koffs, vbits, vnull)
        rp = put_long(rout, rp, batch_id)
        first += counts[i]
        koff[i] = kp
        for s in (1, 4):  # subscription_id | key
            for j in range(soffs[s, i], soffs[s, i + 1]):
                kout[kp] = sdata[j]
                kp += 1
            if s == 1:
                kout[kp] = 124  # "|"
                kp += 1
    aoff[n] = ap
    roff[n] = rp
    koff[n] = kp
    return ap, rp, kp


def _utf8(values: Sequence[Any], what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(data uint8, offsets int64)`` of a column of ``str`` (UTF-8, as Arrow lays it out)."""
    arr = pa.array(values, pa.large_string())
    if arr.null_count:
        raise ValueError(f"alert {what} missing")
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], np.int64, len(arr) + 1)
    data = np.frombuffer(bufs[2], np.uint8, int(offs[-1])) if bufs[2] is not None else np.zeros(0, np.uint8)
    return data, offs


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


def _columns(
    alerts: Sequence[Alert] | Sequence[dict[str, Any]],
) -> tuple[list[list[Any]], list[Any], list[Any]]:
    """String columns (:data:`_STRINGS`), as_of and values of alerts or of alert rows (dicts of
    :meth:`engine.sinks.store.Store.alerts_of_batch`)."""
    if alerts and isinstance(alerts[0], Alert):
        al: Sequence[Alert] = alerts  # type: ignore[assignment]
        strings = [
            [a.id for a in al],
            [a.subscription_id for a in al],
            [a.rule_name for a in al],
            [a.stream for a in al],
            [a.key for a in al],
            [a.kind for a in al],
        ]
        return strings, [a.as_of for a in al], [a.values for a in al]
    rows: Sequence[dict[str, Any]] = alerts  # type: ignore[assignment]
    strings = [[r.get(f, "") if f in ("rule_name", "stream") else r[f] for r in rows] for f in _STRINGS]
    return strings, [r["as_of"] for r in rows], [r.get("values") or {} for r in rows]


def _values(values: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The values maps flattened: entries per alert, keys (UTF-8), value bits, null flags."""
    counts = np.fromiter(map(len, values), np.int64, len(values))
    keys = [k for v in values for k in v]
    vals = [x for v in values for x in v.values()]
    try:
        kdata, koffs = _utf8(keys, "values key")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        kdata, koffs = _utf8([str(k) for k in keys], "values key")
    try:
        arr = pa.array(vals, pa.float64())
    except (pa.ArrowTypeError, pa.ArrowInvalid, TypeError, ValueError, OverflowError):
        arr = pa.array([None if x is None else float(x) for x in vals], pa.float64())
    vnull = np.asarray(arr.is_null(), np.bool_)
    vbits = arr.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64).view(np.uint64)
    return counts, kdata, koffs, vbits, vnull


def encode_alerts(
    alerts: Sequence[Alert] | Sequence[dict[str, Any]], batch_id: int, emitted_at: int
) -> AlertRecords:
    """The ``alerts`` and ``results`` records of a batch's alerts (bytes as fastavro writes them)."""
    n = len(alerts)
    if n == 0:
        return AlertRecords([], [], [], [], [])
    strings, as_of, values = _columns(alerts)
    cols = [_utf8(c, f) for c, f in zip(strings, _STRINGS, strict=True)]
    sdata = np.concatenate([d for d, _ in cols])
    base = np.cumsum([0] + [len(d) for d, _ in cols[:-1]])
    soffs = np.stack([o + b for (_, o), b in zip(cols, base, strict=True)])
    kinds = strings[5]
    present = [k == "ENTER" for k in kinds]
    counts, kdata, koffs, vbits, vnull = _values(values)
    as_of_arr = np.asarray(as_of, np.int64)
    str_bytes = len(sdata)
    map_bytes = len(kdata) + 19 * len(vbits) + 11 * n
    ahdr = np.frombuffer(header(schema_id("alerts")), np.uint8)
    rhdr = np.frombuffer(header(schema_id("results")), np.uint8)
    aout = np.empty(n * (5 + 6 * 10 + 3 * 10) + str_bytes + map_bytes, np.uint8)
    rout = np.empty(n * (5 + 2 * 10 + 1 + 2 * 10) + str_bytes + map_bytes, np.uint8)
    kout = np.empty(str_bytes + n, np.uint8)
    aoff = np.empty(n + 1, np.int64)
    roff = np.empty(n + 1, np.int64)
    koff = np.empty(n + 1, np.int64)
    _encode_kernel(
        n, sdata, soffs, as_of_arr, np.array(present, np.bool_), counts, kdata, koffs, vbits, vnull,
        int(batch_id), int(emitted_at), ahdr, rhdr, aout, aoff, rout, roff, kout, koff,
    )  # fmt: skip
    return AlertRecords(
        _split(cols[1][0], cols[1][1]),
        _split(aout, aoff),
        _split(kout, koff),
        _split(rout, roff),
        present,
    )


def _split(buf: np.ndarray, offs: np.ndarray) -> list[bytes]:
    data = buf[: offs[-1]].tobytes()
    o = offs.tolist()
    return [data[o[i] : o[i + 1]] for i in range(len(o) - 1)]


def warm_up() -> None:
    """Compile (or load from Numba's cache) the kernel, so the first batch does not wait for it."""
    encode_alerts([Alert("s", "r", "trades", "k", "EXIT", 0, {"v": 1.0, "w": None})], 0, 0)
