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
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

from tests.engine.shards.scenario import run_sharded_scenario  # noqa: E402
from tests.engine.test_engine_integration import engine_settings, fresh_database  # noqa: E402


@pytest.mark.parametrize("shards", [1, 2])
def test_sharded_engine_equals_backtest(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path, shards: int
) -> None:
    info = run_sharded_scenario(spark, kafka_bootstrap, pg_url, tmp_path, shards, charts=shards == 2)
    # the shards ran in Spark's Python workers, not in this process
    assert info["pids"] and os.getpid() not in info["pids"]
    assert shards != 2 or info["chart"]["aggregates"]  # the key page's chart, from the shards
    # the routing tasks pre-aggregated (engine_shard_input = "panes"): each run's first batch has
    # no parameters yet and is read again by the shards, every later one came as pane rows (or as
    # a tick's batch, run for the chart request on the idle stream: no rows)
    inputs = info["inputs"]
    assert set(inputs) <= {"panes", "read again", "tick"} and inputs["panes"] > inputs["read again"] > 0, (
        inputs
    )
    assert (inputs["tick"] > 0) == (shards == 2), inputs
    # the shards' tasks produced the Kafka output (engine_shard_delivery = "tasks", the default):
    # each shard's marker moved, the driver's did not (it had no lost dead letter to produce)
    from engine.shards.produce import shard_published_up_to
    from engine.sinks.publish import published_up_to

    s, run = info["settings"], info["engine_id"]
    assert info["published"]["published"] > 0, info["published"]
    assert all(shard_published_up_to(s, kafka_bootstrap, run, k) > 0 for k in range(shards))
    assert published_up_to(s, kafka_bootstrap, run) == -1


def test_sharded_engine_caps_alerts_per_lookup_over_all_shards(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """The alert cap with two shards: per (subscription, lookup time) at most ``cap`` alerts in
    the log, a CAPPED record for the rest, current results exact (the driver caps the merged
    alerts: engine.shards.capped)."""
    info = run_sharded_scenario(spark, kafka_bootstrap, pg_url, tmp_path, 2, restart=False, cap=2)
    assert info["alerts"] > 100
    assert not info["published"], info["published"]  # the cap's delivery is the driver's


def test_sharded_engine_degrades_budgeted_rules_under_overload_the_same_in_every_shard(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """The overload policy with two shards: the driver decides each batch's strides from the
    slowest shard's load, every shard runs with them (a shard rebuilt at the restart too), and
    the alert log equals the backtest at the lookup times used (engine.shards.strides)."""
    info = run_sharded_scenario(spark, kafka_bootstrap, pg_url, tmp_path, 2, overload=True)
    assert info["strided_batches"] >= 2


def test_a_checkpoint_made_without_changelog_checkpointing_goes_on_with_it(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """The state store's changelog checkpointing (engine.spark_session.spark_conf) on a checkpoint
    whose batches were committed without it (the engine before it): the restart rebuilds the shard
    from that state store and goes on exactly (the scenario's checks), its commits now changelog
    files (``<version>.changelog``) after the first run's zipped ones (``<version>.zip``)."""
    from engine.spark_session import CHANGELOG_CHECKPOINTING

    assert spark.conf.get(CHANGELOG_CHECKPOINTING) == "true"
    # the scenario checks the restart's rebuild from the state store and the exact alert log
    run_sharded_scenario(
        spark, kafka_bootstrap, pg_url, tmp_path, 1, first_conf={CHANGELOG_CHECKPOINTING: "false"}
    )
    state = tmp_path / "ckpt" / "spark" / "state"
    names = [p.name for p in state.rglob("*") if p.is_file()]
    zips = {int(n.split(".")[0]) for n in names if re.fullmatch(r"\d+\.zip", n)}
    logs = {int(n.split(".")[0]) for n in names if re.fullmatch(r"\d+\.changelog", n)}
    assert 1 in zips and 1 not in logs, names  # the first run committed RocksDB's files zipped
    assert logs, names  # the restart commits the batches' changes


def _refused(
    spark: Any, bootstrap: str, pg_url: str, tmp: Path, marker: str, shards: int, match: str
) -> None:
    """An engine of ``shards`` shards on a checkpoint whose ``shards.json`` is ``marker`` (empty:
    none, a checkpoint of the driver's engine) is refused at start with a
    :class:`CheckpointMismatch` matching ``match``."""
    from engine.errors import CheckpointMismatch
    from engine.shards.engine import ShardedEngine

    run = uuid.uuid4().hex[:8]
    db = fresh_database(pg_url)
    (tmp / "ckpt" / "tidewatch").mkdir(parents=True)
    if marker:
        (tmp / "ckpt" / "tidewatch" / "shards.json").write_text(marker)
    else:  # the driver's engine's checkpoint: its batch log, no marker
        (tmp / "ckpt" / "tidewatch" / "batches").mkdir()
    s = engine_settings(run, tmp / "ckpt", engine_shards=shards)
    assert s.engine_shard_input == "panes"
    app = ShardedEngine(s, bootstrap=bootstrap, pg_url=db, engine_id=run)
    try:
        with pytest.raises(CheckpointMismatch, match=match):
            app.start(spark)
    finally:
        app.close()
    if marker:  # nothing written over the checkpoint's marker
        assert (tmp / "ckpt" / "tidewatch" / "shards.json").read_text() == marker


def test_sharded_engine_refuses_another_shard_count(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    _refused(
        spark,
        kafka_bootstrap,
        pg_url,
        tmp_path,
        '{"shards": 2, "input": "panes", "ticks": true}',
        3,
        "holds 2 shards",
    )


def test_sharded_engine_refuses_a_checkpoint_of_the_other_input(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """A checkpoint made before the shards evaluated pane rows (its marker names no input: records)
    is refused on pane rows, with what to do; the shards' states differ between the two."""
    _refused(spark, kafka_bootstrap, pg_url, tmp_path, '{"shards": 1}', 1, "engine_shard_input=records")


def test_sharded_engine_refuses_a_checkpoint_whose_kafka_output_the_driver_produced(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """A checkpoint from before the shards' tasks produced (its marker names no delivery: the
    driver's) is refused when the tasks are to produce: the driver's progress marker and the
    shards' would disagree on what Kafka has; the message names the setting to run with."""
    _refused(
        spark,
        kafka_bootstrap,
        pg_url,
        tmp_path,
        '{"shards": 1, "input": "panes", "ticks": true}',
        1,
        "engine_shard_delivery=driver",
    )


def test_sharded_engine_refuses_a_checkpoint_without_ticks(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """A checkpoint of the query before it read the ticks source (engine.shards.ticks): Spark would
    stop on the changed sources; refused first, with what to do."""
    _refused(spark, kafka_bootstrap, pg_url, tmp_path, '{"shards": 1, "input": "panes"}', 1, "without ticks")


def test_sharded_engine_refuses_a_checkpoint_of_the_drivers_engine(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """The driver's engine's checkpoint (its state in its own snapshots and batch log) is not one
    shards can go on from: refused, naming engine_shards=0; no marker written into it."""
    _refused(spark, kafka_bootstrap, pg_url, tmp_path, "", 1, "made by the driver's engine")
    assert not (tmp_path / "ckpt" / "tidewatch" / "shards.json").exists()


def test_drivers_engine_refuses_a_sharded_checkpoint(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """The other way: the driver's engine on a sharded checkpoint is refused, naming the shard
    count to run with, before it touches the checkpoint."""
    from engine.app import EngineApp
    from engine.errors import CheckpointMismatch

    run = uuid.uuid4().hex[:8]
    db = fresh_database(pg_url)
    (tmp_path / "ckpt" / "tidewatch").mkdir(parents=True)
    (tmp_path / "ckpt" / "tidewatch" / "shards.json").write_text(
        '{"shards": 2, "input": "panes", "ticks": true}'
    )
    app = EngineApp(
        engine_settings(run, tmp_path / "ckpt", engine_shards=0),
        bootstrap=kafka_bootstrap,
        pg_url=db,
        engine_id=run,
    )
    try:
        with pytest.raises(CheckpointMismatch, match="engine_shards=2"):
            app.start(spark)
    finally:
        app.close()
    assert sorted(p.name for p in (tmp_path / "ckpt" / "tidewatch").iterdir()) == ["shards.json"]


def test_a_batch_the_shards_published_and_postgresql_did_not_commit_is_not_published_again(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """ "Kafka per shard, then PostgreSQL" (engine.shards.produce): the driver fails to commit a
    batch whose alerts the shard's task has produced and committed in Kafka -- the query stops,
    as on a crash there.  Started again on its checkpoint, Spark runs that batch again (it was
    never committed in Spark's log), the shard -- rebuilt, not live -- finds its marker past it
    and produces nothing, the driver commits it in PostgreSQL: the alert log equals the backtest
    and Kafka holds each alert once."""
    from engine.shards.engine import ShardedEngine
    from engine.shards.produce import shard_published_up_to
    from engine.sinks.publish import ensure_topics
    from tests.engine.shards.scenario import check_exact, check_kafka
    from tests.engine.shards.support import SHARD_RULES
    from tests.engine.support import G, backtest, make_scenario, produce, produce_rules
    from tests.engine.test_engine_integration import topics_of, wait_for

    run = uuid.uuid4().hex[:8]
    s = engine_settings(run, tmp_path / "ckpt", engine_shards=1)
    db = fresh_database(pg_url)
    ensure_topics(kafka_bootstrap, s)
    sc = make_scenario()
    produce_rules(sc, kafka_bootstrap, s.topic_subscriptions, SHARD_RULES)
    final = (sc.max_ts - s.allowed_lateness_ms) // G * G
    failed: list[int] = []

    app = ShardedEngine(s, bootstrap=kafka_bootstrap, pg_url=db, engine_id=run)
    deliver = app.delivery.deliver

    def fails_once(out: Any, **kw: Any) -> Any:
        if out.alerts and not failed:
            failed.append(out.batch_id)
            raise RuntimeError("the driver stops before PostgreSQL's commit")
        return deliver(out, **kw)

    app.delivery.deliver = fails_once  # type: ignore[method-assign]
    q = app.start(spark, trigger_seconds=0.5, max_offsets_per_trigger=2500)
    try:
        wait_for(lambda: app.rules == len(SHARD_RULES), 180, "every rule to be active")
        produce(sc, kafka_bootstrap, topics_of(s))
        wait_for(lambda: not q.isActive, 180, "the query to stop at the failed delivery")
    finally:
        q.stop()
        app.close()
    assert failed and app.store.last_committed() == failed[0] - 1, (failed, app.store.last_committed())
    # the shard's transaction of that batch committed before the driver failed
    assert shard_published_up_to(s, kafka_bootstrap, run, 0) == failed[0]

    app = ShardedEngine(s, bootstrap=kafka_bootstrap, pg_url=db, engine_id=run)
    q = app.start(spark, trigger_seconds=0.5, max_offsets_per_trigger=2500)
    try:
        wait_for(
            lambda: app.applied_until == final or not q.isActive, 300, f"the shard to look up at {final}"
        )
        assert q.isActive, q.exception()
    finally:
        q.stop()
        app.close()
    assert app.published.get("before") == 1 and app.published.get("published", 0) > 0, app.published
    assert app.rebuilds.get(0, 0) >= 1, app.rebuilds  # the batch run again on the shard rebuilt
    log = app.store.alert_log()
    got = [a for a in log if a[0] in {sc.sub_ids[n] for n in SHARD_RULES}]
    check_exact(got, backtest(sc, SHARD_RULES, final))
    check_kafka(kafka_bootstrap, s, log, sc)
