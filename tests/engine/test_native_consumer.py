"""The native consumer (``engine.native_consumer``) against a real Kafka broker: the records it
hands over as Arrow columns equal what confluent-kafka's ``Consumer`` reads of the same
partitions, read_committed drops aborted transactions, partition EOF comes with its offset,
seek re-reads, and a bad setting is refused by name."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from engine.app import records_table
from engine.native_consumer import (
    ERR_PARTITION_EOF,
    OFFSET_BEGINNING,
    NativeConsumer,
    NativeConsumerError,
)


def new_topic(bootstrap: str, partitions: int = 2) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"native-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for part, key, value in records:
        p.produce(topic, value=value, key=key, partition=part)
    assert p.flush(30) == 0


def consumer(bootstrap: str, **extra: Any) -> NativeConsumer:
    return NativeConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"native-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            **extra,
        }
    )


def read_all(c: NativeConsumer, partitions: int) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """Rows (as dicts) and the EOF offset of each partition, until every partition's EOF."""
    rows: list[dict[str, Any]] = []
    eof: dict[int, int] = {}
    for _ in range(200):
        ch = c.consume(1000, 0.5)
        rows.extend(ch.table().to_pylist())
        for e in ch.errors:
            assert e.code == ERR_PARTITION_EOF, e
            eof[e.partition] = e.offset
        if len(eof) == partitions and not len(ch):
            return rows, eof
    raise AssertionError(f"no EOF of every partition: {eof}")


def confluent_rows(bootstrap: str, topic: str, partitions: int, n: int) -> list[dict[str, Any]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ref-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    msgs: list[Any] = []
    try:
        for _ in range(200):
            msgs.extend(m for m in c.consume(1000, 0.5) if m.error() is None)
            if len(msgs) >= n:
                break
    finally:
        c.close()
    return records_table(msgs).to_pylist()


def by_position(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


@pytest.mark.integration
def test_records_equal_confluent_kafka_reads_nulls_and_empties_included(kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap)
    records: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(3000):
        key = None if i % 7 == 0 else (b"" if i % 11 == 0 else f"k{i % 50}".encode())
        value = None if i % 13 == 0 else (b"" if i % 17 == 0 else bytes(range(i % 256)) * (1 + i % 3))
        records.append((i % 2, key, value))
    produce(kafka_bootstrap, topic, records)
    c = consumer(kafka_bootstrap)
    try:
        c.assign([(topic, 0, OFFSET_BEGINNING), (topic, 1, OFFSET_BEGINNING)])
        rows, eof = read_all(c, 2)
        assert c.watermarks(topic, 0, 10) == (0, eof[0])
    finally:
        c.close()
    assert eof == {0: 1500, 1: 1500}
    ref = confluent_rows(kafka_bootstrap, topic, 2, len(records))
    assert len(rows) == len(ref) == len(records)
    assert by_position(rows) == by_position(ref)
    assert sum(r["value"] is None for r in rows) == sum(v is None for _, _, v in records) > 0
    assert sum(r["key"] == b"" for r in rows) == sum(k == b"" for _, k, _ in records) > 0


@pytest.mark.integration
def test_read_committed_skips_an_aborted_transaction(kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer

    topic = new_topic(kafka_bootstrap, 1)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"t-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    for committed in (True, False, True):
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, value=f"{committed}-{i}".encode(), partition=0)
        (p.commit_transaction if committed else p.abort_transaction)(30)
    c = consumer(kafka_bootstrap)
    try:
        c.assign([(topic, 0, OFFSET_BEGINNING)])
        rows, eof = read_all(c, 1)
        _, hi = c.watermarks(topic, 0, 10)
    finally:
        c.close()
    assert [r["value"] for r in rows] == [f"True-{i}".encode() for i in range(10)] * 2
    assert eof[0] == hi  # past the last commit marker: no record there to hand over


@pytest.mark.integration
def test_seek_back_reads_again_from_the_offset(kafka_bootstrap: str) -> None:
    topic = new_topic(kafka_bootstrap, 1)
    produce(kafka_bootstrap, topic, [(0, None, f"v{i}".encode()) for i in range(100)])
    c = consumer(kafka_bootstrap)
    try:
        c.assign([(topic, 0, 40)])
        first, _ = read_all(c, 1)
        assert [r["offset"] for r in first] == list(range(40, 100))
        c.seek(topic, 0, 90)
        again, _ = read_all(c, 1)
    finally:
        c.close()
    assert [r["value"] for r in again] == [f"v{i}".encode() for i in range(90, 100)]


def test_a_bad_setting_is_refused_by_name() -> None:
    with pytest.raises(NativeConsumerError, match="fetch.wait.max.ms"):
        NativeConsumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "fetch.wait.max.ms": "soon"})
    with pytest.raises(NativeConsumerError, match="no.such.setting"):
        NativeConsumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "no.such.setting": 1})
