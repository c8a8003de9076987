"""Spark's checkpoint and the engine's state disagree: the engine carries on exactly.

Two ways an operator makes them disagree (issue: a restart on an older checkpoint skipped 563
batches of live trades as "already in the state"): Spark's checkpoint rolled back to an older
copy, and Spark's checkpoint deleted -- each while the engine is stopped, with new events and a
new subscription arriving meanwhile.  Each time the engine moves the stale checkpoint aside and
starts a new one at the state's end offsets: the alert log equals ``tidewatch backtest`` on all
the events, the subscription made meanwhile is applied, every alert is in Kafka once.  The
second time the newest state snapshot is damaged too: it is refused by its checksum and the
state is rebuilt by replay, the alert log unchanged.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.engine.support import (
    LATE_RULE,
    RULES,
    add_rule,
    backtest,
    end_offsets,
    make_scenario,
    produce,
    produce_rules,
    read_everything,
    read_topic,
    result_at,
)
from tests.engine.test_engine_integration import engine_settings, fresh_database, topics_of, wait_for
from tests.engine.test_engine_partitions import _half

pytestmark = pytest.mark.integration


def test_a_rolled_back_or_deleted_spark_checkpoint_is_replaced_and_nothing_is_skipped(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    from engine.app import EngineApp
    from engine.sinks.publish import ensure_topics

    run = uuid.uuid4().hex[:8]
    ckpt = tmp_path / "ckpt"
    s = engine_settings(run, ckpt)
    db = fresh_database(pg_url)
    ensure_topics(kafka_bootstrap, s)
    sc = make_scenario(n_trades=4500, n_packets=1500, seed=5)
    sc.bad_trades = []
    cuts = [int(np.quantile(sc.trades["ts"], q)) for q in (1 / 3, 2 / 3)]
    parts = [_half(sc, None, cuts[0]), _half(sc, cuts[0], cuts[1]), _half(sc, cuts[1], None)]
    produce_rules(sc, kafka_bootstrap, s.topic_subscriptions)
    spark_dir = ckpt / "spark"

    def run_until_all_read(max_offsets: int, before: Any = None) -> EngineApp:
        app = EngineApp(s, bootstrap=kafka_bootstrap, pg_url=db, engine_id=run)
        q = app.start(spark, trigger_seconds=0.2, max_offsets_per_trigger=max_offsets)
        try:
            if before is not None:
                before(app)
            topics = (s.topic_trades, s.topic_packets, s.topic_subscriptions)
            want = {t: end_offsets(kafka_bootstrap, t) for t in topics}
            wait_for(lambda: read_everything(app, want), 180, "every record")
            assert q.exception() is None
        finally:
            q.stop()
            app.close()
        return app

    def first(app: EngineApp) -> None:
        wait_for(lambda: len(app.core.rules) == len(RULES), 120, "every rule to be active")
        produce(parts[0], kafka_bootstrap, topics_of(s))

    app = run_until_all_read(400, first)
    last = app.core.last_batch
    assert last >= 4, "the first part should span several batches"

    # 1. Spark's checkpoint rolled back three batches (an older backup); meanwhile a new
    # subscription and the second part of the events
    for sub in ("offsets", "commits"):
        for f in (spark_dir / sub).iterdir():
            name = f.name.removeprefix(".").removesuffix(".crc")  # N and its checksum .N.crc
            if name.isdigit() and int(name) > last - 3:
                f.unlink()
    sid = add_rule(sc, kafka_bootstrap, s.topic_subscriptions, *LATE_RULE)
    produce(parts[1], kafka_bootstrap, topics_of(s))
    app = run_until_all_read(1000)
    assert sid in app.core.rules
    assert len(list(tmp_path.joinpath("ckpt").glob("spark.discarded-*"))) == 1

    # 2. Spark's checkpoint deleted, and the newest state snapshot damaged; meanwhile the last
    # part: the engine rebuilds its state from an older snapshot or Kafka (SnapshotUnreadable)
    shutil.rmtree(spark_dir)
    snaps = sorted((ckpt / "tidewatch" / "snapshots").glob("*.bin"))
    assert snaps
    data = bytearray(snaps[-1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    snaps[-1].write_bytes(bytes(data))
    produce(parts[2], kafka_bootstrap, topics_of(s))
    app = run_until_all_read(1000)
    assert len(list(tmp_path.joinpath("ckpt").glob("spark.discarded-*"))) == 1  # nothing to move

    final = app.core.applied_until
    assert final is not None and final > cuts[1]
    log = app.store.alert_log()
    original = {sc.sub_ids[n] for n in RULES}
    assert sorted(a for a in log if a[0] in original) == backtest(sc, RULES, final)
    # the subscription made while the engine was stopped: its result at once (PSoup), then exact
    late = sorted(a for a in log if a[0] == sid)
    t0 = late[0][3]
    ref = backtest(sc, dict([LATE_RULE]), final)
    at_t0 = result_at(ref, t0)
    assert {a[1] for a in late if a[3] == t0} == at_t0 and all(a[2] == "ENTER" for a in late if a[3] == t0)
    assert [a for a in late if a[3] > t0] == [a for a in ref if a[3] > t0]
    ids = [a["id"] for a in read_topic(kafka_bootstrap, s.topic_alerts, "alerts")]
    assert len(ids) == len(set(ids)) == len(log)
    assert not read_topic(kafka_bootstrap, s.topic_dead_letter, "dead_letter")
