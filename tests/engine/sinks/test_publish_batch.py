"""Real Kafka (the embedded broker of ``restartable_kafka``): a batch published with the batch
encoder lands, partition by partition, as the per-alert fastavro loop it replaced landed it --
alerts, results, EXIT tombstones, keys -- and consumers see it once, read_committed; the same
from the batch's columns (:class:`engine.sinks.alert_columns.AlertColumns`) and through a local
queue far smaller than the batch (``BufferError``: the loop waits and goes on)."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest

from engine.dead_letter import DeadLetters
from engine.messages import Alert
from engine.sinks import publish
from engine.sinks.alert_columns import AlertColumns
from tests.engine.support import own_topics, read_topic
from tidewatch.settings import Settings
from tidewatch.wire.avro import decode

pytestmark = pytest.mark.integration


def _records(bootstrap: str, topic: str) -> dict[int, list[tuple[Any, Any]]]:
    """``{partition: [(key, value or None), ...]}`` of the committed records of ``topic``."""
    out: dict[int, list[tuple[Any, Any]]] = {}
    for p, k, v in read_topic(bootstrap, topic, None, messages=True):
        out.setdefault(p, []).append((k, v))
    return out


def _alerts(n: int) -> list[Alert]:
    subs = [str(uuid.UUID(int=i + 1)) for i in range(40)]
    return [
        Alert(subs[i % 40], f"r{i % 40}", "trades", f"S{i % 13}", "ENTER" if i % 3 else "EXIT",
              1_763_900_000_000 + 1000 * (i // 50), {"COUNT(*)": i, "AVG(price)": None if i % 7 == 0 else i / 3})
        for i in range(n)
    ]  # fmt: skip


class _SmallQueue(publish.Publisher):
    producer_config = {**publish.Publisher.producer_config, "queue.buffering.max.messages": 700}  # noqa: RUF012


def test_batch_encoder_publishes_what_the_per_alert_loop_published(restartable_kafka: Settings) -> None:
    bootstrap = restartable_kafka.kafka_bootstrap
    alerts = _alerts(2500)
    n_exit = sum(a.kind == "EXIT" for a in alerts)
    got = {}
    variants = {
        "old": (publish._produce_alerts_per_record, publish.Publisher, alerts),
        "new": (publish.produce_alerts, publish.Publisher, alerts),
        "columns": (publish.produce_alerts, publish.Publisher, AlertColumns.of(alerts)),
        "small-queue": (publish.produce_alerts, _SmallQueue, alerts),
    }
    for name, (produce, publisher, given) in variants.items():
        run = uuid.uuid4().hex[:6]
        s = own_topics(restartable_kafka, f"pub-{name}")
        publish.ensure_topics(bootstrap, s)
        pub = publisher(bootstrap, s, f"pub-test-{name}-{run}")
        pub.produce_alerts = produce
        try:
            pub.publish(0, given)
            assert pub.last_published() == 0
        finally:
            pub.close()
        got[name] = (
            _records(bootstrap, s.topic_alerts),
            _records(bootstrap, s.topic_results),
        )
    (old_alerts, old_results) = got.pop("old")
    assert sum(map(len, old_alerts.values())) == len(alerts)
    assert sum(map(len, old_results.values())) == len(alerts) + n_exit

    def strip(recs: dict[int, list[tuple[Any, Any]]]) -> dict[int, list[tuple[Any, Any]]]:
        # emitted_at is the wall clock of each transaction: the rest must match
        return {p: [(k, {**decode(v, "alerts"), "emitted_at": 0}) for k, v in r] for p, r in recs.items()}

    for name, (new_alerts, new_results) in got.items():
        assert new_results == old_results, name  # byte for byte, tombstones in place
        assert sum(v is None for recs in new_results.values() for _, v in recs) == n_exit
        assert strip(new_alerts) == strip(old_alerts), name
        assert sorted(d["id"] for r in strip(new_alerts).values() for _, d in r) == sorted(
            a.id for a in alerts
        )


def test_a_removed_subscription_gets_a_tombstone_per_key_before_the_batch_results(
    restartable_kafka: Settings,
) -> None:
    """``publish(..., removed)``: a tombstone for each ``subscription|key`` the removed
    subscriptions had, in the batch's transaction, before its own result records (a subscription
    deleted and subscribed again in one batch: its new result comes after)."""
    bootstrap = restartable_kafka.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    s = own_topics(restartable_kafka, "pub-rm")
    publish.ensure_topics(bootstrap, s)
    sid, other = str(uuid.UUID(int=7)), str(uuid.UUID(int=8))
    again = Alert(sid, "r", "trades", "B", "ENTER", 1_763_900_000_000, {"n": 2})
    pub = publish.Publisher(bootstrap, s, f"pub-test-rm-{run}")
    try:
        pub.publish(0, [again], None, {sid: ["A", "B"], other: ["K"]})
        pub.publish(1, [], None, {})
    finally:
        pub.close()
    results = [(k, v) for recs in _records(bootstrap, s.topic_results).values() for k, v in recs]
    tombstones = sorted(k for k, v in results if v is None)
    assert tombstones == sorted(f"{x}|{k}".encode() for x, k in ((sid, "A"), (sid, "B"), (other, "K")))
    mine = [(k, v) for k, v in results if k == f"{sid}|B".encode()]
    assert [v is None for _, v in mine] == [True, False]  # the tombstone, then the new result
    assert decode(mine[1][1], "results")["present"] is True


def test_dead_letters_go_through_a_full_local_queue(restartable_kafka: Settings) -> None:
    """A batch's dead letters after its alerts, through a local queue smaller than either
    (``BufferError``): every dead letter lands once, in order, beside every alert -- none is lost
    and the transaction is not failed by the queue."""
    bootstrap = restartable_kafka.kafka_bootstrap
    run = uuid.uuid4().hex[:6]
    s = own_topics(restartable_kafka, "pub-dl")
    publish.ensure_topics(bootstrap, s)
    dead = DeadLetters()
    n = 3000
    dead.add(
        "trades", np.zeros(n, np.int64), np.arange(n), [None] * n, [b"\x00" * 40] * n, "undecodable", "bad"
    )
    alerts = _alerts(1500)
    pub = _SmallQueue(bootstrap, s, f"pub-test-dl-{run}")
    try:
        pub.publish(0, alerts, dead)
        assert pub.last_published() == 0
    finally:
        pub.close()
    recs = _records(bootstrap, s.topic_dead_letter)
    assert len(recs) == 1  # one key, the source topic: one partition, in the batch's order
    got = [decode(v, "dead_letter") for _, v in next(iter(recs.values()))]
    assert [d["source_offset"] for d in got] == list(range(n))
    assert {d["reason"] for d in got} == {"undecodable"}
    assert sum(map(len, _records(bootstrap, s.topic_alerts).values())) == len(alerts)
