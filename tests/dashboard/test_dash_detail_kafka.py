"""Key detail reads one key's recent events from a real Kafka (the ``kafka_bootstrap`` fixture)."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient

from dashboard.detail import aggregate_series, lookup_times, preview_keys, recent_events
from subscriptions.compiler import compile_rule
from tests.dashboard.support import produce_trades
from tidewatch.kafka.topics import create_topics, stream_topic_spec
from tidewatch.settings import Settings, get_settings

pytestmark = pytest.mark.integration


def test_recent_events_of_one_key_from_kafka(kafka_bootstrap: str) -> None:
    topic = f"dash-trades-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    create_topics(admin, [stream_topic_spec(topic, 2)])
    now = int(time.time() * 1000)
    symbols = ["AAPL", "MSFT", "AAPL", "IBM", "AAPL"]
    ts = np.array([now - 4000, now - 3000, now - 2000, now - 1000, now - 500], np.int64)
    produce_trades(kafka_bootstrap, topic, symbols, ts.tolist(), [600, 1, 300, 5, 200])
    settings = Settings(kafka_bootstrap=kafka_bootstrap, topic_trades=topic)
    cols, truncated = recent_events("trades", "symbol", "AAPL", 60_000, settings)
    assert not truncated
    assert sorted(cols["ts"].tolist()) == [now - 4000, now - 2000, now - 500]
    assert set(cols["symbol"]) == {"AAPL"}
    plan = compile_rule(
        "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 10 SECONDS > 1000",
        get_settings(),
    )
    (tau,) = lookup_times(now, now, 1)
    assert aggregate_series("trades", cols, plan.aggs[0], np.array([tau])).tolist() == [1100.0]
    # the Subscribe page's preview: every key's events, the evaluator at the last pane
    every, _ = recent_events("trades", "symbol", None, 60_000, settings)
    assert sorted(set(every["symbol"])) == ["AAPL", "IBM", "MSFT"]
    wide = compile_rule(
        "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 10 SECONDS > 800",
        get_settings(),
    )
    assert preview_keys(wide, every, 1000, get_settings().ci_p)[0] == ["AAPL"]
    # a key nobody traded: nothing
    assert recent_events("trades", "symbol", "NOPE", 60_000, settings)[0] == {}
