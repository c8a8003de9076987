"""The direct source's two consumers -- librdkafka driven natively (``engine.sources.native_consumer``)
and the engine's own Fetch-API reader (``engine.sources.fetch_consumer``) -- against a real Kafka
broker: the records they hand over as Arrow columns equal what confluent-kafka's ``Consumer``
reads of the same partitions (nulls, empties, every codec the producers here use),
read_committed drops aborted transactions (also interleaved with another producer's committed
ones), partition EOF comes with its offset, seek re-reads, and a bad setting is refused by name."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from engine.sources.fetch_consumer import FetchConsumer
from engine.sources.native_consumer import (
    ERR_PARTITION_EOF,
    OFFSET_BEGINNING,
    NativeConsumer,
    NativeConsumerError,
)
from engine.sources.readers import records_table


def new_topic(bootstrap: str, partitions: int = 2) -> str:
    from confluent_kafka.admin import AdminClient

    from tidewatch.kafka.topics import create_topics, stream_topic_spec

    name = f"native-{uuid.uuid4().hex[:8]}"
    create_topics(AdminClient({"bootstrap.servers": bootstrap}), [stream_topic_spec(name, partitions)])
    return name


def produce(
    bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes | None]], codec: str = "none"
) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": codec})
    for part, key, value in records:
        p.produce(topic, value=value, key=key, partition=part)
    assert p.flush(30) == 0


CLIENTS = pytest.mark.parametrize("cls", [NativeConsumer, FetchConsumer], ids=["librdkafka", "fetch"])


def consumer(bootstrap: str, cls: Any = NativeConsumer, **extra: Any) -> Any:
    return cls(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"native-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            **extra,
        }
    )


def read_all(c: Any, partitions: int) -> tuple[list[dict[str, Any]], dict[int, int]]:
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


def read_partition_0(
    bootstrap: str, cls: Any, topic: str
) -> tuple[list[dict[str, Any]], dict[int, int], int]:
    """Rows and EOF offsets of partition 0 read from the start, and its end offset."""
    c = consumer(bootstrap, cls)
    try:
        c.assign([(topic, 0, OFFSET_BEGINNING)])
        rows, eof = read_all(c, 1)
        _, hi = c.watermarks(topic, 0, 10)
    finally:
        c.close()
    return rows, eof, hi


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
@CLIENTS
@pytest.mark.parametrize("codec", ["none", "lz4", "gzip"])
def test_records_equal_confluent_kafka_reads_nulls_and_empties_included(
    kafka_bootstrap: str, cls: Any, codec: str
) -> None:
    topic = new_topic(kafka_bootstrap)
    records: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(3000):
        key = None if i % 7 == 0 else (b"" if i % 11 == 0 else f"k{i % 50}".encode())
        value = None if i % 13 == 0 else (b"" if i % 17 == 0 else bytes(range(i % 256)) * (1 + i % 3))
        records.append((i % 2, key, value))
    produce(kafka_bootstrap, topic, records, codec)
    c = consumer(kafka_bootstrap, cls)
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
@CLIENTS
def test_read_committed_skips_an_aborted_transaction(kafka_bootstrap: str, cls: Any) -> None:
    from confluent_kafka import Producer

    topic = new_topic(kafka_bootstrap, 1)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"t-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    for committed in (True, False, True):
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, value=f"{committed}-{i}".encode(), partition=0)
        (p.commit_transaction if committed else p.abort_transaction)(30)
    rows, eof, hi = read_partition_0(kafka_bootstrap, cls, topic)
    assert [r["value"] for r in rows] == [f"True-{i}".encode() for i in range(10)] * 2
    assert eof[0] == hi  # past the last commit marker: no record there to hand over


@pytest.mark.integration
@CLIENTS
def test_seek_back_reads_again_from_the_offset(kafka_bootstrap: str, cls: Any) -> None:
    topic = new_topic(kafka_bootstrap, 1)
    produce(kafka_bootstrap, topic, [(0, None, f"v{i}".encode()) for i in range(100)])
    c = consumer(kafka_bootstrap, cls)
    try:
        c.assign([(topic, 0, 40)])
        first, _ = read_all(c, 1)
        assert [r["offset"] for r in first] == list(range(40, 100))
        c.seek(topic, 0, 90)
        again, _ = read_all(c, 1)
    finally:
        c.close()
    assert [r["value"] for r in again] == [f"v{i}".encode() for i in range(90, 100)]


@pytest.mark.parametrize("cls", [NativeConsumer, FetchConsumer], ids=["librdkafka", "fetch"])
def test_a_bad_setting_is_refused_by_name(cls: Any) -> None:
    with pytest.raises(NativeConsumerError, match="fetch.wait.max.ms"):
        cls({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "fetch.wait.max.ms": "soon"})


def test_the_fetch_consumer_refuses_a_security_protocol() -> None:
    with pytest.raises(NativeConsumerError, match="plaintext"):
        FetchConsumer({"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_PLAINTEXT"})


@pytest.mark.integration
@CLIENTS
def test_aborted_and_committed_transactions_interleaved(kafka_bootstrap: str, cls: Any) -> None:
    """Two transactional producers write the partition at once; one aborts, one commits, and
    a plain producer writes between: read_committed keeps exactly the committed and plain
    records, in offset order (the aborted producer's batches are skipped from the first offset
    the broker lists up to its ABORT marker, Kafka's CompletedFetch rule)."""
    from confluent_kafka import Producer

    topic = new_topic(kafka_bootstrap, 1)
    a = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"a-{uuid.uuid4().hex[:6]}",
            "linger.ms": 0,
        }
    )
    b = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"b-{uuid.uuid4().hex[:6]}",
            "linger.ms": 0,
        }
    )
    plain = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
    for p in (a, b):
        p.init_transactions(30)
    want = []
    for rnd in range(3):
        a.begin_transaction()
        b.begin_transaction()
        for i in range(20):
            a.produce(topic, value=f"a{rnd}-{i}".encode(), partition=0)
            b.produce(topic, value=f"b{rnd}-{i}".encode(), partition=0)
            a.flush(10)
            b.flush(10)
            if i % 5 == 0:
                plain.produce(topic, value=f"p{rnd}-{i}".encode(), partition=0)
                plain.flush(10)
                want.append(f"p{rnd}-{i}".encode())
        a.abort_transaction(30)
        b.commit_transaction(30)
        want.extend(f"b{rnd}-{i}".encode() for i in range(20))
    rows, eof, hi = read_partition_0(kafka_bootstrap, cls, topic)
    got = [r["value"] for r in rows]
    assert sorted(got) == sorted(want)
    assert [r["offset"] for r in rows] == sorted(r["offset"] for r in rows)
    assert not any(v.startswith(b"a") for v in got)
    assert eof[0] == hi
    with pytest.raises(NativeConsumerError, match="no.such.setting"):
        NativeConsumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "no.such.setting": 1})
