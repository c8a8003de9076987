"""Offsets the topic's retention deleted before the engine read them are never skipped silently.

The engine stops; more trades arrive; the oldest 100 of them on one partition are deleted
(``DeleteRecords`` moves the partition's log-start offset exactly as retention does) before the
engine starts again.  Spark's source (``failOnDataLoss = false``) goes on from the oldest offset
left; the engine finds the gap and reports it: one ``lost`` dead letter naming the range, in
the dead-letter topic and in the per-reason metrics the Health view reads; the trades after
the gap are processed.  The same with sharded evaluation (``engine_shards = 2``: the gap found by
the driver from Spark's offset log and the offset ranges the shards got from the routing tasks).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy import create_engine, text

from tests.engine.support import (
    RULES,
    G,
    end_offsets,
    make_scenario,
    produce,
    produce_rules,
    read_everything,
    read_topic,
)
from tests.engine.test_engine_integration import engine_settings, fresh_database, topics_of, wait_for

pytestmark = pytest.mark.integration


def _start(mode: str, s: Any, bootstrap: str, db: str, run: str, spark: Any) -> tuple[Any, Any]:
    """The engine of ``mode`` (``driver``: EngineApp; ``shards``: ShardedEngine) and its query."""
    from engine.app import EngineApp
    from engine.shards.engine import ShardedEngine

    cls = ShardedEngine if mode == "shards" else EngineApp
    app = cls(s, bootstrap=bootstrap, pg_url=db, engine_id=run)
    return app, app.start(spark, trigger_seconds=0.2, max_offsets_per_trigger=1000)


def _looked_up(app: Any, n_rules: int, until: int) -> bool:
    core = getattr(app, "core", None)
    if core is not None:
        return len(core.rules) == n_rules and core.applied_until == until
    return bool(app.rules == n_rules and app.applied_until == until)


@pytest.mark.parametrize("mode", ["driver", "shards"])
def test_offsets_deleted_before_they_were_read_become_a_lost_dead_letter(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path, mode: str
) -> None:
    from engine.sinks.publish import ensure_topics

    run = uuid.uuid4().hex[:8]
    more = {"engine_shards": 2, "snapshot_every_batches": 2} if mode == "shards" else {"engine_shards": 0}
    s = engine_settings(run, tmp_path / "ckpt", **more)
    db = fresh_database(pg_url)
    ensure_topics(kafka_bootstrap, s)
    first = make_scenario(n_trades=1500, n_packets=500, seed=3)
    produce_rules(first, kafka_bootstrap, s.topic_subscriptions)
    produce(first, kafka_bootstrap, topics_of(s))
    app, q = _start(mode, s, kafka_bootstrap, db, run, spark)
    try:
        done = (first.max_ts - s.allowed_lateness_ms) // G * G
        wait_for(lambda: _looked_up(app, len(RULES), done), 180, "batch 1")
        if mode == "shards":
            # the deletion below takes every record before it, the first run's too: a shard is
            # rebuilt at the restart from a snapshot of a batch after the first run's events
            # (docs/engine.md "A shard's state": a rebuild needs the batches after it in Kafka)
            from tests.engine.shards.scenario import await_snapshots_named

            last = max(m.batch_id for m in app.metas.values())
            await_snapshots_named(app, q, kafka_bootstrap, s.topic_subscriptions, 2, 180, since=last)
        q.processAllAvailable()  # stopped between batches
    finally:
        q.stop()
        app.close()

    # while the engine is stopped: more trades (after the first ones in event time), then the
    # oldest 100 of them on partition 0 are deleted
    second = make_scenario(n_trades=3000, n_packets=500, seed=4)
    for events in (second.trades, second.packets):
        events["ts"] = events["ts"] + 200 * G
    second.bad_trades = []
    start = end_offsets(kafka_bootstrap, s.topic_trades)[0]
    produce(second, kafka_bootstrap, topics_of(s))
    assert end_offsets(kafka_bootstrap, s.topic_trades)[0] > start + 200
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.delete_records([TopicPartition(s.topic_trades, 0, start + 100)]).values():
        f.result(30)

    app, q = _start(mode, s, kafka_bootstrap, db, run, spark)
    try:
        want = {t: end_offsets(kafka_bootstrap, t) for t in (s.topic_trades, s.topic_packets)}
        wait_for(lambda: read_everything(app, want), 180, "the engine to read every record left")
        q.processAllAvailable()  # that batch delivered
    finally:
        q.stop()
        app.close()

    dead = [
        d for d in read_topic(kafka_bootstrap, s.topic_dead_letter, "dead_letter") if d["reason"] == "lost"
    ]
    assert len(dead) == 1, dead
    (d,) = dead
    assert (d["source_topic"], d["source_partition"], d["source_offset"]) == (s.topic_trades, 0, start)
    assert f"offsets {start}..{start + 99} (100 records)" in d["detail"] and d["value"] is None
    with create_engine(db).connect() as conn:
        reasons = conn.execute(text("SELECT dead_letter_reasons FROM engine_metrics")).scalars().all()
    assert sum((r or {}).get("lost", 0) for r in reasons) == 1
