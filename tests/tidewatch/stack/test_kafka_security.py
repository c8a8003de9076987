"""Kafka SASL/SCRAM and ACLs on the embedded broker (opt-in ``TIDEWATCH_KAFKA_SECURITY=scram``).

Starts the embedded broker (:mod:`tidewatch.stack.kafka_broker`) in the SCRAM mode on free ports,
creates the topics as ``admin``, the principals and their ACLs with
:func:`~tidewatch.kafka.client.ensure_principals`, then tries, with real librdkafka clients,
each allowed and each forbidden action of the issue: feeds may only write their stream topics,
the engine reads those and writes alerts / results / dead-letter, the dashboard reads alerts /
results; a client without credentials or with a wrong password gets nothing.

The broker is started the way ``tidewatch up`` starts it (fixture ``scram_stack``); the app's own
clients in this mode are tested in test_kafka_scram_app.py.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tidewatch.kafka import client as kafka_client
from tidewatch.settings import Settings
from tidewatch.stack import kafka_broker as kafka

pytestmark = pytest.mark.integration

PRINCIPALS = ("feed", "engine", "dashboard", "relay")
DENIED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


@pytest.fixture()
def secure_kafka(scram_stack: Settings) -> Settings:
    """The stack's services in the scram mode (tests/tidewatch/conftest.py)."""
    return scram_stack


def _produce(s: Settings, principal: str, topic: str, transactional_id: str | None = None) -> int | None:
    """Produce one record as ``principal``; None when delivered, else the error code."""
    conf = {
        "bootstrap.servers": s.kafka_bootstrap,
        "message.timeout.ms": 10_000,
        "log_level": 0,
        **kafka_client.client_config(s, principal),
    }
    if transactional_id:
        conf["transactional.id"] = transactional_id
    p = Producer(conf)
    if transactional_id:
        try:
            p.init_transactions(15)
            p.begin_transaction()
        except KafkaException as exc:
            return int(exc.args[0].code())
    result: list[int | None] = []
    p.produce(
        topic,
        key=b"k",
        value=f"{principal}-{uuid.uuid4().hex}".encode(),
        on_delivery=lambda err, msg: result.append(None if err is None else err.code()),
    )
    p.flush(20)
    if transactional_id and result == [None]:
        p.commit_transaction(15)
    assert len(result) == 1, f"no delivery report for {principal} -> {topic}"
    return result[0]


def _consume(s: Settings, principal: str, topic: str) -> int | None:
    """Read ``topic`` from the beginning as ``principal`` (assigned, no group membership): None when
    a record arrives, else the error code."""
    c = Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            # the principal's own group prefix (kafka_client.ID_PREFIX): groups are authorized too
            "group.id": f"{kafka_client.ID_PREFIX.get(principal, 'tidewatch-' + principal)}-test-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "log_level": 0,
            **kafka_client.client_config(s, principal),
        }
    )
    try:
        tmd = c.list_topics(topic, timeout=10).topics[topic]
        if tmd.error is not None:  # DESCRIBE is checked here
            return int(tmd.error.code())
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in tmd.partitions])
        for _ in range(30):
            msg = c.poll(0.5)
            if msg is None:
                continue
            merr = msg.error()
            if merr is None:
                return None
            if merr.code() in DENIED:
                return int(merr.code())
        return -1  # nothing at all
    finally:
        c.close()


def test_clients_without_or_with_wrong_credentials_get_nothing(secure_kafka: Settings) -> None:
    s = secure_kafka
    plain = AdminClient({"bootstrap.servers": s.kafka_bootstrap, "log_level": 0})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)
    wrong = dict(kafka_client.client_config(s, "feed"), **{"sasl.password": "not-it"})
    bad = AdminClient({"bootstrap.servers": s.kafka_bootstrap, "log_level": 0, **wrong})
    with pytest.raises(KafkaException):
        bad.list_topics(timeout=5)


def test_feed_writes_only_its_stream_topics(secure_kafka: Settings) -> None:
    s = secure_kafka
    assert _produce(s, "feed", s.topic_trades) is None
    assert _produce(s, "feed", s.topic_packets) is None
    for topic in (s.topic_alerts, s.topic_results, s.topic_dead_letter, s.topic_subscriptions):
        assert _produce(s, "feed", topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED, topic
    # reading: only its stream topics, which a resumable feed's transactional progress marker
    # needs (kafka_client.acls); nothing else
    assert _consume(s, "feed", s.topic_trades) is None
    for topic in (s.topic_alerts, s.topic_results, s.topic_subscriptions):
        assert _consume(s, "feed", topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED, topic
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap, **kafka_client.client_config(s, "feed")})
    with pytest.raises(KafkaException) as info:
        admin.create_topics([NewTopic("evil", 1, 1)])["evil"].result(15)
    assert info.value.args[0].code() in DENIED


def test_engine_reads_streams_and_writes_its_outputs(secure_kafka: Settings) -> None:
    s = secure_kafka
    assert _produce(s, "feed", s.topic_trades) is None
    assert _consume(s, "engine", s.topic_trades) is None
    for topic in (s.topic_alerts, s.topic_results, s.topic_dead_letter):
        assert _produce(s, "engine", topic) is None, topic
    assert _produce(s, "engine", s.topic_alerts, transactional_id="tidewatch-engine-test") is None
    assert _consume(s, "engine", s.topic_alerts) is None  # its progress marker (engine/sinks/publish.py)
    assert _produce(s, "engine", s.topic_alerts, transactional_id="tidewatch-outbox-relay-x") in DENIED
    assert _produce(s, "engine", s.topic_trades) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _produce(s, "engine", s.topic_subscriptions) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _produce(s, "engine", s.topic_alerts, transactional_id="evil-txn") in DENIED


def test_dashboard_reads_alerts_and_results_and_writes_nothing(secure_kafka: Settings) -> None:
    s = secure_kafka
    assert _produce(s, "engine", s.topic_alerts) is None
    assert _produce(s, "engine", s.topic_results) is None
    assert _consume(s, "dashboard", s.topic_alerts) is None
    assert _consume(s, "dashboard", s.topic_results) is None
    for topic in (s.topic_alerts, s.topic_results, s.topic_trades, s.topic_subscriptions):
        assert _produce(s, "dashboard", topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED, topic
    assert _consume(s, "dashboard", s.topic_dead_letter) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _consume(s, "dashboard", s.topic_subscriptions) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_relay_writes_only_subscriptions(secure_kafka: Settings) -> None:
    s = secure_kafka
    assert _produce(s, "relay", s.topic_subscriptions) is None
    assert _produce(s, "relay", s.topic_subscriptions, transactional_id="tidewatch-outbox-relay:subs") is None
    assert _consume(s, "relay", s.topic_subscriptions) is None  # its crash recovery reads it back
    assert _produce(s, "relay", s.topic_subscriptions, transactional_id="tidewatch-engine-x") in DENIED
    assert _consume(s, "engine", s.topic_subscriptions) is None
    for topic in (s.topic_alerts, s.topic_trades):
        assert _produce(s, "relay", topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED, topic
    assert _consume(s, "relay", s.topic_alerts) in DENIED


def test_plaintext_remains_the_default() -> None:
    s = Settings()
    assert s.kafka_security == "plaintext" and kafka_client.client_config(s) == {}
    assert "PLAINTEXT://" in kafka.server_properties(s) and "sasl" not in kafka.server_properties(s)
