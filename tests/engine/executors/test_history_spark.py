"""A stream's events read again from Kafka by Spark (:func:`engine.executors.history.spark_history`):
a batch read of the offsets on a real broker, decoded and filtered in the executors, equals the
same function run in this process on the same records."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from engine.executors.history import history_events, spark_history
from tests.engine.executors.test_history import BASE, _index, _records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def test_spark_reads_the_events_the_batches_took(spark: SparkSession, kafka_bootstrap: str) -> None:
    topic = f"history-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    tbl = _records(600, seed=5)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for part, value in zip(tbl.column("partition").to_pylist(), tbl.column("value").to_pylist(), strict=True):
        p.produce(topic, value=value, partition=int(part))  # in order: Kafka's offsets are ours
    assert p.flush(30) == 0
    idx = _index(tbl)
    idx.ranges = {b: {topic: r["tw-trades"]} for b, r in idx.ranges.items()}
    for lo, hi in [(None, None), (BASE + 3_000, BASE + 8_000)]:
        got = spark_history(
            spark, {"kafka.bootstrap.servers": kafka_bootstrap}, idx, "trades", topic,
            lo=lo, hi=hi, max_future_ms=None,
        )  # fmt: skip
        want = history_events(tbl, idx, "trades", topic, lo=lo, hi=hi, max_future_ms=None)
        assert len(want) > 100
        assert got.partition.tolist() == want.partition.tolist()
        assert got.offset.tolist() == want.offset.tolist()
        for f, col in want.columns.items():
            assert got.columns[f].tolist() == col.tolist(), f
