"""The app's own Kafka clients in the opt-in SASL/SCRAM + ACL mode, on the real embedded broker.

Each test runs as one process of ``tidewatch up`` would: the environment holds
``TIDEWATCH_KAFKA_SECURITY=scram`` and only that process's own SCRAM password (the others blank,
:func:`tidewatch.stack.embedded._kafka_env`), the settings are read from it, and the app's real code paths
connect: the feed's :class:`~ingest.producer.KafkaFeed` / ``TransactionalFeed`` (``--resume``),
the engine's :class:`~engine.sinks.publish.Publisher`, ``ensure_topics`` and ``read_ranges``, the
dashboard's key-detail reader (:func:`dashboard.detail.recent_events`) and the outbox relay
(:meth:`subscriptions.outbox.OutboxRelay.from_settings`).  Each allowed action succeeds and each
forbidden one is refused by the broker.  The broker side alone: test_kafka_security.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from engine.sinks.publish import Publisher, ensure_topics
from engine.sources.readers import read_ranges
from ingest.producer import FeedProgress, KafkaFeed, TransactionalFeed, ensure_topic, file_identity
from ingest.trades_gen import TradeConfig, TradeGenerator
from tests.tidewatch.stack.support import AsProcess, as_process_of, start_engine_until_rule
from tidewatch.kafka import client as kafka_client
from tidewatch.kafka.txn import refused
from tidewatch.settings import Settings, get_settings

pytestmark = pytest.mark.integration


@pytest.fixture()
def as_process(scram_stack: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[AsProcess]:
    """``as_process(principal)``: this test process acts as the app process of ``principal``."""
    yield as_process_of(scram_stack, monkeypatch)
    monkeypatch.undo()
    get_settings.cache_clear()


def _admin(s: Settings, **conf: Any) -> dict[str, Any]:
    return kafka_client.librdkafka_config(s, kafka_client.ADMIN, **conf)


def _end_offsets(s: Settings, topic: str) -> int:
    """Sum of the topic's end offsets; retried while a fresh topic's partitions still elect their
    leader (NOT_LEADER_FOR_PARTITION right after creation, seen once in a clean-clone run)."""
    c = Consumer(_admin(s, **{"group.id": "tidewatch-test-offsets"}))
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                parts = c.list_topics(topic, timeout=10).topics[topic].partitions
                return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
            except KafkaException as exc:
                transient = (
                    KafkaError.NOT_LEADER_FOR_PARTITION,
                    KafkaError.LEADER_NOT_AVAILABLE,
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    KafkaError._TIMED_OUT,
                )
                if exc.args[0].code() not in transient or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        c.close()


def _read_all(s: Settings, principal: str, topic: str, timeout: float = 15.0) -> list[Any]:
    """Every committed record of ``topic``, read as ``principal`` (its own group prefix)."""
    c = Consumer(
        kafka_client.librdkafka_config(
            s,
            principal,
            **{
                "group.id": f"{kafka_client.ID_PREFIX[principal]}-test-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            },
        )
    )
    out: list[Any] = []
    try:
        tmd = c.list_topics(topic, timeout=10).topics[topic]
        if tmd.error is not None:
            raise KafkaException(tmd.error)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in tmd.partitions])
        left, deadline = set(tmd.partitions), time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    left.discard(m.partition())
                    continue
                raise KafkaException(err)
            out.append(m)
        return out
    finally:
        c.close()


def _produce_one(s: Settings, principal: str, topic: str, value: bytes = b"x") -> tuple[Any, int, int]:
    """Produce one record as ``principal``: ``(error or None, partition, offset)``."""
    p = Producer(
        kafka_client.librdkafka_config(s, principal, **{"message.timeout.ms": 10_000, "log_level": 0})
    )
    got: list[tuple[Any, Any, Any]] = []
    p.produce(topic, value=value, on_delivery=lambda e, m: got.append((e, m.partition(), m.offset())))
    p.flush(20)
    assert len(got) == 1
    return got[0]


def _trades(n_ms: int = 2000) -> list[dict[str, Any]]:
    gen = TradeGenerator(TradeConfig(rate=2_000, n_symbols=20), seed=7)
    now = int(time.time() * 1000)
    return list(gen.chunks(now - n_ms, now, 1000))


def test_each_process_gets_only_its_own_password(scram_stack: Settings, as_process: AsProcess) -> None:
    s = as_process("engine")
    assert s.kafka_security == "scram" and s.kafka_engine_password == scram_stack.kafka_engine_password
    for other in (kafka_client.ADMIN, "feed", "dashboard", "relay"):
        with pytest.raises(RuntimeError, match=kafka_client.password_variable(other)):
            kafka_client.client_config(s, other)


def test_feed_writes_trades_and_is_refused_elsewhere(scram_stack: Settings, as_process: AsProcess) -> None:
    full = scram_stack
    s = as_process("feed")
    chunks = _trades()
    n = sum(len(c["ts"]) for c in chunks)
    before = _end_offsets(full, s.topic_trades)
    feed = KafkaFeed("trades", settings=s)  # `tidewatch feed trades`: topic, bootstrap, credentials
    for c in chunks:
        feed.send(c)
    st = feed.close(timeout=30)
    assert st.produced == n and st.failed == 0 and st.unconfirmed == 0
    assert _end_offsets(full, s.topic_trades) - before == n  # idempotent: exactly n landed

    for topic in (s.topic_alerts, s.topic_subscriptions):
        bad = KafkaFeed("trades", settings=s, topic=topic, create_topic=False)
        bad.send(chunks[0])
        st = bad.close(timeout=30)
        assert st.failed == len(chunks[0]["ts"]), topic
        assert "TOPIC_AUTHORIZATION_FAILED" in st.first_errors[0], st.first_errors
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        ensure_topic(s, s.kafka_bootstrap, f"feed-made-{uuid.uuid4().hex[:6]}")  # no topic creation


def test_resumable_feed_commits_its_transactions(as_process: AsProcess, tmp_path: Path) -> None:
    """``tidewatch feed … --resume``: transactional id and progress group ``tidewatch-feed-*``,
    progress committed as an offset inside each transaction."""
    s = as_process("feed")
    src = tmp_path / "trades.csv"
    src.write_text("a stand-in file: only its identity names the feed\n")
    chunks = _trades(1000)
    n = len(chunks[0]["ts"])
    progress = FeedProgress.open(tmp_path / "progress.json", file_identity(src), s.topic_trades)
    feed = TransactionalFeed("trades", progress, settings=s, commit_every=max(1, n // 3))
    assert feed.send(chunks[0]) == n
    feed.close()
    again = TransactionalFeed(
        "trades", FeedProgress.open(progress.path, file_identity(src), s.topic_trades), settings=s
    )
    assert again.acked == n  # read back from the feed's own group
    assert again.send(chunks[0]) == 0 and again.skipped == n
    again.close()


def test_engine_publishes_alerts_reads_streams_and_nothing_else(
    scram_stack: Settings, as_process: AsProcess
) -> None:
    full = scram_stack
    err, part, off = _produce_one(full, kafka_client.ADMIN, full.topic_trades)
    assert err is None
    derr, dpart, doff = _produce_one(full, kafka_client.ADMIN, full.topic_dead_letter)
    assert derr is None

    s = as_process("engine")
    ensure_topics(s.kafka_bootstrap, s)  # engine start-up: the topics exist, so only listed
    engine_id = f"scram-{uuid.uuid4().hex[:6]}"
    pub = Publisher(s.kafka_bootstrap, s, engine_id)
    assert pub.last_published() == -1
    now = int(time.time() * 1000)
    sub = f"sub-{engine_id}"
    alert = {
        "id": f"{sub}|AAPL|ENTER|{now}",
        "subscription_id": sub,
        "key": "AAPL",
        "kind": "ENTER",
        "as_of": now,
    }
    pub.publish(0, [alert])
    assert pub.last_published() == 0  # its progress marker (group tidewatch-engine-<id>-progress)
    pub.close()
    # the replay consumer of a restart reads the streams by offset
    tbl = read_ranges(s.kafka_bootstrap, {s.topic_trades: {str(part): [off, off]}}, settings=s)
    assert tbl.num_rows == 1 and tbl.column("offset").to_pylist() == [off]
    with pytest.raises(RuntimeError, match="could not read"):  # not its topic to read
        read_ranges(
            s.kafka_bootstrap, {s.topic_dead_letter: {str(dpart): [doff, doff]}}, timeout_s=5, settings=s
        )

    # the dashboard sees the alert
    d = as_process("dashboard")
    keys = [m.key() for m in _read_all(d, "dashboard", d.topic_alerts)]
    assert sub.encode() in keys

    # a publisher pointed at the trades topic is refused
    e = as_process("engine")
    bad = Publisher(
        e.kafka_bootstrap, e.model_copy(update={"topic_alerts": e.topic_trades}), engine_id + "-bad"
    )
    with pytest.raises(KafkaException, match="AUTHORIZATION") as refusal:
        bad.publish(0, [alert])
    # told apart by its code (the records' own refusal), so it was not retried
    assert refused(refusal.value), refusal.value
    # the refused transaction's producer is only thrown away (the engine stops on a refusal).  Its
    # abort can itself fail, fatally: in 1 clean-clone run of ~10 the coordinator answered the
    # EndTxn with INVALID_TXN_STATE (no partition of it had been added), and nothing else
    try:
        bad.producer.abort_transaction(30)
    except KafkaException as exc:
        assert exc.args[0].code() == KafkaError.INVALID_TXN_STATE, exc
    bad.close()


def test_dashboard_reads_and_writes_nothing(scram_stack: Settings, as_process: AsProcess) -> None:
    from dashboard.detail import recent_events

    full = scram_stack
    chunks = _trades(1000)
    writer = KafkaFeed("trades", settings=full, topic=full.topic_trades, producer=Producer(_admin(full)))
    writer.send(chunks[0])
    assert writer.close(timeout=30).failed == 0

    s = as_process("dashboard")
    cols, _ = recent_events("trades", "symbol", None, 120_000, settings=s)  # key-detail charts
    assert len(cols.get("ts", [])) >= len(chunks[0]["ts"])
    assert isinstance(_read_all(s, "dashboard", s.topic_results), list)
    for topic in (s.topic_alerts, s.topic_results, s.topic_trades, s.topic_subscriptions):
        err, _, _ = _produce_one(s, "dashboard", topic)
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, topic
    for topic in (s.topic_subscriptions, s.topic_dead_letter):
        with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
            _read_all(s, "dashboard", topic)


def test_relay_writes_subscriptions_only(scram_stack: Settings, as_process: AsProcess) -> None:
    from dashboard.rules import TEMPLATES
    from subscriptions.outbox import OutboxRelay
    from subscriptions.service import SubscriptionService

    full = scram_stack
    user = f"scram{uuid.uuid4().hex[:6]}"
    service = SubscriptionService(settings=full)
    service.ensure_user(user)
    created = service.create(user, next(iter(TEMPLATES.values())), name="scram test")

    s = as_process("relay")
    with OutboxRelay.from_settings(s) as relay:  # `tidewatch subscriptions relay`
        assert relay.drain() >= 1
    e = as_process("engine")
    keys = [m.key() for m in _read_all(e, "engine", e.topic_subscriptions)]
    assert str(created.id).encode() in keys

    s = as_process("relay")
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        OutboxRelay.from_settings(s.model_copy(update={"topic_subscriptions": s.topic_alerts}))


def test_no_or_wrong_credentials_are_refused(
    scram_stack: Settings, as_process: AsProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = as_process("feed")
    monkeypatch.setenv(kafka_client.password_variable("feed"), "not-the-password")
    get_settings.cache_clear()
    with pytest.raises(KafkaException):
        ensure_topic(get_settings(), s.kafka_bootstrap, s.topic_trades, timeout=5)  # a feed's first call
    monkeypatch.setenv("TIDEWATCH_KAFKA_SECURITY", "plaintext")  # no credentials at all
    get_settings.cache_clear()
    with pytest.raises(KafkaException):
        ensure_topic(get_settings(), s.kafka_bootstrap, s.topic_trades, timeout=5)


def test_spark_engine_reads_trades_and_publishes_alerts_over_scram(
    scram_stack: Settings, as_process: AsProcess, spark: Any, tmp_path: Path
) -> None:
    """The Spark engine end to end in the scram mode: its Kafka source (``spark_options``: SASL
    options, group ``tidewatch-engine-spark-*``), its publisher and its replay consumer run as
    ``engine``; a rule subscribed through the relay fires on trades sent by the feed."""
    from subscriptions.outbox import OutboxRelay
    from subscriptions.service import SubscriptionService

    full = scram_stack
    user = f"spark{uuid.uuid4().hex[:6]}"
    service = SubscriptionService(settings=full)
    service.ensure_user(user)
    rule = "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 5 SECONDS > 50"
    sid = str(service.create(user, rule, name="scram spark").id)
    with OutboxRelay.from_settings(as_process("relay")) as relay:
        relay.drain()

    s = as_process("engine")
    assert set(kafka_client.spark_options(s)) == {
        "kafka.security.protocol",
        "kafka.sasl.mechanism",
        "kafka.sasl.jaas.config",
        "groupIdPrefix",
    }
    app, q = start_engine_until_rule(spark, s, tmp_path / "ckpt", f"scram-{uuid.uuid4().hex[:6]}", sid)
    try:
        feed = KafkaFeed("trades", settings=as_process("feed"))
        for c in _trades(12_000):
            feed.send(c)
        assert feed.close(timeout=30).failed == 0
        s = as_process("engine")
        deadline = time.monotonic() + 120
        while app.totals["alerts"] == 0 and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
    finally:
        q.stop()
        app.close()
    assert app.totals["alerts"] > 0, "no alert within 120 s"
    d = as_process("dashboard")
    assert sid.encode() in {m.key() for m in _read_all(d, "dashboard", d.topic_alerts)}
