"""decode.py / dead_letter.py: Kafka records -> validated columns and dead letters (no services)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.dead_letter import REASONS, DeadLetters
from engine.decode import NULL_VALUE, decode_records
from tidewatch.schema import STREAMS as SCHEMAS
from tidewatch.schema import FieldSpec
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
    assert dead.counts() == {
        **dict.fromkeys(REASONS, 0),
        "undecodable": 3,
        "invalid": 5,
        "future": 1,
        "late": 1,
    }
    # raw bytes and source offsets are kept
    by_offset = dict(zip(dead.source_offset, dead.value, strict=True))
    for i, v in enumerate(bad):
        assert by_offset[10 + i] == v
    assert {
        "size -1 is not >= 0",
        "symbol is empty (it must not be)",
        "price nan is not a finite number",
        "price inf is not a finite number",
        "size 1152921504606846976 is not <= 2**53",
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


# ---------------------------------------------------------------- the fields' domains (tidewatch.schema)
_PACKET = {
    "ts": 1000,
    "src_ip": "10.0.0.1",
    "dst_ip": "10.0.0.2",
    "src_port": 40000,
    "dst_port": 443,
    "protocol": "TCP",
    "length": 60,
    "tcp_flags": "SA",
}
_TRADE = {"symbol": "AAPL", "ts": 1000, "price": 10.5, "size": 5, "side": "BID", "exchange": "NASDAQ"}

#: (stream, the field changed, its bad value, the dead letter's detail): one per rule of a domain
DOMAIN_CASES = [
    ("trades", "price", -1e12, "price -1e+12 is not > 0"),
    ("trades", "price", 0.0, "price 0 is not > 0"),
    ("trades", "price", 1e17, "price 1e+17 is not <= 2**53"),
    ("trades", "side", "SIDEWAYS", "side 'SIDEWAYS' is not one of BID, ASK, UNKNOWN"),
    ("trades", "side", "bid", "side 'bid' is not one of BID, ASK, UNKNOWN"),
    ("trades", "exchange", "", "exchange is empty (it must not be)"),
    ("trades", "ts", -1, "ts -1 is not >= 0"),
    ("trades", "ts", 2**53 + 1, "ts 9007199254740993 is not <= 2**53"),
    ("packets", "src_port", 65536, "src_port 65536 is not <= 65535"),
    ("packets", "dst_port", -1, "dst_port -1 is not >= 0"),
    ("packets", "length", 65576, "length 65576 is not <= 65575"),
    ("packets", "dst_ip", "", "dst_ip is empty (it must not be)"),
    (
        "packets",
        "protocol",
        "tcp",
        "protocol 'tcp' is not one of TCP, UDP, ICMP, ICMPv6, IP-<n> (the other IP protocol numbers n)",
    ),
    (
        "packets",
        "protocol",
        "IP-6",
        "protocol 'IP-6' is not one of TCP, UDP, ICMP, ICMPv6, IP-<n> (the other IP protocol numbers n)",
    ),
    (
        "packets",
        "tcp_flags",
        "AS",
        "tcp_flags 'AS' is not TCP flag letters in the order FSRPAUEC, each at most once (or '')",
    ),
    (
        "packets",
        "tcp_flags",
        "SS",
        "tcp_flags 'SS' is not TCP flag letters in the order FSRPAUEC, each at most once (or '')",
    ),
]


@pytest.mark.parametrize(("stream", "field", "value", "detail"), DOMAIN_CASES)
def test_a_field_outside_its_domain_is_an_invalid_dead_letter_naming_field_and_rule(
    stream: str, field: str, value: object, detail: str
) -> None:
    base = _TRADE if stream == "trades" else _PACKET
    good = encode(stream, base)
    bad = encode(stream, {**base, field: value})
    dead = DeadLetters()
    out = decode_records(
        stream, _records([good, bad, good], 1000), late_until=None, max_future_ms=60_000, dead=dead
    )
    assert out.offset.tolist() == [0, 2]
    assert dead.reason == ["invalid"] and dead.detail == [detail]
    assert dead.source_offset == [1] and dead.value == [bad]


def test_the_edges_of_each_domain_are_valid() -> None:
    trades = [
        {**_TRADE, "price": 5e-324, "size": 0, "ts": 0, "side": "UNKNOWN"},
        {**_TRADE, "price": float(2**53), "size": 2**53, "ts": 2**53},
    ]
    packets = [
        {**_PACKET, "src_port": 0, "dst_port": 65535, "length": 0, "protocol": "IP-255", "tcp_flags": ""},
        {**_PACKET, "length": 65575, "protocol": "ICMPv6", "tcp_flags": "FSRPAUEC"},
    ]
    for stream, recs in (("trades", trades), ("packets", packets)):
        dead = DeadLetters()
        out = decode_records(
            stream,
            _records([encode(stream, r) for r in recs], 1000),
            late_until=None,
            max_future_ms=None,
            dead=dead,  # type: ignore[arg-type]
        )
        assert len(dead) == 0 and len(out) == 2, dead.detail


def test_a_null_valued_kafka_message_is_an_undecodable_dead_letter_with_a_null_value() -> None:
    good = encode("trades", _TRADE)
    dead = DeadLetters()
    out = decode_records(
        "trades", _records([good, None, b""], 1000), late_until=None, max_future_ms=60_000, dead=dead
    )
    assert out.offset.tolist() == [0]
    got = dict(zip(dead.source_offset, zip(dead.reason, dead.detail, dead.value, strict=True), strict=True))
    assert got[1] == ("undecodable", NULL_VALUE, None)  # null stays null, not b""
    assert got[2][0] == "undecodable" and got[2][1] != NULL_VALUE and got[2][2] == b""
    rec = decode(encode("dead_letter", dead.records(logged_at=1)[dead.source_offset.index(1)]))
    assert rec["value"] is None and rec["reason"] == "undecodable"


def _domain_value(f: FieldSpec) -> st.SearchStrategy[object]:
    if f.type == "int":
        lo, hi = f.bounds
        return st.integers(lo + 1 if f.low_open else lo, hi)
    if f.type == "float":
        lo, hi = f.bounds
        return st.floats(float(lo), float(hi), allow_nan=False, exclude_min=f.low_open)
    if f.values is not None:
        return st.sampled_from(f.values)
    text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
    return text if f.empty_ok else text.filter(bool)


@st.composite
def _valid_batch(draw: st.DrawFn) -> tuple[str, list[dict[str, object]]]:
    stream = draw(st.sampled_from(sorted(SCHEMAS)))
    fields = SCHEMAS[stream].fields
    rec = st.fixed_dictionaries({name: _domain_value(f) for name, f in fields.items()})
    return stream, draw(st.lists(rec, min_size=1, max_size=20))


@settings(max_examples=200, deadline=None)
@given(_valid_batch())
def test_valid_records_are_never_dead_lettered(batch: tuple[str, list[dict[str, object]]]) -> None:
    stream, recs = batch
    dead = DeadLetters()
    out = decode_records(
        stream,
        _records([encode(stream, r) for r in recs], 0),
        late_until=None,
        max_future_ms=None,
        dead=dead,  # type: ignore[arg-type]
    )
    assert len(dead) == 0, dead.detail
    assert len(out) == len(recs)
