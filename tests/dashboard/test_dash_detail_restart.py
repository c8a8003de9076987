"""The dashboard's live Kafka reads (key detail, the Subscribe page's preview) through a broker
restart: while the broker is down a read raises :class:`dashboard.detail.KafkaUnavailable`
with a message for the page, promptly; the first read after the broker is back works again.

Uses the ``restartable_kafka`` fixture (an embedded broker stopped by PID and started on the same
port and data); ``TIDEWATCH_TEST_FAULT_DOWN_S`` sets how long it stays down (default 4 s).
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient

from dashboard.detail import KafkaUnavailable, preview_keys, recent_events
from subscriptions.compiler import compile_rule
from tests.dashboard.support import produce_trades
from tidewatch.kafka.topics import create_topics, stream_topic_spec
from tidewatch.settings import Settings, get_settings
from tidewatch.stack import kafka_broker as kafka

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DOWN_S = float(os.environ.get("TIDEWATCH_TEST_FAULT_DOWN_S", "4"))


def test_key_detail_reads_again_after_a_kafka_broker_restart(restartable_kafka: Settings) -> None:
    t0 = time.monotonic()
    bootstrap = restartable_kafka.kafka_bootstrap
    assert bootstrap is not None
    topic = f"dash-trades-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, [stream_topic_spec(topic, 2)])
    del admin
    now = int(time.time() * 1000)
    produce_trades(
        bootstrap, topic, ["AAPL", "MSFT", "AAPL"], [now - 3000, now - 2000, now - 1000], [600, 1, 300]
    )
    settings = Settings(kafka_bootstrap=bootstrap, topic_trades=topic, kafka_security="plaintext")

    def aapl() -> list[int]:
        cols, truncated = recent_events("trades", "symbol", "AAPL", 600_000, settings, timeout_s=8)
        assert not truncated
        return sorted(cols["ts"].tolist())

    assert aapl() == [now - 3000, now - 1000]
    t_fault = time.monotonic()
    kafka.stop(restartable_kafka)
    reads_down = []
    for key in ("AAPL", None):  # the key-detail chart, the preview
        t = time.monotonic()
        with pytest.raises(KafkaUnavailable) as err:
            recent_events("trades", "symbol", key, 600_000, settings, timeout_s=8)
        reads_down.append(time.monotonic() - t)
        message = str(err.value)
        assert bootstrap in message and "does not answer" in message and "Try again" in message
    assert max(reads_down) < 10, reads_down  # a message, not a hang
    time.sleep(max(0.0, DOWN_S - (time.monotonic() - t_fault)))
    kafka.start(restartable_kafka)
    outage = time.monotonic() - t_fault
    # the first read after the restart works and sees what was there before
    t = time.monotonic()
    assert aapl() == [now - 3000, now - 1000]
    first_read = time.monotonic() - t
    later = int(time.time() * 1000)
    produce_trades(bootstrap, topic, ["AAPL"], [later], [200])
    assert aapl() == [now - 3000, now - 1000, later]
    every, _ = recent_events("trades", "symbol", None, 600_000, settings, timeout_s=8)
    wide = compile_rule(
        "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 60 SECONDS > 800",
        get_settings(),
    )
    assert preview_keys(wide, every, 1000, get_settings().ci_p)[0] == ["AAPL"]
    print(
        f"\nreads while down failed in {', '.join(f'{s:.1f}' for s in reads_down)} s with KafkaUnavailable; "
        f"outage {outage:.1f} s; first read after the restart {first_read:.1f} s; "
        f"test {time.monotonic() - t0:.0f} s"
    )
