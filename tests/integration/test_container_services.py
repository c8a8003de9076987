"""The container fixtures give real, working services (tests/conftest.py)."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.integration


def test_pg_url_is_a_real_postgresql(pg_url: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(pg_url)
    try:
        with engine.begin() as conn:
            version = conn.execute(sa.text("show server_version")).scalar_one()
            conn.execute(sa.text("create temporary table t (x int)"))
            conn.execute(sa.text("insert into t values (1), (2), (3)"))
            total = conn.execute(sa.text("select sum(x) from t")).scalar_one()
    finally:
        engine.dispose()
    assert version.startswith("15.")
    assert total == 6


def test_kafka_bootstrap_round_trips_a_record(kafka_bootstrap: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    from tidewatch.settings import get_settings

    s = get_settings()
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert {s.topic_trades, s.topic_subscriptions, s.topic_dead_letter} <= set(topics)

    topic = f"roundtrip-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=b"k", value=b"hello")
    assert producer.flush(15) == 0

    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": topic, "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe([topic])
        msg = None
        for _ in range(60):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None
        assert (msg.key(), msg.value()) == (b"k", b"hello")
    finally:
        consumer.close()
