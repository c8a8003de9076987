"""Reading a whole topic back in the feed tests (real Kafka)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition


def read_messages(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Any]:
    """Every message of ``topic`` (all partitions, from the start to the end) as confluent-kafka
    ``Message`` objects, read with ``isolation`` (``read_committed`` skips aborted transactions;
    ``read_uncommitted`` counts them): the feed's own records as they stand in the log.  The
    engine's tests read decoded values with ``tests.engine.support.read_topic`` instead."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    parts = list(c.list_topics(topic, timeout=30).topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[Any] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 60
    while len(eof) < len(parts) and time.monotonic() < deadline:
        for m in c.consume(10_000, timeout=1.0):
            e = m.error()
            if e is not None:
                if e.code() == KafkaError._PARTITION_EOF:
                    eof.add(int(m.partition() or 0))
                    continue
                raise AssertionError(e)
            eof.discard(int(m.partition() or 0))
            out.append(m)
    c.close()
    assert len(eof) == len(parts), "did not reach the end of the topic"
    return out
