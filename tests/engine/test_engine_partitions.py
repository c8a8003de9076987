"""Partitions added while the engine runs: their records are read, none is late, the alerts exact.

The first half of the scenario (by event time) is produced and processed; the ``trades`` topic
then grows from 2 to 3 partitions (the producer's partitioner sends a third of the symbols to
the new one from then on) and the second half is produced.  Spark's Kafka source picks the
new partition up; the engine -- whose watermark a partition it has not heard from yet holds
back for one batch -- reads every record, dead-letters none as late, and its alert log equals
``tidewatch backtest`` on all the events.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.engine.support import (
    RULES,
    Scenario,
    backtest,
    end_offsets,
    make_scenario,
    produce,
    produce_rules,
    read_everything,
    read_topic,
)
from tests.engine.test_engine_integration import engine_settings, fresh_database, topics_of, wait_for

pytestmark = pytest.mark.integration


def _half(sc: Scenario, lo: int | None, hi: int | None) -> Scenario:
    """The events of ``sc`` with ``lo <= ts < hi`` (no bad records)."""

    def cut(ev: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ts = ev["ts"]
        keep = np.ones(len(ts), bool)
        if lo is not None:
            keep &= ts >= lo
        if hi is not None:
            keep &= ts < hi
        return {k: v[keep] for k, v in ev.items()}

    return replace(sc, trades=cut(sc.trades), packets=cut(sc.packets), bad_trades=[])


def test_a_partition_added_while_running_is_read_and_nothing_is_late(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    from engine.app import EngineApp
    from engine.sinks.publish import ensure_topics

    run = uuid.uuid4().hex[:8]
    s = engine_settings(run, tmp_path / "ckpt")
    db = fresh_database(pg_url)
    ensure_topics(kafka_bootstrap, s)
    sc = make_scenario(n_trades=4000, n_packets=2000, seed=21)
    sc.bad_trades = []
    mid = int(np.median(sc.trades["ts"]))
    produce_rules(sc, kafka_bootstrap, s.topic_subscriptions)
    app = EngineApp(s, bootstrap=kafka_bootstrap, pg_url=db, engine_id=run)
    q = app.start(spark, trigger_seconds=0.3, max_offsets_per_trigger=1500)
    try:
        wait_for(lambda: len(app.core.rules) == len(RULES), 120, "every rule to be active")
        produce(_half(sc, None, mid), kafka_bootstrap, topics_of(s))
        wait_for(lambda: app.core.watermark is not None and app.core.watermark >= mid - 25_000, 180, "half")
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for f in admin.create_partitions([NewPartitions(s.topic_trades, 3)]).values():
            f.result(30)
        produce(_half(sc, mid, None), kafka_bootstrap, topics_of(s))
        want = {t: end_offsets(kafka_bootstrap, t) for t in (s.topic_trades, s.topic_packets)}
        assert len(want[s.topic_trades]) == 3 and want[s.topic_trades][2] > 100
        wait_for(lambda: read_everything(app, want), 180, "every record, the new partition's too")
    finally:
        q.stop()
        app.close()

    assert ("trades", 2) in app.core.part_max
    dead = read_topic(kafka_bootstrap, s.topic_dead_letter, "dead_letter")
    assert not dead, [(d["reason"], d["detail"]) for d in dead[:5]]
    final = app.core.applied_until
    assert final is not None and final > mid
    original = {sc.sub_ids[n] for n in RULES}
    got = sorted(a for a in app.store.alert_log() if a[0] in original)
    expect = backtest(sc, RULES, final)
    assert len(expect) > 50
    assert got == expect
