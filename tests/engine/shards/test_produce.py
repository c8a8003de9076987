"""What a shard's task decides before it touches Kafka (engine.shards.produce): pure, no services.

The Kafka side -- a shard's transaction, its marker, a batch run again after the driver failed
before PostgreSQL's commit -- is tests/engine/shards/test_sharded_engine.py's."""

from __future__ import annotations

import numpy as np

from engine.dead_letter import DeadLetters
from engine.messages import Alert, AlertSeq, BatchOutput
from engine.shards import produce
from engine.shards.produce import has_output, publish_shard, shard_engine_id


def test_a_shards_publisher_has_an_id_of_its_own_per_shard() -> None:
    ids = {shard_engine_id("e1", s) for s in range(3)} | {shard_engine_id("e2", 0)}
    assert len(ids) == 4 and "e1" not in ids  # never the driver's own (its transactional id)


def test_an_output_has_kafka_records_when_it_has_an_alert_a_dead_letter_or_a_removed_key() -> None:
    empty = BatchOutput(3)
    empty.removed_keys = {"sub": []}  # a removed subscription no key of which this shard held
    assert not has_output(empty)
    removed = BatchOutput(3)
    removed.removed_keys = {"sub": ["AAPL"]}
    assert has_output(removed)
    dead = BatchOutput(3)
    dead.dead = DeadLetters()
    dead.dead.add("trades", np.array([0]), np.array([7]), [None], [b"\x00"], "undecodable")
    assert has_output(dead)
    alerted = BatchOutput(3)
    alerted.alerts = AlertSeq([Alert("sub", "r", "trades", "AAPL", "ENTER", 60_000)])
    assert has_output(alerted)


def test_an_empty_output_opens_no_transaction_and_makes_no_producer() -> None:
    before = dict(produce._PUBLISHERS)
    # no Kafka at this address: a producer made here would fail its init_transactions
    got = publish_shard(None, "127.0.0.1:9", "e1", 0, BatchOutput(5), live=False)
    assert got.how == "empty" and produce._PUBLISHERS == before
