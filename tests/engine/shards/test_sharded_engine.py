"""The sharded engine on the real stack (Kafka + PostgreSQL containers, Spark local[2]), issue #23.

The scenario of tests/engine/test_engine_integration.py with ``engine_shards`` = 1 and 2: the
shards evaluate in Spark's Python workers (``transformWithStateInPandas``, RocksDB state); the
alert log in PostgreSQL equals ``tidewatch backtest`` on the same good events, the alerts in Kafka
are the same, once each; every bad record is dead-lettered once; a rule added mid-stream is
answered at once from the history the shards hold (PSoup).  Then the engine is stopped and
started again on the same checkpoint: the shards are rebuilt from Spark's state store and go on
exactly (nothing lost, nothing doubled).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

from tests.engine.support import (  # noqa: E402
    LATE_RULE,
    RULES,
    G,
    add_rule,
    backtest,
    make_scenario,
    produce,
    produce_rules,
    read_topic,
    result_at,
)
from tests.engine.test_engine_integration import (  # noqa: E402
    engine_settings,
    fresh_database,
    topics_of,
    wait_for,
)


@pytest.mark.parametrize("shards", [1, 2])
def test_sharded_engine_equals_backtest(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path, shards: int
) -> None:
    from engine.shards.engine import ShardedEngine
    from engine.sinks.publish import ensure_topics

    run = uuid.uuid4().hex[:8]
    s = engine_settings(run, tmp_path / "ckpt", engine_shards=shards)
    db = fresh_database(pg_url)
    ensure_topics(kafka_bootstrap, s)
    sc = make_scenario()
    produce_rules(sc, kafka_bootstrap, s.topic_subscriptions)
    final = (sc.max_ts - s.allowed_lateness_ms) // G * G

    app = ShardedEngine(s, bootstrap=kafka_bootstrap, pg_url=db, engine_id=run)
    q = app.start(spark, trigger_seconds=0.5, max_offsets_per_trigger=2500)
    try:
        wait_for(lambda: app.rules == len(RULES), 180, "every rule to be active in every shard")
        produce(sc, kafka_bootstrap, topics_of(s))
        wait_for(lambda: app.applied_until == final, 300, f"every shard to look up at {final}")
        assert app.batches_done >= 3
    finally:
        q.stop()
        app.close()
    # the shards ran in Spark's Python workers, not in this process
    assert app.executor_pids and os.getpid() not in app.executor_pids

    # started again on the same checkpoint: the shards come back from Spark's state store
    app = ShardedEngine(s, bootstrap=kafka_bootstrap, pg_url=db, engine_id=run)
    q = app.start(spark, trigger_seconds=0.5, max_offsets_per_trigger=2500)
    try:
        sid = add_rule(sc, kafka_bootstrap, s.topic_subscriptions, *LATE_RULE)
        wait_for(lambda: any(a[0] == sid for a in app.store.alert_log()), 180, "the new rule's alerts")
        # every shard rebuilt from Spark's state store at the restart's first batch (the live cores
        # of the run before are not reused: they may be ahead of what Spark committed)
        assert sorted(app.rebuilds) == list(range(shards)) and all(app.rebuilds.values()), app.rebuilds
    finally:
        q.stop()
        app.close()

    log = app.store.alert_log()
    original = {sc.sub_ids[n] for n in RULES}
    got = [a for a in log if a[0] in original]
    expect = backtest(sc, RULES, final)
    assert len(expect) > 100
    missing, extra = sorted(set(expect) - set(got)), sorted(set(got) - set(expect))
    assert not missing and not extra, (
        f"missing {len(missing)}: {missing[:5]}; extra {len(extra)}: {extra[:5]}"
    )
    assert sorted(got) == expect  # once each

    late = [a for a in log if a[0] == sid]
    ref = result_at(backtest(sc, dict([LATE_RULE]), final), final)
    assert ref and {a[1] for a in late} == ref
    assert all(a[2] == "ENTER" and a[3] == final for a in late)

    kafka_alerts = read_topic(kafka_bootstrap, s.topic_alerts, "alerts")
    ids = [a["id"] for a in kafka_alerts]
    assert len(ids) == len(set(ids)) == len(log)
    assert set(ids) == {f"{a[0]}|{a[1]}|{a[2]}|{a[3]}" for a in log}

    dead = read_topic(kafka_bootstrap, s.topic_dead_letter, "dead_letter")
    assert sorted(d["reason"] for d in dead) == sorted(r for _, r in sc.bad_trades)
    assert sorted(d["value"] for d in dead) == sorted(v for v, _ in sc.bad_trades)


def test_sharded_engine_refuses_another_shard_count(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    from engine.errors import CheckpointMismatch
    from engine.shards.engine import ShardedEngine

    run = uuid.uuid4().hex[:8]
    db = fresh_database(pg_url)
    (tmp_path / "ckpt" / "tidewatch").mkdir(parents=True)
    (tmp_path / "ckpt" / "tidewatch" / "shards.json").write_text('{"shards": 2}')
    s = engine_settings(run, tmp_path / "ckpt", engine_shards=3)
    app = ShardedEngine(s, bootstrap=kafka_bootstrap, pg_url=db, engine_id=run)
    try:
        with pytest.raises(CheckpointMismatch, match="holds 2 shards"):
            app.start(spark)
    finally:
        app.close()
