"""Key detail on a topic like the demo's (real Kafka, AppTest): every chart of every demo rule
has data points.

The demo feed backfills its history in a burst, so Kafka's timestamps (the time a record was
written) say nothing of the events' times: ``offsets_for_times(now - lookback)`` finds the
start of the topic, and a read capped at ``dashboard_detail_max_messages`` that kept the
OLDEST records saw only old history -- blank charts for the 20- and 30-minute rules (issue
21).  Here the topic holds two hours-old events first, then the last 40 minutes, all written
now, and the cap is below the total: the read keeps the newest records.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from sqlalchemy.orm import Session, sessionmaker

from dashboard.detail import read_recent
from dashboard.rules import DEMO_SUBSCRIPTIONS, validate
from subscriptions.service import SubscriptionService
from tests.dashboard.test_dash_apptest import logged_in
from tidewatch.kafka.topics import create_topics, stream_topic_spec
from tidewatch.settings import Settings, get_settings
from tidewatch.wire.avro import encode_batch

pytestmark = pytest.mark.integration

DEMO_RULES = DEMO_SUBSCRIPTIONS  # as seed_demo
SYMBOLS = ["AAPL", "MSFT", "IBM", "NVDA", "AMZN"]
CAP = 20_000


def _produce(bootstrap: str, topic: str, ts: np.ndarray, symbols: np.ndarray, rng: Any) -> None:
    n = len(ts)
    msgs = encode_batch(
        "trades",
        {
            "symbol": symbols.tolist(),
            "ts": ts.astype(np.int64),
            "price": np.round(100 + np.cumsum(rng.normal(0, 0.05, n)), 2),
            "size": rng.integers(1, 400, n).astype(np.int64),
            "side": rng.choice(["BID", "ASK"], n).tolist(),
            "exchange": ["NASDAQ"] * n,
        },
    ).messages()
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i, (sym, m) in enumerate(zip(symbols.tolist(), msgs, strict=True)):
        p.produce(topic, m, sym.encode())
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


@pytest.fixture
def demo_topic(kafka_bootstrap: str) -> str:
    """Old history (2 h ago, 30,000 events), then the last 40 minutes (5 symbols, one trade each
    every 0.5 s: 24,000 events), all written now."""
    topic = f"dash-demo-{uuid.uuid4().hex[:8]}"
    create_topics(AdminClient({"bootstrap.servers": kafka_bootstrap}), [stream_topic_spec(topic, 2)])
    rng = np.random.default_rng(21)
    now = int(time.time() * 1000)
    old = now - 2 * 3600_000 + np.arange(30_000, dtype=np.int64) * 100
    _produce(kafka_bootstrap, topic, old, rng.choice(SYMBOLS, len(old)), rng)
    step = np.arange(now - 40 * 60_000, now, 500, dtype=np.int64)
    recent = np.repeat(step, len(SYMBOLS))
    _produce(kafka_bootstrap, topic, recent, np.tile(np.array(SYMBOLS), len(step)), rng)
    return topic


def test_the_read_keeps_the_newest_records_and_says_from_when_it_is_whole(
    kafka_bootstrap: str, demo_topic: str
) -> None:
    s = Settings(kafka_bootstrap=kafka_bootstrap, topic_trades=demo_topic, dashboard_detail_max_messages=CAP)
    got = read_recent("trades", "symbol", "AAPL", 40 * 60_000, s)
    now = int(time.time() * 1000)
    assert got.truncated and got.complete_from_ms is not None
    ts = np.sort(got.cols["ts"])
    # the newest CAP records of 54,000: the last ~33 minutes, nothing of the old history
    assert ts[-1] >= now - 60_000 and ts[0] > now - 40 * 60_000
    assert CAP // len(SYMBOLS) - 50 <= len(ts) <= CAP // len(SYMBOLS) + 50
    # complete from the newest of the partitions' first records read: at or after the oldest event
    assert 0 <= got.complete_from_ms - ts[0] < 30_000


def _chart_frames(at: Any) -> list[tuple[str, pd.DataFrame]]:
    """(title, main dataset) of every aggregate chart on the page (the layered ones)."""
    out = []
    for c in at.get("vega_lite_chart"):
        spec = json.loads(c.proto.spec)
        if "layer" not in spec:
            continue
        data = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in c.proto.datasets]
        series = next(d for d in data if "value" in d.columns)
        out.append((" ".join(spec["title"]["text"]), series))
    return out


def test_every_chart_of_every_demo_rule_has_data_points(
    app_env: str,
    sm: sessionmaker[Session],
    new_user: Any,
    kafka_bootstrap: str,
    demo_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIDEWATCH_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("TIDEWATCH_TOPIC_TRADES", demo_topic)
    monkeypatch.setenv("TIDEWATCH_DASHBOARD_DETAIL_MAX_MESSAGES", str(CAP))
    get_settings.cache_clear()
    name = new_user("demo")
    svc = SubscriptionService(sm, settings=get_settings())
    for rule_name, text in DEMO_RULES.items():
        svc.create(name, text, name=rule_name)
    at = logged_in(sm, name, "Key detail")
    at.text_input(key="detail_key").input("AAPL").run()
    at.toggle(key="detail_stream").set_value(True).run()
    assert not at.exception
    plans = [validate(text, get_settings()).plan for text in DEMO_RULES.values()]
    expected = [a.text for plan in plans if plan is not None for a in plan.aggs]
    assert len(plans) == len(DEMO_RULES) >= 3 and None not in plans
    got = _chart_frames(at)
    assert sorted(t for t, _ in got) == sorted(expected)  # one chart per aggregate of each rule
    for title, df in got:
        assert len(df) > 0 and df["value"].notna().sum() > 0, title
        # the value is not flat zero (the "0.000000" axis of a chart over no events)
        assert (df["value"].fillna(0) != 0).any(), title
    # a capped read: the page says so, and the points whose window reaches back before the
    # complete part are marked
    assert any("read newest first" in c.value for c in at.caption)
    assert any((df["window"] == "partial").any() for _, df in got)
    assert any((df["window"] == "whole").any() for _, df in got)
