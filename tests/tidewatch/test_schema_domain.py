"""tidewatch.schema's field domains: the producers of events stay inside them, and the two CSV
readers (the feeds' and the backtest's) check them as the engine does, with the same words."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from engine.evaluation.backtest import load_events
from ingest.packets_gen import PacketConfig, PacketGenerator
from ingest.pcap import _FLAGS, _PROTO_NAMES
from ingest.trades_gen import TradeConfig, TradeGenerator
from tidewatch.schema import PACKETS, PROTOCOLS, STREAMS, TCP_FLAGS, TRADES, valid, valid_strings, violation
from tidewatch.wire.avro import Coded
from tidewatch.wire.csv_io import CsvReport, read_csv_chunks


def _violations(stream: str, cols: dict[str, object]) -> dict[str, int]:
    out = {}
    for name, f in STREAMS[stream].fields.items():
        c = cols[name]
        if isinstance(c, Coded):
            ok = valid_strings(f, list(c.values))[c.codes]
        elif f.numeric:
            ok = valid(f, np.asarray(c))
        else:
            ok = valid_strings(f, np.asarray(c, dtype=object))
        out[name] = int((~ok).sum())
    return out


def test_the_generators_and_the_capture_reader_produce_only_values_of_the_domains() -> None:
    assert list(TCP_FLAGS) == _FLAGS  # the capture reader's flag letters are the domain
    assert set(_PROTO_NAMES) <= set(PROTOCOLS)
    t0 = 1_767_225_600_000
    trades = TradeGenerator(TradeConfig(rate=5000, n_symbols=300), seed=3).chunk(t0, t0 + 20_000)
    packets = PacketGenerator(PacketConfig(rate=5000), seed=3).chunk(t0, t0 + 20_000)
    assert len(trades["ts"]) > 10_000 and len(packets["ts"]) > 10_000
    assert set(_violations("trades", trades).values()) == {0}
    assert set(_violations("packets", packets).values()) == {0}


def test_numbers_are_checked_exactly_at_the_edges() -> None:
    price, port = TRADES.fields["price"], PACKETS.fields["dst_port"]
    assert valid(price, np.array([-1.0, 0.0, 5e-324, 2.0**53, 2.0**53 * 2, np.nan, np.inf])).tolist() == [
        False,
        False,
        True,
        True,
        False,
        False,
        False,
    ]
    assert valid(port, np.array([-1, 0, 65535, 65536])).tolist() == [False, True, True, False]
    assert violation(price, -1e12) == "price -1e+12 is not > 0"
    assert violation(port, np.int64(70000)) == "dst_port 70000 is not <= 65535"


TRADES_CSV = b"""symbol,ts,price,size,side,exchange
AAPL,1000,-1e12,5,BID,NASDAQ
AAPL,1001,10.5,5,SIDEWAYS,NASDAQ
AAPL,1002,10.5,5,BID,
AAPL,1003,10.5,5,BID,NASDAQ
"""
PACKETS_CSV = b"""ts,src_ip,dst_ip,src_port,dst_port,protocol,length,tcp_flags
1,10.0.0.1,10.0.0.2,1234,53,icmpv6,80,
2,10.0.0.1,10.0.0.2,1234,443,TCP,70000,S
3,10.0.0.1,10.0.0.2,1234,443,TCP,60,AS
4,10.0.0.1,10.0.0.2,1234,443,tcp,60,sa
5,10.0.0.1,10.0.0.2,1234,443,GRE,60,
"""
WANT_TRADES = [
    (2, "price -1e+12 is not > 0"),
    (3, "side 'SIDEWAYS' is not one of BID, ASK, UNKNOWN"),
    (4, "exchange is empty (it must not be)"),
]


def test_both_csv_readers_report_a_value_outside_its_domain_in_the_engines_words(tmp_path: Path) -> None:
    rep = CsvReport("t.csv")
    chunks = list(read_csv_chunks(io.BytesIO(TRADES_CSV), "trades", report=rep))
    assert [(b.line, b.reason) for b in rep.bad_lines] == WANT_TRADES
    assert [int(t) for c in chunks for t in c["ts"]] == [1003]
    p = tmp_path / "t.csv"
    p.write_bytes(TRADES_CSV)
    ev = load_events("trades", p)
    assert ev.malformed == WANT_TRADES and ev.cols["ts"].tolist() == [1003]


def test_the_feed_reader_matches_a_closed_set_ignoring_case_and_stores_its_spelling() -> None:
    rep = CsvReport("p.csv")
    chunks = list(read_csv_chunks(io.BytesIO(PACKETS_CSV), "packets", report=rep))
    assert [b.line for b in rep.bad_lines] == [3, 4, 6]
    assert rep.bad_lines[0].reason == "length 70000 is not <= 65575"
    assert rep.bad_lines[1].reason.startswith("tcp_flags 'AS' is not TCP flag letters")
    assert rep.bad_lines[2].reason.startswith("protocol 'GRE' is not one of")
    (ch,) = chunks
    assert ch["protocol"].to_numpy().tolist() == ["ICMPv6", "TCP"]
    assert ch["tcp_flags"].to_numpy().tolist() == ["", "SA"]


def test_the_avro_schemas_document_the_domains_of_tidewatch_schema() -> None:
    """The .avsc files state each field's domain in its doc, as tidewatch/schema.py words it
    (the domain is written once, there; this keeps the schema files' docs from drifting)."""
    from tidewatch.wire.avro import load_schema

    for stream, spec in STREAMS.items():
        docs = {f["name"]: f.get("doc", "") for f in load_schema(stream)["fields"]}
        assert set(docs) == set(spec.fields)
        for name, f in spec.fields.items():
            assert docs[name].endswith(f"domain (tidewatch/schema.py): {f.domain}"), (stream, name)
