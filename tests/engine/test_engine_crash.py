"""Crash test: SIGKILL the engine (``tidewatch engine run``, its own process group) at random
moments while it works through a replay, restart it each time; the final alert log in
PostgreSQL and the alerts read from Kafka with ``read_committed`` equal those of an
uninterrupted run (the backtest on the same events): nothing lost, nothing doubled.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from tests.engine.support import (
    RULES,
    G,
    backtest,
    engine_env,
    kill_engine,
    make_scenario,
    produce,
    produce_rules,
    progress,
    read_topic,
    restarts_logged,
    start_engine,
)
from tests.engine.test_engine_integration import engine_settings, fresh_database, topics_of, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLS = int(os.environ.get("TIDEWATCH_TEST_KILLS", "3"))


@pytest.mark.parametrize("preaggregate", ["driver", "executors", "shards"])
def test_sigkill_and_restart_gives_the_uninterrupted_alert_log(
    kafka_bootstrap: str, pg_url: str, tmp_path: Path, preaggregate: str
) -> None:
    """Spark's Kafka source: Spark's checkpoint says where to resume, the engine's offset logs
    and snapshots rebuild the state (``engine_preaggregate``: the replay runs the executors'
    function in process).  ``shards``: one shard (``engine_shards`` = 1), its state in Spark's
    state store, its task producing its Kafka output (engine.shards.produce): a kill between a
    shard's Kafka commit and the driver's PostgreSQL commit makes the restart run the batch
    again, which the shard's marker finds published."""
    run = uuid.uuid4().hex[:8]
    shards = int(preaggregate == "shards")
    s = engine_settings(run, tmp_path / "ckpt", engine_shards=shards)
    db = fresh_database(pg_url)
    from engine.sinks.publish import ensure_topics

    ensure_topics(kafka_bootstrap, s)
    # about 45 micro-batches of events for every three kills (each kill waits for three batches,
    # then up to 0.8 s: a longer wait could reach the end of the events before the last kill)
    scale = max(1, -(-KILLS // 3))
    sc = make_scenario(n_trades=12000 * scale, n_packets=6000 * scale, seed=11)
    produce_rules(sc, kafka_bootstrap, s.topic_subscriptions)
    env = engine_env(s, kafka_bootstrap, db)
    env["TIDEWATCH_ENGINE_SHARDS"] = str(shards)
    if not shards:
        env["TIDEWATCH_ENGINE_PREAGGREGATE"] = preaggregate
    log = tmp_path / "engine.log"
    final = (sc.max_ts - s.allowed_lateness_ms) // G * G
    rng = random.Random(7)
    proc = start_engine(env, log, run)
    try:
        wait_for(lambda: progress(db)[0] >= 1, 180, "the engine's first batch (the rules)")
        produce(sc, kafka_bootstrap, topics_of(s))
        for _ in range(KILLS):
            seen = progress(db)[0]
            wait_for(lambda seen=seen: progress(db)[0] > seen + 2, 240, "three committed batches")
            time.sleep(rng.uniform(0.0, 0.8))
            kill_engine(proc)
            proc = start_engine(env, log, run)
        wait_for(lambda: (progress(db)[1] or 0) // G * G == final, 300, f"the engine to reach {final}")
    finally:
        kill_engine(proc, signal.SIGTERM if proc.poll() is None else signal.SIGKILL)

    from engine.sinks.store import Store

    store = Store(create_engine(db))
    got = store.alert_log()
    expect = backtest(sc, RULES, final)
    missing, extra = sorted(set(expect) - set(got)), sorted(set(got) - set(expect))
    if missing or extra:
        import json

        names = {v: k for k, v in sc.sub_ids.items()}
        (tmp_path / "diff.json").write_text(
            json.dumps(
                {
                    "missing": [(names[a[0]], *a[1:]) for a in missing],
                    "extra": [(names[a[0]], *a[1:]) for a in extra],
                    "first_alert": min(got)[3] if got else None,
                    "first_expected": min(e[3] for e in expect),
                }
            )
        )
    tail = log.read_text(errors="replace")[-3000:]
    assert not missing and not extra, f"missing {missing[:5]}, extra {extra[:5]}\n{tail}"
    assert sorted(got) == expect
    ids = [a["id"] for a in read_topic(kafka_bootstrap, s.topic_alerts, "alerts")]
    assert len(ids) == len(set(ids)), "an alert was published twice"
    assert set(ids) == {f"{a[0]}|{a[1]}|{a[2]}|{a[3]}" for a in got}
    text_log = log.read_text(errors="replace")
    assert restarts_logged(text_log) >= KILLS
    if s.engine_shards == 0:  # the driver's engine (with shards the routing tasks pre-aggregate)
        assert (text_log.count("engine_preaggregate = executors") > KILLS) == (preaggregate == "executors")
