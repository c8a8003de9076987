"""decode.py / dead_letter.py: Kafka records -> validated columns and dead letters (no services)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.dead_letter import DeadLetters
from engine.decode import decode_records
from tidewatch.wire.avro import decode, encode, encode_batch


def _trades(n: int, t0: int = 1_000_000) -> dict[str, object]:
    rng = np.random.default_rng(1)
    return {
        "symbol": [f"S{i % 5}" for i in range(n)],
        "ts": t0 + np.arange(n, dtype=np.int64) * 10,
        "price": rng.uniform(10, 20, n),
        "size": rng.integers(0, 100, n),
        "side": ["BID" if i % 2 else "ASK" for i in range(n)],
        "exchange": ["NASDAQ"] * n,
    }


def _records(values: list[bytes | None], kafka_ts: int) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(np.arange(n, dtype=np.int64)[::-1]),  # reversed: decode must sort
            "timestamp": pa.array([kafka_ts] * n, pa.timestamp("ms")),
            "key": pa.array([b"k"] * n, pa.binary()),
            "value": pa.array(values[::-1], pa.binary()),
        }
    )


def test_good_records_decode_in_offset_order() -> None:
    cols = _trades(50)
    vals = encode_batch("trades", cols).messages()
    dead = DeadLetters()
    out = decode_records(
        "trades", _records(vals, 1_000_000), late_until=None, max_future_ms=60_000, dead=dead
    )
    assert len(out) == 50 and len(dead) == 0
    np.testing.assert_array_equal(out.ts, cols["ts"])
    np.testing.assert_array_equal(out.offset, np.arange(50))
    assert list(out.columns["symbol"][:3]) == ["S0", "S1", "S2"]
    np.testing.assert_allclose(out.columns["price"], cols["price"])


def test_every_bad_record_is_dead_lettered_with_reason() -> None:
    good = encode_batch("trades", _trades(10)).messages()
    base = decode(good[0])

    def rec(**kw: object) -> bytes:
        return encode("trades", {**base, **kw})

    bad = [
        b"garbage",  # undecodable
        good[1][:-3],  # truncated
        encode(
            "packets",
            {
                "ts": 1,
                "src_ip": "a",
                "dst_ip": "b",
                "src_port": 1,
                "dst_port": 2,
                "protocol": "TCP",
                "length": 3,
                "tcp_flags": "S",
            },
        ),  # wrong schema
        rec(size=-1),
        rec(price=float("nan")),
        rec(price=float("inf")),
        rec(symbol=""),
        rec(size=2**60),  # above 2**53: window sums would not be exact
        rec(ts=base["ts"] + 10_000_000),  # future
        rec(ts=999_000),  # late
    ]
    values = good + bad
    dead = DeadLetters()
    out = decode_records(
        "trades",
        _records(values, 1_000_000),
        late_until=999_500,
        max_future_ms=60_000,
        dead=dead,
        watermark=1_004_500,
    )
    assert len(out) == 10
    assert dead.counts() == {"undecodable": 3, "invalid": 5, "future": 1, "late": 1}
    # raw bytes and source offsets are kept
    by_offset = dict(zip(dead.source_offset, dead.value, strict=True))
    for i, v in enumerate(bad):
        assert by_offset[10 + i] == v
    assert {
        "negative size",
        "empty symbol",
        "price is NaN or infinite",
        "size above 2**53 in magnitude",
    } <= set(dead.detail)
    assert all(t == "trades" for t in dead.source_topic)
    recs = dead.records(logged_at=5)
    roundtrip = decode(encode("dead_letter", recs[0]))
    assert roundtrip["reason"] == recs[0]["reason"] and roundtrip["value"] == recs[0]["value"]


def test_packets_invariants() -> None:
    n = 4
    cols = {
        "ts": np.array([1000, 1001, 1002, 1003]),
        "src_ip": ["10.0.0.1", "", "10.0.0.3", "10.0.0.4"],
        "dst_ip": ["10.0.0.9"] * n,
        "src_port": np.array([1, 2, 3, 4]),
        "dst_port": np.array([80, 80, -5, 80]),
        "protocol": ["TCP"] * n,
        "length": np.array([60, 60, 60, -1]),
        "tcp_flags": ["S", "", "A", "SA"],
    }
    dead = DeadLetters()
    out = decode_records(
        "packets",
        _records(encode_batch("packets", cols).messages(), 1000),
        late_until=None,
        max_future_ms=60_000,
        dead=dead,
    )
    assert len(out) == 1 and out.columns["src_ip"][0] == "10.0.0.1"
    assert dead.counts()["invalid"] == 3


def test_interleaved_partitions_are_decoded_in_arrival_order_with_their_own_keys_and_times() -> None:
    """Chunks of two partitions interleaved, as a consumer hands them over (the restart replay's
    :func:`engine.sources.readers.read_ranges`): decoded in
    (partition, offset) order without copying the payloads, and a bad record's key, bytes and
    Kafka timestamp are its own."""
    cols = _trades(40)
    vals = encode_batch("trades", cols).messages()
    part = np.array([0] * 10 + [1] * 10 + [0] * 10 + [1] * 10, np.int32)
    offs = np.array([*range(10), *range(10), *range(10, 20), *range(10, 20)], np.int64)
    kts = np.full(40, 1_000_000, np.int64)
    kts[25] = 0  # a Kafka timestamp long before the event's ts: "future"
    tbl = pa.table(
        {
            "partition": pa.array(part),
            "offset": pa.array(offs),
            "timestamp": pa.array(kts, pa.timestamp("ms")),
            "key": pa.array([f"k{i}".encode() for i in range(40)], pa.binary()),
            "value": pa.array(vals, pa.binary()),
        }
    )
    dead = DeadLetters()
    out = decode_records("trades", tbl, late_until=None, max_future_ms=60_000, dead=dead)
    want = np.lexsort((offs, part))
    want = want[want != 25]
    np.testing.assert_array_equal(out.partition, part[want])
    np.testing.assert_array_equal(out.offset, offs[want])
    np.testing.assert_array_equal(out.ts, cols["ts"][want])
    assert dead.counts()["future"] == 1 and len(dead) == 1
    assert (dead.source_partition[0], dead.source_offset[0]) == (0, 15)
    assert dead.key == [b"k25"] and dead.value == [vals[25]]
