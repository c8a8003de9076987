"""Feeds through a real Kafka broker (fixture ``kafka_bootstrap``): what is produced is consumed back identically."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer
from typer.testing import CliRunner

from ingest.packets_gen import PacketConfig, PacketGenerator, demo_attacks
from ingest.producer import KafkaFeed, ensure_topic
from ingest.trades_gen import TradeConfig, TradeGenerator, demo_episodes
from tidewatch.settings import get_settings
from tidewatch.wire.avro import decode_batch, field_names
from tidewatch.wire.csv_io import columns_to_frame, write_csv

pytestmark = pytest.mark.integration


def _consume(bootstrap: str, topic: str, expect: int, timeout: float = 60.0) -> list[Any]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    out: list[Any] = []
    import time

    deadline = time.monotonic() + timeout
    while len(out) < expect and time.monotonic() < deadline:
        for m in c.consume(10_000, timeout=1.0):
            assert m.error() is None, m.error()
            out.append(m)
    # nothing more than expected arrives
    out += [m for m in c.consume(10_000, timeout=2.0) if m.error() is None]
    c.close()
    return out


def _source_frame(chunks: list[dict], stream: str) -> Any:
    import pandas as pd

    return pd.concat([columns_to_frame(c, stream) for c in chunks], ignore_index=True).astype(
        {
            f: object
            for f in field_names(stream)
            if f in ("symbol", "side", "exchange", "src_ip", "dst_ip", "protocol", "tcp_flags")
        }
    )


@pytest.mark.parametrize("stream", ["trades", "packets"])
def test_round_trip_through_kafka_is_identical(kafka_bootstrap: str, stream: str) -> None:
    topic = f"it-{stream}-{uuid.uuid4().hex[:8]}"
    ensure_topic(get_settings(), kafka_bootstrap, topic, 2)
    if stream == "trades":
        gen: Any = TradeGenerator(TradeConfig(rate=20_000, n_symbols=500), seed=1)
        gen.episodes = demo_episodes(gen, 2_000, every_ms=2_000, count=2, duration_ms=4_000)
    else:
        gen = PacketGenerator(
            PacketConfig(rate=10_000), seed=1, attacks=demo_attacks(1_000, every_ms=1_000, count=3)
        )
    chunks = list(gen.chunks(1_700_000_000_000, 1_700_000_005_000, 1000))
    feed = KafkaFeed(stream, settings=get_settings(), topic=topic, bootstrap=kafka_bootstrap)
    for c in chunks:
        feed.send(c)
    st = feed.close(timeout=60)
    src = _source_frame(chunks, stream)
    assert st.produced == len(src) and st.failed == 0 and st.unconfirmed == 0

    msgs = _consume(kafka_bootstrap, topic, len(src))
    assert len(msgs) == len(src)
    batch, ok = decode_batch(stream, pa.array([m.value() for m in msgs], pa.binary()))
    assert ok.all()
    got = batch.to_pandas()
    key = feed.key_field
    assert [m.key().decode() for m in msgs] == got[key].tolist()
    # same events (as a multiset) ...
    cols = field_names(stream)
    a = src.sort_values(cols, kind="stable").reset_index(drop=True)
    b = got[cols].sort_values(cols, kind="stable").reset_index(drop=True)
    import pandas as pd

    pd.testing.assert_frame_equal(a, b, check_dtype=False)
    # ... and each key's events in the order they were produced (one key -> one partition)
    src["_i"] = np.arange(len(src))
    got["_p"] = [m.partition() for m in msgs]
    got["_o"] = [m.offset() for m in msgs]
    for k, g in got.sort_values(["_p", "_o"]).groupby(key, sort=False):
        assert g["_p"].nunique() == 1
        s = src[src[key] == k]
        np.testing.assert_array_equal(g["ts"].to_numpy(), s["ts"].to_numpy())


def test_cli_feeds_a_csv_file_and_skips_bad_lines(kafka_bootstrap: str, tmp_path: Path) -> None:
    from tidewatch.cli import app

    gen = TradeGenerator(TradeConfig(rate=2000, n_symbols=100), seed=2)
    f = tmp_path / "t.csv"
    n = write_csv(f, gen.chunks(0, 3000, 1000), "trades")
    lines = f.read_text().splitlines()
    lines.insert(5, "BROKEN,line")
    lines.insert(9, "AAPL,notatime,1,1,BID,NASDAQ")
    f.write_text("\n".join(lines) + "\n")
    topic = f"it-csv-{uuid.uuid4().hex[:8]}"
    res = CliRunner().invoke(
        app,
        [
            "feed",
            "trades",
            "--csv",
            str(f),
            "--bootstrap",
            kafka_bootstrap,
            "--topic",
            topic,
            "--no-progress",
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    assert "line 6:" in res.output and "line 10:" in res.output
    msgs = _consume(kafka_bootstrap, topic, n)
    assert len(msgs) == n


def test_cli_feeds_a_pcap(kafka_bootstrap: str, tmp_path: Path) -> None:
    import socket

    import dpkt

    from tidewatch.cli import app

    f = tmp_path / "c.pcap"
    with open(f, "wb") as fh:
        w = dpkt.pcap.Writer(fh)
        for i in range(200):
            tcp = dpkt.tcp.TCP(sport=40000 + i, dport=443, flags=dpkt.tcp.TH_SYN)
            ip = dpkt.ip.IP(
                src=socket.inet_aton(f"10.0.0.{i % 50 + 1}"), dst=socket.inet_aton("10.0.1.1"), p=6, data=tcp
            )
            ip.len = 40
            w.writepkt(
                bytes(dpkt.ethernet.Ethernet(type=dpkt.ethernet.ETH_TYPE_IP, data=ip)), ts=1000.0 + i / 100
            )
    topic = f"it-pcap-{uuid.uuid4().hex[:8]}"
    res = CliRunner().invoke(
        app,
        [
            "feed",
            "packets",
            "--pcap",
            str(f),
            "--bootstrap",
            kafka_bootstrap,
            "--topic",
            topic,
            "--no-progress",
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    msgs = _consume(kafka_bootstrap, topic, 200)
    batch, ok = decode_batch("packets", [m.value() for m in msgs])
    assert ok.all() and batch.num_rows == 200
    assert set(batch.column("tcp_flags").to_pylist()) == {"S"}
    assert sorted(batch.column("src_port").to_pylist()) == list(range(40000, 40200))


def test_newest_event_ms_reads_past_the_commit_markers_of_a_transactional_writer(
    kafka_bootstrap: str,
) -> None:
    """On a topic written in transactions the last offset of a partition is a commit marker,
    not a record: the newest event time is still found (and an aborted record is not counted)."""
    from confluent_kafka import Producer

    from ingest.producer import newest_event_ms
    from tidewatch.wire.avro import encode_batch

    topic = f"it-newest-tx-{uuid.uuid4().hex[:8]}"
    ensure_topic(get_settings(), kafka_bootstrap, topic, 1)
    chunk = next(
        TradeGenerator(TradeConfig(rate=2_000, n_symbols=5), seed=4).chunks(
            1_700_000_000_000, 1_700_000_001_000, 1000
        )
    )
    records = encode_batch("trades", chunk).messages()[:5]
    ts = [int(t) for t in np.asarray(chunk["ts"])[:5]]
    assert ts[4] > max(ts[:4])  # the aborted record is the newest: counting it would show
    p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"it-{topic}", "log_level": 0})
    p.init_transactions(30)
    for rec in records[:4]:  # a transaction per record: record, marker, record, marker, ...
        p.begin_transaction()
        p.produce(topic, rec, partition=0)
        p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, records[4], partition=0)
    p.abort_transaction(30)
    assert newest_event_ms(get_settings(), kafka_bootstrap, topic, "trades") == max(ts[:4])


def test_a_restarted_demo_feed_backfills_only_what_the_topic_lacks(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tidewatch down`` / ``up`` restarts the demo feed: its 31 min of history would all be
    older than what the engine has seen (every event a dead letter), so the backfill starts
    after the newest event already in the topic."""
    from ingest import feed as ingest_feed
    from ingest.producer import newest_event_ms

    monkeypatch.setenv("TIDEWATCH_KAFKA_BOOTSTRAP", kafka_bootstrap)
    topic = f"it-newest-{uuid.uuid4().hex[:8]}"
    assert (
        newest_event_ms(get_settings(), kafka_bootstrap, topic, "trades", timeout=5) is None
    )  # no such topic
    ensure_topic(get_settings(), kafka_bootstrap, topic, 3)
    assert newest_event_ms(get_settings(), kafka_bootstrap, topic, "trades", timeout=5) is None  # empty
    gen = TradeGenerator(TradeConfig(rate=2_000, n_symbols=50), seed=3)
    chunks = list(gen.chunks(1_700_000_000_000, 1_700_000_010_000, 1000))
    feed = KafkaFeed("trades", settings=get_settings(), topic=topic, bootstrap=kafka_bootstrap)
    for c in chunks:
        feed.send(c)
    assert feed.close(timeout=60).failed == 0
    newest = max(int(np.max(c["ts"])) for c in chunks)
    assert newest_event_ms(get_settings(), kafka_bootstrap, topic, "trades") == newest
    # history that reaches back past it is cut at it; history that ends before it is kept
    start = newest + 60_000
    assert (
        ingest_feed._history_not_in_topic(
            get_settings(), "trades", start, 31 * 60_000, topic, kafka_bootstrap
        )
        == start - newest - 1
    )
    assert ingest_feed._history_not_in_topic(
        get_settings(), "trades", newest + 120 * 60_000, 31 * 60_000, topic, kafka_bootstrap
    ) == (31 * 60_000)
