"""Outbox relay against real PostgreSQL and Kafka: every change lands on the topic exactly once,
also when the relay process is killed at each point between the commit and the publish.

The three crash points (see the argument in :mod:`subscriptions.outbox`):
  1. after the change's commit, before any publish      -> next relay publishes it
  2. after producing, before the Kafka transaction commits -> aborted, produced again once
  3. after the Kafka commit, before the rows are marked   -> recovery marks, no re-publish
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy import create_engine, pool, select
from sqlalchemy.orm import Session

from subscriptions.outbox import OutboxRelay, RelayBusy, pending_count
from subscriptions.service import SubscriptionService
from tidewatch.db import migrate
from tidewatch.db.models import Outbox
from tidewatch.kafka.topics import create_topics, spec_for
from tidewatch.settings import Settings, get_settings

pytestmark = pytest.mark.integration

RULE = "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDS > {n}"


@pytest.fixture(scope="module")
def db_url(pg_url):
    migrate.upgrade(pg_url)
    return pg_url


@pytest.fixture()
def topic(kafka_bootstrap):
    name = f"test-subscriptions-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    # the subscriptions topic's spec (one partition, compacted) under a scratch name
    create_topics(admin, [spec_for(name, Settings(topic_subscriptions=name))])
    yield name
    admin.delete_topics([name])


@pytest.fixture()
def svc(db_url, topic):
    s = SubscriptionService(settings=get_settings(), url=db_url, topic=topic)
    s.ensure_user("outbox-user")
    return s


def _changes(svc: SubscriptionService) -> int:
    """Make 3 subscriptions with 2 more changes each: 9 changes."""
    for i in range(3):
        v = svc.create("outbox-user", RULE.format(n=1000 + i), name=f"r{uuid.uuid4().hex[:6]}")
        svc.pause("outbox-user", v.id)
        svc.update("outbox-user", v.id, rule_text=RULE.format(n=2000 + i))
    return 9


def _read_topic(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[tuple[str, int, int]]:
    """(key, version, outbox_id) of every record visible on the topic."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # one partition; no group rebalance
    out = []
    try:
        while True:
            m = c.poll(15)
            assert m is not None, "timed out reading the topic"
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    break
                raise AssertionError(m.error())
            value = json.loads(m.value())
            headers = dict(m.headers())
            assert int(headers["version"]) == value["version"]
            out.append((m.key().decode(), value["version"], int(headers["outbox_id"])))
    finally:
        c.close()
    return out


def _rows(db_url: str, topic: str) -> list[Outbox]:
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with Session(engine) as s:
            return list(s.scalars(select(Outbox).where(Outbox.topic == topic).order_by(Outbox.id)))
    finally:
        engine.dispose()


def _assert_exactly_once(db_url: str, bootstrap: str, topic: str, n: int) -> None:
    records = _read_topic(bootstrap, topic)
    rows = _rows(db_url, topic)
    assert len(rows) == n
    counts = Counter((k, v) for k, v, _ in records)
    assert len(records) == n, f"expected {n} records, got {len(records)}: {counts.most_common(3)}"
    assert set(counts) == {(r.key, r.payload["version"]) for r in rows}
    assert all(c == 1 for c in counts.values())
    # per key, versions arrive in order
    for key in {k for k, _, _ in records}:
        versions = [v for k, v, _ in records if k == key]
        assert versions == sorted(versions)
    assert all(r.published_at is not None and r.kafka_offset is not None for r in rows)
    assert pending_count(db_url, [topic]) == 0


def _relay(db_url: str, bootstrap: str, topic: str) -> OutboxRelay:
    return OutboxRelay(topic=topic, bootstrap=bootstrap, url=db_url, transactional_id=f"test-{topic}")


def _crashing_relay(db_url: str, bootstrap: str, topic: str, hook: str) -> int:
    """Run a relay in a child process that SIGKILLs itself at ``hook``; return its exit code."""
    code = textwrap.dedent(
        f"""
        import os, signal
        from subscriptions.outbox import Hooks, OutboxRelay
        die = lambda: os.kill(os.getpid(), signal.SIGKILL)
        r = OutboxRelay(topic={topic!r}, bootstrap={bootstrap!r}, url={db_url!r},
                        transactional_id={"test-" + topic!r}, hooks=Hooks({hook}=die))
        r.drain()
        raise SystemExit(3)  # not reached
        """
    )
    return subprocess.run([sys.executable, "-c", code], timeout=120).returncode


def test_changes_committed_but_never_published_are_published_once(svc, db_url, kafka_bootstrap, topic):
    # crash point 1: the service committed 9 changes; no relay ran ("killed" before publishing)
    n = _changes(svc)
    assert pending_count(db_url, [topic]) == n
    assert _read_topic(kafka_bootstrap, topic) == []
    with _relay(db_url, kafka_bootstrap, topic) as r:
        assert r.recovered == 0
        assert r.drain() == n
        assert r.drain() == 0
    _assert_exactly_once(db_url, kafka_bootstrap, topic, n)
    # a restarted relay publishes nothing again
    with _relay(db_url, kafka_bootstrap, topic) as r:
        assert r.recovered == 0 and r.drain() == 0
    _assert_exactly_once(db_url, kafka_bootstrap, topic, n)


def test_killed_after_kafka_commit_before_marking(svc, db_url, kafka_bootstrap, topic):
    # crash point 3: records are on the topic, rows still look unpublished
    n = _changes(svc)
    assert _crashing_relay(db_url, kafka_bootstrap, topic, "after_kafka_commit") == -9
    assert pending_count(db_url, [topic]) == n
    assert len(_read_topic(kafka_bootstrap, topic)) == n
    with _relay(db_url, kafka_bootstrap, topic) as r:
        assert r.recovered == n  # found on the topic, marked, not produced again
        assert r.drain() == 0
    _assert_exactly_once(db_url, kafka_bootstrap, topic, n)
    # more changes after the recovery go out once as well
    v = svc.create("outbox-user", RULE.format(n=7), name=f"late{uuid.uuid4().hex[:6]}")
    svc.delete("outbox-user", v.id)
    with _relay(db_url, kafka_bootstrap, topic) as r:
        assert r.drain() == 2
    _assert_exactly_once(db_url, kafka_bootstrap, topic, n + 2)


def test_killed_inside_the_kafka_transaction(svc, db_url, kafka_bootstrap, topic):
    # crash point 2: produced and flushed, transaction open, then killed
    n = _changes(svc)
    assert _crashing_relay(db_url, kafka_bootstrap, topic, "before_kafka_commit") == -9
    assert pending_count(db_url, [topic]) == n
    with _relay(db_url, kafka_bootstrap, topic) as r:  # fences the dead producer, aborts its transaction
        assert r.recovered == 0
        assert r.drain() == n
    _assert_exactly_once(db_url, kafka_bootstrap, topic, n)
    # the aborted copies exist only for read_uncommitted readers; the version tells them apart
    raw = _read_topic(kafka_bootstrap, topic, isolation="read_uncommitted")
    assert len(raw) == 2 * n and len({(k, v) for k, v, _ in raw}) == n


def test_only_one_relay_per_topic(db_url, kafka_bootstrap, topic):
    with _relay(db_url, kafka_bootstrap, topic):
        with pytest.raises(RelayBusy):
            _relay(db_url, kafka_bootstrap, topic)
    with _relay(db_url, kafka_bootstrap, topic) as r:  # the lock went with the first relay
        assert r.drain() == 0
