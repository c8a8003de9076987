"""The wire format of every Tidewatch Kafka topic: Avro, one source of truth.

Every Kafka *value* written by Tidewatch is one Avro record in binary encoding,
prefixed by a 5-byte Confluent-style frame::

    byte 0      magic 0x00
    bytes 1..4  schema id, big-endian int32 (ids in ``schemas/registry.json``)
    bytes 5..   the record, Avro binary encoding (no container, no sync markers)

The id names the *writer* schema, so a reader can resolve any older version of a
stream's schema to the current one (Avro schema resolution); see docs/feeds.md
for the evolution rules.  Spark can read the body with
``from_avro(expr("substring(value, 6)"), load_schema_json(name))`` after
checking the id, or with :func:`decode_batch` inside ``mapInArrow``.

Hot path.  :func:`encode_batch` encodes a whole batch of a *flat* schema (all
fields primitive: string, int, long, double, float, boolean -- trades and
packets) column-wise with one Numba kernel; strings are dictionary-coded
(``Coded(codes, values)``), each distinct value is UTF-8 + length-prefixed once
per batch and copied into place.  :func:`decode_batch` is its inverse and
returns a :class:`pyarrow.RecordBatch` built from offset/data buffers with no
per-record Python.  Schemas that are not flat (alerts, results, dead letters)
go through fastavro record by record (:func:`encode`, :func:`decode`).

Logical types (``timestamp-millis``) are carried on the wire as plain ``long``
epoch milliseconds and are returned as ``int`` -- the platform's time unit.

Frame ids.  Which id a schema is written with and which schema a frame id names is a
:class:`tidewatch.wire.frame_ids.FrameIds`: by default ``registry.json``'s; with a Confluent
Schema Registry (``settings.schema_registry_url``) :class:`tidewatch.wire.registry.RegistryIds`,
installed for the process at its entry point (``frame_ids.use_frame_ids``) or passed to the
decoders as ``ids``.
"""

from __future__ import annotations

import copy
import io
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import fastavro
import numba as nb
import numpy as np
import pandas as pd
import pyarrow as pa

from tidewatch.errors import TidewatchError
from tidewatch.wire.frame_ids import FrameIds, accepted_ids, frame_ids

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
MAGIC = 0
HEADER_LEN = 5

# field kinds of the flat layout (Numba kernel codes)
K_STRING, K_LONG, K_DOUBLE, K_FLOAT, K_BOOL = 0, 1, 2, 3, 4
_PRIMITIVE_KIND = {"string": K_STRING, "long": K_LONG, "int": K_LONG, "double": K_DOUBLE, "float": K_FLOAT}
_PRIMITIVE_KIND["boolean"] = K_BOOL


class AvroDecodeError(TidewatchError, ValueError):
    """A payload that is not a framed Tidewatch Avro record."""


# --------------------------------------------------------------------------- schemas
@lru_cache(maxsize=1)
def _registry() -> dict[int, dict[str, Any]]:
    raw = json.loads((SCHEMA_DIR / "registry.json").read_text())
    return {int(k): v for k, v in raw["schemas"].items()}


@cache
def schema_id(name: str) -> int:
    """The id of the *current* schema of ``name`` (trades, packets, alerts, results, dead_letter)."""
    for sid, entry in _registry().items():
        if entry["name"] == name and entry.get("current"):
            return sid
    raise KeyError(f"no current schema named {name!r} in {SCHEMA_DIR / 'registry.json'}")


def schema_names() -> list[str]:
    """Names of all current schemas."""
    return sorted(e["name"] for e in _registry().values() if e.get("current"))


@cache
def _load_file(file: str) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / file).read_text())


def load_schema(name: str) -> dict[str, Any]:
    """The current Avro schema of ``name`` as a JSON dict (a copy; as in the .avsc file)."""
    return copy.deepcopy(_load_file(_registry()[schema_id(name)]["file"]))


def load_schema_json(name: str) -> str:
    """The current schema of ``name`` as a JSON string (e.g. for Spark's ``from_avro``)."""
    return json.dumps(load_schema(name))


def _strip_logical(node: Any) -> Any:
    """Copy of a schema with logical types removed: timestamps stay ``long`` epoch ms."""
    if isinstance(node, dict):
        return {k: _strip_logical(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_strip_logical(v) for v in node]
    return node


@cache
def _parsed_by_id(sid: int) -> Any:
    return fastavro.parse_schema(_strip_logical(_load_file(_registry()[sid]["file"])))


def parsed_schema(name: str) -> Any:
    """The fastavro-parsed current schema of ``name`` (timestamps as plain long)."""
    return _parsed_by_id(schema_id(name))


def field_names(name: str) -> list[str]:
    """Field names of the current schema of ``name``, in schema order."""
    return [f["name"] for f in _load_file(_registry()[schema_id(name)]["file"])["fields"]]


def header(sid: int) -> bytes:
    """The 5-byte frame for schema id ``sid``."""
    return struct.pack(">bI", MAGIC, sid)


def local_schema_ids() -> dict[int, str]:
    """Every id of ``schemas/registry.json`` (older versions too) -> its schema's name."""
    return {sid: str(e["name"]) for sid, e in _registry().items()}


def schema_json_by_id(sid: int) -> dict[str, Any]:
    """The Avro schema (as in its .avsc file, a copy) of ``registry.json`` id ``sid``."""
    return copy.deepcopy(_load_file(_registry()[sid]["file"]))


# --------------------------------------------------------------------------- flat layout
@dataclass(frozen=True)
class FlatLayout:
    """Column layout of a flat record schema for the Numba kernels."""

    name: str
    fields: tuple[str, ...]
    kinds: np.ndarray  # int8, one per field
    slots: np.ndarray  # int32, index into the kind's column block
    strings: tuple[str, ...]
    ints: tuple[str, ...]
    floats: tuple[str, ...]  # double and float columns, as float64

    @property
    def string_fields(self) -> tuple[str, ...]:
        return self.strings


@cache
def flat_layout(name: str) -> FlatLayout:
    """The :class:`FlatLayout` of ``name``; raises ``TypeError`` if the schema is not flat."""
    schema = _strip_logical(load_schema(name))
    kinds: list[int] = []
    slots: list[int] = []
    strings: list[str] = []
    ints: list[str] = []
    floats: list[str] = []
    names: list[str] = []
    for f in schema["fields"]:
        t = f["type"]
        t = t["type"] if isinstance(t, dict) else t
        if not isinstance(t, str) or t not in _PRIMITIVE_KIND:
            raise TypeError(f"schema {name!r} is not flat: field {f['name']!r} has type {f['type']!r}")
        k = _PRIMITIVE_KIND[t]
        block = strings if k == K_STRING else floats if k in (K_DOUBLE, K_FLOAT) else ints
        kinds.append(k)
        slots.append(len(block))
        block.append(f["name"])
        names.append(f["name"])
    return FlatLayout(
        name,
        tuple(names),
        np.array(kinds, np.int8),
        np.array(slots, np.int32),
        tuple(strings),
        tuple(ints),
        tuple(floats),
    )


@dataclass
class Coded:
    """A dictionary-coded string column: ``values[codes[i]]`` is row i."""

    codes: np.ndarray
    values: Sequence[str]

    @classmethod
    def of(cls, column: Any) -> Coded:
        """Dictionary-code any string column (Coded, pandas Categorical, array or list of str)."""
        if isinstance(column, Coded):
            return column
        if isinstance(column, pd.Series):
            column = column.array
        if isinstance(column, pd.Categorical):
            return cls(np.asarray(column.codes, np.int32), [str(v) for v in column.categories])
        # Arrow's hash table, not pandas' (which treats "\x00..." like "" -- C strings)
        enc = pa.array(column, type=pa.string(), from_pandas=True).dictionary_encode()
        if enc.null_count:
            raise ValueError("string column has missing values")
        return cls(
            enc.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
            enc.dictionary.to_pylist(),
        )

    def __len__(self) -> int:
        return len(self.codes)

    def to_numpy(self) -> np.ndarray:
        """The column as an object array of str."""
        return np.asarray(self.values, dtype=object)[self.codes]


def encode_dictionary(values: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each value as Avro ``string`` bytes (zig-zag varint length + UTF-8), concatenated.

    Returns ``(data uint8, offsets int64 of len(values)+1)``.
    """
    parts = []
    for v in values:
        b = v.encode("utf-8")
        parts.append(_varint(len(b)) + b)
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    return np.frombuffer(b"".join(parts), np.uint8).copy(), offsets


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


@nb.njit(cache=True, nogil=True)
def put_long(out, pos, v):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Avro ``long`` ``v`` (zig-zag varint) written at ``out[pos]``; the position after it."""
    z = np.uint64((v << 1) ^ (v >> 63))
    while z >= 0x80:
        out[pos] = np.uint8((z & np.uint64(0x7F)) | np.uint64(0x80))
        pos += 1
        z >>= np.uint64(7)
    out[pos] = np.uint8(z)
    return pos + 1


@nb.njit(cache=True, nogil=True)
def _encode_kernel(  # pragma: no cover - compiled
    n, hdr, kinds, slots, codes, dict_base, dict_data, dict_off, ints, fbits, out, rec_off
):
    pos = 0
    nf = kinds.shape[0]
    for i in range(n):
        rec_off[i] = pos
        for h in range(hdr.shape[0]):
            out[pos] = hdr[h]
            pos += 1
        for f in range(nf):
            k = kinds[f]
            s = slots[f]
            if k == 0:  # string: copy the pre-encoded dictionary entry
                e = dict_base[s] + codes[s, i]
                a = dict_off[e]
                b = dict_off[e + 1]
                for j in range(a, b):
                    out[pos] = dict_data[j]
                    pos += 1
            elif k == 1:  # int / long: zig-zag varint
                pos = put_long(out, pos, ints[s, i])
            elif k == 2:  # double: 8 bytes little endian
                z = fbits[s, i]
                for _ in range(8):
                    out[pos] = np.uint8(z & np.uint64(0xFF))
                    pos += 1
                    z >>= np.uint64(8)
            elif k == 3:  # float: 4 bytes little endian (bits in the low word)
                z = fbits[s, i]
                for _ in range(4):
                    out[pos] = np.uint8(z & np.uint64(0xFF))
                    pos += 1
                    z >>= np.uint64(8)
            else:  # boolean
                out[pos] = np.uint8(1 if ints[s, i] != 0 else 0)
                pos += 1
    rec_off[n] = pos
    return pos


@dataclass
class EncodedBatch:
    """``n`` framed Avro records in one buffer: record i is ``buf[offsets[i]:offsets[i+1]]``."""

    buf: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> bytes:
        return self.buf[self.offsets[i] : self.offsets[i + 1]].tobytes()

    def messages(self) -> list[bytes]:
        """All records as a list of ``bytes``."""
        data = self.buf.tobytes()
        off = self.offsets.tolist()
        return [data[off[i] : off[i + 1]] for i in range(len(off) - 1)]

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1])


def _as_columns(name: str, data: Mapping[str, Any] | pd.DataFrame) -> dict[str, Any]:
    if isinstance(data, pd.DataFrame):
        return {c: data[c] for c in data.columns}
    return dict(data)


def encode_batch(name: str, columns: Mapping[str, Any] | pd.DataFrame) -> EncodedBatch:
    """Encode a batch of records of the flat schema ``name`` given column-wise.

    ``columns`` maps every field to an array (numbers) or a string column
    (:class:`Coded`, pandas Categorical, or array/list of ``str``).  Extra
    columns are ignored; a missing field is a ``KeyError``.
    """
    lay = flat_layout(name)
    cols = _as_columns(name, columns)
    missing = [f for f in lay.fields if f not in cols]
    if missing:
        raise KeyError(f"{name}: missing columns {missing}")
    n = len(cols[lay.fields[0]]) if lay.fields else 0
    ns = len(lay.strings)
    codes = np.zeros((max(ns, 1), n), np.int32)
    dict_parts, dict_base = [], np.zeros(max(ns, 1), np.int64)
    entries = 0
    max_str = 0
    for s, fname in enumerate(lay.strings):
        c = Coded.of(cols[fname])
        if len(c.codes) != n:
            raise ValueError(f"{name}.{fname}: {len(c.codes)} rows, expected {n}")
        codes[s] = c.codes
        data, off = encode_dictionary(c.values)
        dict_base[s] = entries
        entries += len(c.values)
        dict_parts.append((data, off))
        if len(c.values):
            max_str += int(np.max(np.diff(off)))
    # concatenate the dictionaries into one table of entries
    total = sum(len(d) for d, _ in dict_parts)
    dict_data = np.empty(max(total, 1), np.uint8)
    dict_off = np.zeros(entries + 1, np.int64)
    pos, e = 0, 0
    for data, off in dict_parts:
        dict_data[pos : pos + len(data)] = data
        dict_off[e : e + len(off)] = off + pos
        pos += len(data)
        e += len(off) - 1
    ints = np.zeros((max(len(lay.ints), 1), n), np.int64)
    for s, fname in enumerate(lay.ints):
        ints[s] = np.asarray(cols[fname], dtype=np.int64)
    fbits = np.zeros((max(len(lay.floats), 1), n), np.uint64)
    for s, fname in enumerate(lay.floats):
        kind = lay.kinds[lay.fields.index(fname)]
        if kind == K_FLOAT:
            fbits[s] = np.asarray(cols[fname], dtype=np.float32).view(np.uint32)
        else:
            fbits[s] = np.asarray(cols[fname], dtype=np.float64).view(np.uint64)
    hdr = np.frombuffer(header(frame_ids().write_id(name)), np.uint8)
    bound = HEADER_LEN + max_str + 10 * len(lay.ints) + 8 * len(lay.floats)
    out = np.empty(max(n * bound, 1), np.uint8)
    rec_off = np.empty(n + 1, np.int64)
    end = _encode_kernel(
        n, hdr, lay.kinds, lay.slots, codes, dict_base, dict_data, dict_off, ints, fbits, out, rec_off
    )
    return EncodedBatch(out[:end], rec_off)


# --------------------------------------------------------------------------- record-wise (fastavro)
def encode(name: str, record: Mapping[str, Any]) -> bytes:
    """One framed record of schema ``name`` (any schema, via fastavro)."""
    buf = io.BytesIO()
    buf.write(header(frame_ids().write_id(name)))
    fastavro.schemaless_writer(buf, parsed_schema(name), dict(record))
    return buf.getvalue()


def encode_records(name: str, records: Iterable[Mapping[str, Any]]) -> list[bytes]:
    """Framed records of schema ``name`` (any schema, via fastavro)."""
    return [encode(name, r) for r in records]


def split_frame(payload: bytes, ids: FrameIds | None = None) -> tuple[int, memoryview]:
    """``(registry.json id, body)`` of a framed payload, its frame id read through ``ids``
    (default :func:`frame_ids`); raises :class:`AvroDecodeError`."""
    if payload is None or len(payload) < HEADER_LEN or payload[0] != MAGIC:
        raise AvroDecodeError("not a Tidewatch Avro frame (magic byte 0 + 4-byte schema id)")
    fid = int.from_bytes(payload[1:5], "big")
    sid = (ids or frame_ids()).local_id(fid)
    if sid is None:
        raise AvroDecodeError(f"unknown schema id {fid}")
    return sid, memoryview(payload)[HEADER_LEN:]


def decode(payload: bytes, name: str | None = None, ids: FrameIds | None = None) -> dict[str, Any]:
    """Decode one framed record into a dict (timestamps as int epoch ms).

    The frame's schema id names the writer schema (through ``ids``, default :func:`frame_ids`);
    the record is resolved to the current schema of its stream (or of ``name`` when given), so
    records written with an older compatible version decode with the new fields' defaults.
    Raises :class:`AvroDecodeError` on anything malformed.
    """
    sid, body = split_frame(payload, ids)
    writer_name = _registry()[sid]["name"]
    target = name or writer_name
    if name is not None and writer_name != name:
        raise AvroDecodeError(f"payload is a {writer_name!r} record, expected {name!r}")
    reader_id = schema_id(target)
    fo = io.BytesIO(body)
    try:
        rec = fastavro.schemaless_reader(
            fo, _parsed_by_id(sid), None if reader_id == sid else _parsed_by_id(reader_id)
        )
    except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError ...
        raise AvroDecodeError(f"{target}: {type(exc).__name__}: {exc}") from exc
    if fo.tell() != len(body):
        raise AvroDecodeError(f"{target}: {len(body) - fo.tell()} trailing bytes")
    return rec  # type: ignore[return-value]


# --------------------------------------------------------------------------- columnar decode
@nb.njit(cache=True, nogil=True)
def _utf8_ok(data, p, e):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Whether ``data[p:e]`` is well-formed UTF-8 (Unicode 15, table 3-7: no overlong forms,
    no surrogates, nothing past U+10FFFF) -- Avro strings are UTF-8 by the specification."""
    while p < e:
        b = data[p]
        if b < 0x80:
            p += 1
            continue
        if 0xC2 <= b <= 0xDF:
            n = 1
            lo, hi = 0x80, 0xBF
        elif 0xE0 <= b <= 0xEF:
            n = 2
            lo = 0xA0 if b == 0xE0 else 0x80
            hi = 0x9F if b == 0xED else 0xBF
        elif 0xF0 <= b <= 0xF4:
            n = 3
            lo = 0x90 if b == 0xF0 else 0x80
            hi = 0x8F if b == 0xF4 else 0xBF
        else:
            return False
        if p + n >= e:
            return False
        c = data[p + 1]
        if c < lo or c > hi:
            return False
        for j in range(2, n + 1):
            c = data[p + j]
            if c < 0x80 or c > 0xBF:
                return False
        p += n + 1
    return True


@nb.njit(cache=True, nogil=True, inline="always")
def zigzag_varint(data, p, e):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """The zigzag varint at ``data[p]`` (Avro's int/long, the v2 Kafka record's fields), not
    reading at or past ``e``: ``(value, next position)``, position -1 when it is malformed."""
    z = np.uint64(0)
    shift = np.uint64(0)
    while True:
        if p >= e or shift > np.uint64(63):
            return np.int64(0), -1
        b = data[p]
        p += 1
        z |= np.uint64(b & 0x7F) << shift
        if b < 0x80:
            break
        shift += np.uint64(7)
    return np.int64(z >> np.uint64(1)) ^ -np.int64(z & np.uint64(1)), p


@nb.njit(cache=True, nogil=True)
def _decode_kernel(  # pragma: no cover - compiled
    data, starts, ends, sids, kinds, slots, n_str, ints, fbits, str_start, str_len, ok
):
    n = starts.shape[0]
    nf = kinds.shape[0]
    for i in range(n):
        p = starts[i]
        e = ends[i]
        good = e - p >= 5 and data[p] == 0
        if good:
            got = (
                (np.int64(data[p + 1]) << 24)
                | (np.int64(data[p + 2]) << 16)
                | (np.int64(data[p + 3]) << 8)
                | np.int64(data[p + 4])
            )
            good = False
            for j in range(sids.shape[0]):  # the frame ids of the schema (one without a registry)
                if got == sids[j]:
                    good = True
        p += 5
        f = 0
        high = np.uint8(0)  # the OR of every string byte of the record
        while good and f < nf:
            k = kinds[f]
            s = slots[f]
            if k == 0 or k == 1:
                v, p = zigzag_varint(data, p, e)
                if p < 0:
                    good = False
                    break
                if k == 1:
                    ints[s, i] = v
                else:
                    if v < 0 or p + v > e:
                        good = False
                        break
                    for j in range(p, p + v):  # UTF-8 is checked after the loop, where not ASCII
                        high |= data[j]
                    str_start[s, i] = p
                    str_len[s, i] = v
                    p += v
            elif k == 2 or k == 3:
                w = 8 if k == 2 else 4
                if p + w > e:
                    good = False
                    break
                z = np.uint64(0)
                for j in range(w):
                    z |= np.uint64(data[p + j]) << np.uint64(8 * j)
                fbits[s, i] = z
                p += w
            else:
                if p >= e or data[p] > 1:
                    good = False
                    break
                ints[s, i] = data[p]
                p += 1
            f += 1
        ok[i] = good and p == e
        if ok[i] and high >= 0x80:
            for s in range(n_str):  # the record's strings, in its string slots
                a = str_start[s, i]
                if not _utf8_ok(data, a, a + str_len[s, i]):
                    ok[i] = False
                    break
    return 0


@nb.njit(cache=True, nogil=True)
def _gather_strings(data, start, length, ok):  # pragma: no cover - compiled
    n = start.shape[0]
    offs = np.zeros(n + 1, np.int32)
    tot = 0
    for i in range(n):
        if ok[i]:
            tot += length[i]
        offs[i + 1] = tot
    out = np.empty(tot, np.uint8)
    for i in range(n):
        if ok[i]:
            a = start[i]
            o = offs[i]
            for j in range(length[i]):
                out[o + j] = data[a + j]
    return out, offs


@nb.njit(cache=True, nogil=True)
def _dictionary_run(data, start, length, i, codes, slots, hashes, uoff, ubytes, nu):  # pragma: no cover
    """Code rows ``i..`` of :func:`dictionary_codes`; stops at the first new value that does
    not fit its tables and returns ``(row, distinct values)`` (the caller grows them)."""
    n = start.shape[0]
    cap = slots.shape[0]
    while i < n:
        a = start[i]
        m = length[i]
        h = np.uint64(14695981039346656037)
        for j in range(m):
            h = (h ^ np.uint64(data[a + j])) * np.uint64(1099511628211)
        h ^= h >> np.uint64(33)  # FNV's low bits cluster: mix the high ones in (murmur3 fmix)
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        k = np.int64(h & np.uint64(cap - 1))
        code = -1
        while slots[k] >= 0:
            c = slots[k]
            b = uoff[c]
            if hashes[c] == h and uoff[c + 1] - b == m:
                same = True
                for j in range(m):
                    if data[a + j] != ubytes[b + j]:
                        same = False
                        break
                if same:
                    code = c
                    break
            k = (k + 1) & (cap - 1)
        if code < 0:
            b = uoff[nu]
            if nu + 1 >= hashes.shape[0] or b + m > ubytes.shape[0] or 2 * (nu + 1) > cap:
                return i, nu
            for j in range(m):
                ubytes[b + j] = data[a + j]
            uoff[nu + 1] = b + m
            hashes[nu] = h
            slots[k] = nu
            code = nu
            nu += 1
        codes[i] = code
        i += 1
    return n, nu


@nb.njit(cache=True, nogil=True)
def _dictionary_slots(hashes, nu, cap):  # pragma: no cover - compiled
    slots = np.full(cap, -1, np.int64)
    for c in range(nu):
        k = np.int64(hashes[c] & np.uint64(cap - 1))
        while slots[k] >= 0:
            k = (k + 1) & (cap - 1)
        slots[k] = c
    return slots


def dictionary_codes(data: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, pa.Array]:
    """Dictionary-encode the strings ``data[start:start + length]``: their int32 codes and the
    distinct values (first-seen order) as an Arrow string array.  Open addressing on FNV-1a,
    a hit confirmed byte for byte against a compact copy of the distinct values, which stays
    in cache where their rows in ``data`` would not; the tables grow outside the hot loop."""
    n = start.shape[0]
    codes = np.empty(n, np.int32)
    slots = np.full(1024, -1, np.int64)
    hashes = np.empty(256, np.uint64)
    uoff = np.zeros(257, np.int64)  # distinct value c is ubytes[uoff[c]:uoff[c + 1]]
    ubytes = np.empty(4096, np.uint8)
    i = nu = 0
    while True:
        i, nu = _dictionary_run(data, start, length, i, codes, slots, hashes, uoff, ubytes, nu)
        if i >= n:
            break
        if nu + 1 >= hashes.shape[0]:
            hashes = np.concatenate((hashes, np.empty(hashes.shape[0], np.uint64)))
            uoff = np.concatenate((uoff, np.zeros(hashes.shape[0] + 1 - uoff.shape[0], np.int64)))
        if uoff[nu] + length[i] > ubytes.shape[0]:
            ubytes = np.concatenate((ubytes, np.empty(max(ubytes.shape[0], int(length[i])), np.uint8)))
        if 2 * (nu + 1) > slots.shape[0]:
            slots = _dictionary_slots(hashes, nu, 2 * slots.shape[0])
    offs = uoff[: nu + 1].astype(np.int32)
    values = pa.StringArray.from_buffers(nu, pa.py_buffer(offs), pa.py_buffer(ubytes[: int(offs[-1])].copy()))
    return codes, values


def decode_batch(
    name: str,
    payloads: Sequence[bytes | None] | pa.Array,
    order: np.ndarray | None = None,
    *,
    dictionary: bool = False,
    ids: FrameIds | None = None,
) -> tuple[pa.RecordBatch, np.ndarray]:
    """Decode many framed records of the flat schema ``name`` column-wise (``order``: the
    records in that order, ``payloads[order]`` without copying them; ``dictionary``: string
    columns dictionary-encoded in the kernel, ``dictionary<int32, string>``; ``ids``: how frame
    ids are read, default :func:`frame_ids`).

    Returns ``(batch, ok)``: a :class:`pyarrow.RecordBatch` with one column per
    field (strings as ``string``, int/long as ``int64``, double/float as
    ``float64``, boolean as ``bool``; ``ts`` as int64 epoch ms) holding the rows
    that decoded, and a boolean mask over the input telling which rows did
    (the others are for the dead-letter topic).  Only records written with the
    current schema of ``name`` are accepted by this fast path: its ``registry.json`` id, or with a
    Schema Registry every frame id of the batch that ``ids`` maps to it (:func:`accepted_ids`).
    """
    lay = flat_layout(name)
    if isinstance(payloads, pa.Array | pa.ChunkedArray):
        arr = payloads.combine_chunks() if isinstance(payloads, pa.ChunkedArray) else payloads
        arr = arr.cast(pa.large_binary())
        n = len(arr)
        bufs = arr.buffers()
        offs = np.frombuffer(bufs[1], np.int64, n + 1, arr.offset * 8) if n else np.zeros(1, np.int64)
        data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        starts = offs[:-1].copy()
        ends = offs[1:].copy()
        if arr.null_count:
            valid = np.asarray(arr.is_valid())
            ends = np.where(valid, ends, starts)
    else:
        lens = np.fromiter((0 if p is None else len(p) for p in payloads), np.int64, len(payloads))
        n = len(lens)
        ends = np.cumsum(lens)
        starts = ends - lens
        data = np.frombuffer(b"".join(p for p in payloads if p is not None), np.uint8)
    if order is not None:
        starts, ends = starts[order], ends[order]
        n = len(starts)
    ns, ni, nfl = len(lay.strings), len(lay.ints), len(lay.floats)
    ints = np.zeros((max(ni, 1), n), np.int64)
    fbits = np.zeros((max(nfl, 1), n), np.uint64)
    sst = np.zeros((max(ns, 1), n), np.int64)
    sln = np.zeros((max(ns, 1), n), np.int64)
    ok = np.zeros(n, np.bool_)
    sids = accepted_ids(name, data, starts, ends, ids or frame_ids())
    _decode_kernel(data, starts, ends, sids, lay.kinds, lay.slots, ns, ints, fbits, sst, sln, ok)
    keep = np.flatnonzero(ok)
    arrays = []
    for k, s in zip(lay.kinds, lay.slots, strict=True):
        if k == K_STRING and dictionary:
            codes, values = dictionary_codes(data, sst[s][keep], sln[s][keep])
            arrays.append(pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), values))
        elif k == K_STRING:
            sdata, soffs = _gather_strings(data, sst[s][keep], sln[s][keep], np.ones(len(keep), np.bool_))
            arrays.append(pa.StringArray.from_buffers(len(keep), pa.py_buffer(soffs), pa.py_buffer(sdata)))
        elif k == K_LONG:
            arrays.append(pa.array(ints[s][keep]))
        elif k == K_BOOL:
            arrays.append(pa.array(ints[s][keep] != 0))
        elif k == K_DOUBLE:
            arrays.append(pa.array(fbits[s][keep].view(np.float64)))
        else:
            arrays.append(pa.array(fbits[s][keep].astype(np.uint32).view(np.float32).astype(np.float64)))
    return pa.RecordBatch.from_arrays(arrays, names=list(lay.fields)), ok
