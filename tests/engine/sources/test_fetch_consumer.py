"""The fetch consumer's pure parts (``engine.sources.fetch_consumer``), no broker: the record kernel reads
v2 records written here by hand (null and empty keys and values, headers, LogAppendTime, the
fetch offset inside a batch), refuses broken framing instead of reading past it, and a fetched
chunk is handed over in slices that keep each partition-EOF event in its place.  The consumer
against a real broker is in ``test_native_consumer.py``."""

from __future__ import annotations

import numpy as np
import pytest

from engine.sources.fetch_consumer import FetchConsumer, _control_type, _empty, _records, _slice
from engine.sources.native_consumer import ERR_PARTITION_EOF, Chunk, ConsumeError, _binary


def varint(v: int) -> bytes:
    z = (v << 1) ^ (v >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def record(
    offset_delta: int, ts_delta: int, key: bytes | None, value: bytes | None, headers: int = 0
) -> bytes:
    body = b"\x00" + varint(ts_delta) + varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(headers) + b"".join(varint(1) + b"h" + varint(2) + b"hv" for _ in range(headers))
    return varint(len(body)) + body


def run(segments: list[tuple[bytes, int, int, int, int]]) -> tuple[int, dict[str, np.ndarray]]:
    """``_records`` over (records, base offset, base ts, log-append ts, min offset) segments."""
    data = np.frombuffer(b"".join(s[0] for s in segments), np.uint8)
    lens = np.array([len(s[0]) for s in segments], np.int64)
    ends = np.cumsum(lens)
    cols = [np.array([s[i] for s in segments], np.int64) for i in range(1, 5)]
    cap = len(data)
    out = {k: np.empty(cap, np.int64) for k in ("off", "ts", "kst", "kln", "vst", "vln", "seg")}
    n = int(_records(data, ends - lens, ends, *cols, *out.values()))
    out["data"] = data
    return n, out


def test_records_are_read_with_their_offsets_times_keys_and_values() -> None:
    recs = [
        record(0, 0, b"k0", b"v0"),
        record(1, 5, None, b"v1", headers=2),
        record(2, 9, b"", None),
        record(3, 11, b"k3", b""),
    ]
    n, out = run([(b"".join(recs), 100, 1_000, -1, 101), (record(0, 3, b"x", b"y"), 200, 2_000, 7_777, 0)])
    assert n == 4  # offset 100 is before the fetch offset 101
    assert out["off"][:n].tolist() == [101, 102, 103, 200]
    assert out["ts"][:n].tolist() == [1_005, 1_009, 1_011, 7_777]  # LogAppendTime: the batch's time
    assert out["kln"][:n].tolist() == [-1, 0, 2, 1] and out["vln"][:n].tolist() == [2, -1, 0, 1]
    d = out["data"]
    assert bytes(d[out["vst"][0] : out["vst"][0] + 2]) == b"v1"
    assert bytes(d[out["kst"][2] : out["kst"][2] + 2]) == b"k3"
    assert out["seg"][:n].tolist() == [0, 0, 0, 1]


@pytest.mark.parametrize("cut", [1, 3, 6, 9])
def test_broken_framing_is_refused_not_read_past(cut: int) -> None:
    good = record(0, 0, b"key", b"value")
    broken = good[:-cut]
    n, _ = run([(good, 0, 0, -1, 0), (broken, 1, 0, -1, 0)])
    assert n == -2  # -1 - the segment that is broken


def test_control_record_type() -> None:
    abort = record(0, 0, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00")
    commit = record(0, 0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")
    assert _control_type(memoryview(abort), 0x20) == 0
    assert _control_type(memoryview(commit), 0x20) == 1
    assert _control_type(memoryview(abort[:5]), 0x20) == -1


def chunk(n: int, errors: list[ConsumeError]) -> Chunk:
    offs = np.arange(n + 1, dtype=np.int64)
    data = np.arange(n, dtype=np.uint8)
    valid = np.ones(n, np.uint8)
    return Chunk(["t"], np.zeros(n, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int64),
                 np.zeros(n, np.int64), _binary(n, offs, data, valid), _binary(n, offs, data, valid), errors)  # fmt: skip


def eof(position: int) -> ConsumeError:
    return ConsumeError(ERR_PARTITION_EOF, "t", 0, position, "end", position)


def test_a_fetch_is_handed_over_in_slices_with_its_events_in_place() -> None:
    c = FetchConsumer.__new__(FetchConsumer)  # no broker: the fetched chunk is already buffered
    c._pending = chunk(10, [eof(0), eof(4), eof(10)])
    c._topics = ["t"]
    first = c.consume(4, 0.0)
    second = c.consume(4, 0.0)
    third = c.consume(4, 0.0)
    assert [len(first), len(second), len(third)] == [4, 4, 2]
    assert [e.position for e in first.errors] == [0, 4]
    assert second.errors == []
    assert [e.position for e in third.errors] == [2]
    assert third.offset.tolist() == [8, 9] and third.value.to_pylist() == [bytes([8]), bytes([9])]
    assert c._pending is None
    assert len(_slice(chunk(3, [eof(3)]), 0, 3).errors) == 1 and len(_empty(["t"])) == 0


def test_keys_and_values_become_a_large_binary_column() -> None:
    """Views into the fetched bytes (inline up to 12 bytes, else prefix + offset), then one copy
    by Arrow: nulls, empties, short and long values come out as they were."""
    from engine.sources.fetch_consumer import _large_binary

    data = np.frombuffer(bytes(range(256)) * 4, np.uint8)
    start = np.array([0, 5, 7, 100, 300, 1000], np.int64)
    length = np.array([-1, 0, 12, 13, 200, 24], np.int64)
    col = _large_binary(data, start, length)
    assert str(col.type) == "large_binary"
    want = [None if n < 0 else bytes(data[a : a + n]) for a, n in zip(start, length, strict=True)]
    assert col.to_pylist() == want
