"""ingest.producer and the feed CLI against a fake producer: accounting, retries, pacing, Ctrl-C."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import ingest.producer as producer_mod
from ingest.producer import KafkaFeed, Pacer
from ingest.trades_gen import TradeConfig, TradeGenerator
from tidewatch.settings import get_settings
from tidewatch.wire.avro import decode


class FakeProducer:
    """Records what is produced; can refuse (BufferError), fail deliveries, or never confirm."""

    instances: list[FakeProducer] = []

    def __init__(
        self,
        conf: dict[str, Any] | None = None,
        *,
        buffer_error_every: int = 0,
        fail_every: int = 0,
        never_confirm: bool = False,
        interrupt_after: int = 0,
    ) -> None:
        self.conf = conf or {}
        self.on_delivery = self.conf.get("on_delivery")
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.calls = 0
        self.buffer_error_every = buffer_error_every
        self.fail_every = fail_every
        self.never_confirm = never_confirm
        self.interrupt_after = interrupt_after
        self.queued = 0
        FakeProducer.instances.append(self)

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> None:
        self.calls += 1
        if self.buffer_error_every and self.calls % self.buffer_error_every == 0:
            raise BufferError("queue full")
        if self.interrupt_after and len(self.sent) == self.interrupt_after:
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C
        self.sent.append((topic, value or b"", key or b""))
        self.queued += 1
        if self.fail_every and len(self.sent) % self.fail_every == 0 and self.on_delivery:
            self.on_delivery("MSG_TIMED_OUT", None)

    def poll(self, timeout: float = 0) -> int:
        if not self.never_confirm:
            self.queued = 0
        return 0

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        if self.never_confirm:
            time.sleep(min(timeout, 0.05))
        return self.queued

    def __len__(self) -> int:
        return self.queued


def _trades(n_ms: int = 2000, rate: float = 2000) -> list[dict]:
    g = TradeGenerator(TradeConfig(rate=rate, n_symbols=200, intraday=False), seed=1)
    return list(g.chunks(1_000_000, 1_000_000 + n_ms, 500))


def test_every_event_is_produced_once_in_order_keyed_by_symbol() -> None:
    fake = FakeProducer(buffer_error_every=97)
    feed = KafkaFeed("trades", settings=get_settings(), topic="t", producer=fake, poll_every=50)
    chunks = _trades()
    for c in chunks:
        feed.send(c)
    st = feed.close()
    rows = [r for c in chunks for r in zip(c["symbol"].to_numpy(), c["ts"], strict=True)]
    assert st.produced == len(rows) == len(fake.sent)
    got = [(decode(v)["symbol"], decode(v)["ts"]) for _, v, _ in fake.sent]
    assert got == [(s, int(t)) for s, t in rows]
    assert all(k.decode() == decode(v)["symbol"] for _, v, k in fake.sent)
    assert st.failed == 0 and st.unconfirmed == 0


def test_packets_are_keyed_by_the_configured_field() -> None:
    from ingest.packets_gen import PacketConfig, PacketGenerator

    fake = FakeProducer()
    feed = KafkaFeed("packets", settings=get_settings(), topic="p", producer=fake)
    feed.send(PacketGenerator(PacketConfig(rate=500), seed=1).chunk(0, 2000))
    assert feed.key_field == "src_ip"
    assert all(k.decode() == decode(v)["src_ip"] for _, v, k in fake.sent)


def test_failed_and_unconfirmed_deliveries_are_counted_not_lost() -> None:
    fake = FakeProducer(fail_every=10, never_confirm=True)
    feed = KafkaFeed("trades", settings=get_settings(), topic="t", producer=fake)
    fake.on_delivery = feed._on_error
    n = sum(feed.send(c) for c in _trades(1000))
    st = feed.close(timeout=0.2)
    assert st.failed == n // 10
    assert st.unconfirmed == n
    assert "failed" in st.summary() and f"unconfirmed {n:,}" in st.summary()


def test_rate_limit_paces_the_sends() -> None:
    fake = FakeProducer()
    feed = KafkaFeed("trades", settings=get_settings(), topic="t", producer=fake, poll_every=20)
    chunk = _trades(1000, rate=600)[0] | {}
    n = len(chunk["ts"])
    t0 = time.monotonic()
    feed.send(chunk, Pacer(rate=1000))
    took = time.monotonic() - t0
    assert took == pytest.approx((n - 1) / 1000, abs=0.12)


def test_recorded_pace_with_speed_factor() -> None:
    ts = np.array([0, 0, 400, 800, 1200, 1600, 2000], np.int64)
    p = Pacer(speed=4.0)
    t = p.targets(ts)
    assert t is not None
    np.testing.assert_allclose(t - p.wall0, ts / 4000.0)
    assert Pacer().targets(ts) is None
    both = Pacer(speed=1.0, rate=2.0).targets(np.array([0, 0, 0], np.int64))
    assert both is not None and np.allclose(np.diff(both), 0.5)


def test_a_wall_clock_pacer_does_not_trail_the_clock_by_a_delay_before_it() -> None:
    """The demo's live stream after a backfill that took 10 s: events whose time passed are due
    at once, a future one when the clock reaches it -- not 10 s later (issue 21: the lag)."""
    now_ms = int(time.time() * 1000)
    start = now_ms - 10_000  # the feed started 10 s ago; the backfill ran since
    p = Pacer(speed=1.0, anchor_ts=start, wall_clock=True)
    t = p.targets(np.array([start, now_ms - 1, now_ms + 2_000], np.int64))
    assert t is not None
    m = time.monotonic()
    assert t[0] <= m and t[1] <= m + 0.05  # already due
    assert t[2] - m == pytest.approx(2.0, abs=0.1)  # due with the clock
    late = Pacer(speed=1.0, anchor_ts=start).targets(np.array([now_ms + 2_000], np.int64))
    assert late is not None and late[0] - m == pytest.approx(12.0, abs=0.1)  # the old way: 10 s behind
    with pytest.raises(ValueError):
        Pacer(speed=1.0, wall_clock=True)


# --------------------------------------------------------------------------- CLI
@pytest.fixture()
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> type[FakeProducer]:
    import confluent_kafka

    FakeProducer.instances = []
    monkeypatch.setattr(confluent_kafka, "Producer", FakeProducer)
    monkeypatch.setattr(producer_mod, "ensure_topic", lambda *a, **k: False)
    return FakeProducer


def _cli(args: list[str]) -> Any:
    from tidewatch.cli import app

    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_feed_csv_reports_bad_lines_and_sends_only_good_ones(
    tmp_path: Path, fake_kafka: type[FakeProducer]
) -> None:
    f = tmp_path / "t.csv"
    f.write_text(
        "symbol,ts,price,size,side,exchange\nAAPL,1,10,5,BID,NASDAQ\nAAPL,x,10,5,BID,NASDAQ\n"
        "MSFT,3,10,5,ASK,NYSE,extra\nMSFT,4,11,6,ASK,NYSE\n"
    )
    res = _cli(["feed", "trades", "--csv", str(f), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "line 3: ts" in res.output and "line 4: expected 6 fields" in res.output
    assert "produced 2" in res.output and "bad input lines 2" in res.output
    sent = fake_kafka.instances[-1].sent
    assert [decode(v)["ts"] for _, v, _ in sent] == [1, 4]


def test_feed_ctrl_c_flushes_and_prints_the_final_count(
    tmp_path: Path, fake_kafka: type[FakeProducer], monkeypatch: pytest.MonkeyPatch
) -> None:
    orig = FakeProducer.__init__

    def init(self: FakeProducer, conf: dict | None = None) -> None:
        orig(self, conf, interrupt_after=1234)

    monkeypatch.setattr(FakeProducer, "__init__", init)
    res = _cli(
        ["feed", "trades", "--synthetic", "--asap", "--duration", "60s", "--gen-rate", "500", "--no-progress"]
    )
    assert res.exit_code == 130
    n = len(fake_kafka.instances[-1].sent)
    assert 1234 < n < 1234 + 2000 + 1  # stops within one slice of the Ctrl-C
    assert (
        "interrupted" in res.output
        and f"produced {n:,}, delivered {n:,}, failed 0, unconfirmed 0" in res.output
    )


def test_export_is_reproducible_and_backtest_ready(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for out in (a, b):
        res = _cli(
            ["export", "trades", "--out", str(out), "--duration", "90s", "--gen-rate", "300", "--seed", "3"]
        )
        assert res.exit_code == 0, res.output
    assert a.read_bytes() == b.read_bytes()
    lines = a.read_text().splitlines()
    assert lines[0] == "symbol,ts,price,size,side,exchange" and 20_000 < len(lines) < 35_000
    p = tmp_path / "p.csv"
    res = _cli(["export", "packets", "--out", str(p), "--duration", "30s", "--first-episode", "5s"])
    assert res.exit_code == 0, res.output
    assert p.read_text().splitlines()[0] == "ts,src_ip,dst_ip,src_port,dst_port,protocol,length,tcp_flags"


def test_duration_and_time_parsing() -> None:
    import typer

    from ingest.cli import parse_duration_ms, parse_time_ms

    assert parse_duration_ms("90s") == 90_000
    assert parse_duration_ms("1.5h") == 5_400_000
    assert parse_duration_ms("250ms") == 250
    assert parse_duration_ms("2") == 2000
    assert parse_duration_ms("5m") == parse_duration_ms("5min") == 300_000
    assert parse_time_ms("1709564400000") == 1_709_564_400_000
    assert parse_time_ms("2024-03-04T15:00:00Z") == 1_709_564_400_000
    assert parse_time_ms("2024-03-04T10:00:00-05:00") == 1_709_564_400_000
    assert abs(parse_time_ms("now") - time.time() * 1000) < 5000
    for bad in ("soon", "5 parsecs"):
        with pytest.raises(typer.BadParameter):
            parse_duration_ms(bad) if "parsec" in bad else parse_time_ms(bad)
