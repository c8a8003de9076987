"""tidewatch.wire.avro: framing, the Numba batch encoder/decoder against fastavro, schema evolution."""

from __future__ import annotations

import io
import json

import fastavro
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewatch.wire import avro
from tidewatch.wire.avro import AvroDecodeError, Coded, decode, decode_batch, encode, encode_batch

TRADE = {
    "symbol": "AAPL",
    "ts": 1_709_564_400_123,
    "price": 171.25,
    "size": 300,
    "side": "ASK",
    "exchange": "NASDAQ",
}
PACKET = {
    "ts": 1_709_564_400_000,
    "src_ip": "10.0.0.1",
    "dst_ip": "2001:db8::1",
    "src_port": 51515,
    "dst_port": 443,
    "protocol": "TCP",
    "length": 1500,
    "tcp_flags": "SA",
}


def test_every_schema_loads_parses_and_has_a_distinct_id() -> None:
    names = avro.schema_names()
    assert set(names) == {"trades", "packets", "alerts", "results", "dead_letter"}
    ids = {avro.schema_id(n) for n in names}
    assert len(ids) == len(names)
    for n in names:
        fastavro.parse_schema(json.loads(avro.load_schema_json(n)))


def test_trade_and_packet_fields_are_those_of_rules_md() -> None:
    assert avro.field_names("trades") == ["symbol", "ts", "price", "size", "side", "exchange"]
    assert avro.field_names("packets") == [
        "ts",
        "src_ip",
        "dst_ip",
        "src_port",
        "dst_port",
        "protocol",
        "length",
        "tcp_flags",
    ]


def test_frame_is_magic_zero_and_big_endian_schema_id() -> None:
    b = encode("trades", TRADE)
    assert b[0] == 0 and int.from_bytes(b[1:5], "big") == avro.schema_id("trades")
    # the body is plain Avro binary: fastavro reads it with the .avsc schema
    body = fastavro.schemaless_reader(io.BytesIO(b[5:]), avro.parsed_schema("trades"))
    assert body == TRADE


@pytest.mark.parametrize(("name", "rec"), [("trades", TRADE), ("packets", PACKET)])
def test_batch_encoder_is_byte_identical_to_fastavro(name: str, rec: dict) -> None:
    cols = {k: [v] * 3 for k, v in rec.items()}
    batch = encode_batch(name, cols)
    assert len(batch) == 3
    assert batch.messages() == [encode(name, rec)] * 3
    assert decode(batch[1]) == rec


def test_other_schemas_round_trip_through_fastavro() -> None:
    alert = {
        "id": "s1|AAPL|ENTER|1000",
        "subscription_id": "s1",
        "rule_name": "r",
        "stream": "trades",
        "key": "AAPL",
        "kind": "ENTER",
        "as_of": 1000,
        "values": {"sum": 1.5, "avg": None},
        "batch_id": 3,
        "emitted_at": 1001,
    }
    assert decode(encode("alerts", alert)) == alert
    dl = {
        "source_topic": "trades",
        "source_partition": 0,
        "source_offset": 5,
        "key": b"k",
        "value": b"\x00x",
        "reason": "undecodable",
        "detail": "",
        "event_ts": None,
        "watermark": 7,
        "logged_at": 9,
    }
    assert decode(encode("dead_letter", dl)) == dl
    res = {
        "subscription_id": "s",
        "key": "10.0.0.1",
        "present": True,
        "as_of": 5,
        "values": {},
        "batch_id": -1,
    }
    assert decode(encode("results", res), "results") == res


trade_rows = st.lists(
    st.fixed_dictionaries(
        {
            "symbol": st.text(min_size=0, max_size=12),
            "ts": st.integers(-(2**62), 2**62),
            "price": st.floats(allow_nan=False),
            "size": st.integers(-(2**63), 2**63 - 1),
            "side": st.sampled_from(["BID", "ASK", "UNKNOWN"]),
            "exchange": st.text(max_size=8),
        }
    ),
    min_size=0,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(trade_rows)
def test_encode_batch_decode_batch_round_trip(rows: list[dict]) -> None:
    cols = {k: [r[k] for r in rows] for k in avro.field_names("trades")}
    batch = encode_batch("trades", cols)
    msgs = batch.messages()
    assert msgs == [encode("trades", r) for r in rows]
    rb, ok = decode_batch("trades", msgs)
    assert ok.all() and rb.num_rows == len(rows)
    assert rb.to_pylist() == rows


def test_decode_batch_flags_malformed_and_foreign_records() -> None:
    good = encode_batch("trades", {k: [v] * 2 for k, v in TRADE.items()}).messages()
    payloads = [
        good[0],
        b"",
        b"garbage",
        good[1][:-2],
        good[1] + b"\x00",
        encode("packets", PACKET),
        None,
        good[1],
    ]
    rb, ok = decode_batch("trades", payloads)
    assert ok.tolist() == [True, False, False, False, False, False, False, True]
    assert rb.to_pylist() == [TRADE, TRADE]


def test_decode_batch_accepts_an_arrow_binary_column() -> None:
    import pyarrow as pa

    msgs = encode_batch("packets", {k: [v] * 4 for k, v in PACKET.items()}).messages()
    arr = pa.array([msgs[0], None, msgs[1], b"x", msgs[2]], pa.binary()).slice(1)
    rb, ok = decode_batch("packets", arr)
    assert ok.tolist() == [False, True, False, True]
    assert rb.to_pylist() == [PACKET, PACKET]


@pytest.mark.parametrize(
    "bad", [b"", b"\x01\x00\x00\x00\x01abc", b"\x00\x00\x00\x03\xe7abc", b"\x00\x00\x00\x00\x01"]
)
def test_decode_rejects_what_is_not_a_framed_record(bad: bytes) -> None:
    with pytest.raises(AvroDecodeError):
        decode(bad)


def test_decode_rejects_trailing_bytes_and_wrong_stream() -> None:
    b = encode("trades", TRADE)
    with pytest.raises(AvroDecodeError):
        decode(b + b"\x00")
    with pytest.raises(AvroDecodeError):
        decode(b, "packets")


def test_coded_columns_and_plain_string_columns_encode_the_same() -> None:
    plain = {k: [v] * 5 for k, v in TRADE.items()}
    coded = dict(
        plain,
        symbol=Coded(np.zeros(5, np.int32), ["AAPL"]),
        side=Coded(np.full(5, 1, np.int32), ["BID", "ASK"]),
    )
    assert encode_batch("trades", plain).messages() == encode_batch("trades", coded).messages()


def test_added_field_with_default_is_a_compatible_evolution() -> None:
    """The rule of docs/feeds.md: append fields with defaults; old records resolve to the new schema
    (the default fills in) and old readers still read new records (they skip the new field)."""
    v1 = avro.load_schema("trades")
    v2 = json.loads(json.dumps(v1))
    v2["fields"].append({"name": "conditions", "type": "string", "default": ""})
    p1, p2 = fastavro.parse_schema(avro._strip_logical(v1)), fastavro.parse_schema(avro._strip_logical(v2))
    old = encode("trades", TRADE)[5:]
    assert fastavro.schemaless_reader(io.BytesIO(old), p1, p2) == {**TRADE, "conditions": ""}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, p2, {**TRADE, "conditions": "@ T"})
    assert fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), p2, p1) == TRADE


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from(["", "A", "AB", "BA", "é", "x" * 40]) | st.text(max_size=6), max_size=300),
    st.integers(0, 3000),
    st.booleans(),
)
def test_dictionary_strings_decode_to_the_same_values(picks: list[str], n_many: int, shuffle: bool) -> None:
    """``dictionary=True`` (the kernel's hash coding, grown past its first 1,024 slots by
    ``n_many`` distinct values) decodes to the plain columns, codes in first-seen order."""
    import pyarrow as pa

    syms = picks + [f"S{i}" for i in range(n_many)] + picks
    n = len(syms)
    cols = {k: [v] * n for k, v in TRADE.items()}
    cols["symbol"] = syms
    cols["exchange"] = syms[::-1]
    msgs = pa.array(encode_batch("trades", cols).messages(), pa.binary())
    order = np.random.default_rng(n).permutation(n) if shuffle else None
    plain, ok_p = decode_batch("trades", msgs, order)
    coded, ok_c = decode_batch("trades", msgs, order, dictionary=True)
    assert ok_p.all() and ok_c.all()
    for f in ("symbol", "exchange", "side"):
        col = coded.column(f)
        assert pa.types.is_dictionary(col.type)
        assert col.to_pylist() == plain.column(f).to_pylist()
        assert col.dictionary.to_pylist() == list(dict.fromkeys(plain.column(f).to_pylist()))
    want = np.asarray(syms, object) if order is None else np.asarray(syms, object)[order]
    assert coded.column("symbol").to_pylist() == want.tolist()
