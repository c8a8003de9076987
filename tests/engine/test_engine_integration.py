"""The engine on the real stack (Kafka + PostgreSQL containers, Spark local[2]).

Trades and packets with bad records mixed in, rules subscribed through the ``subscriptions``
topic; the engine's alert log in PostgreSQL must equal ``tidewatch backtest`` on the same good
events at the same lookup times; the alerts read from Kafka with ``read_committed`` must be the
same alerts, once each; every bad record must be in ``dead-letter`` with its reason; a rule
added mid-stream must get its result at once, computed from data that arrived before it.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

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
from tests.services import create_database  # noqa: E402
from tidewatch.settings import Settings  # noqa: E402


def fresh_database(pg_url: str) -> str:
    """A new empty database on the test server, migrated to head; its URL."""
    return create_database(pg_url, "engine_", migrate=True)


def engine_settings(run: str, checkpoint: Path, **extra: Any) -> Settings:
    from tidewatch.settings import get_settings

    return get_settings().model_copy(
        update={
            "topic_trades": f"trades-{run}",
            "topic_packets": f"packets-{run}",
            "topic_subscriptions": f"subscriptions-{run}",
            "topic_alerts": f"alerts-{run}",
            "topic_results": f"results-{run}",
            "topic_dead_letter": f"dead-letter-{run}",
            "allowed_lateness_ms": 20_000,
            "engine_history_ms": 60_000,
            "pane_ms": G,
            "checkpoint_dir": checkpoint,
            "snapshot_every_batches": 3,
            **extra,
        }
    )


def topics_of(s: Settings) -> dict[str, str]:
    return {"trades": s.topic_trades, "packets": s.topic_packets, "subscriptions": s.topic_subscriptions}


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def run_scenario(
    spark: Any, bootstrap: str, pg_url: str, tmp: Path, preaggregate: str = "driver"
) -> set[int]:
    """The scenario on ``spark``; raises on any difference from the backtest.  Returns the process
    ids the executors' pane rows came from (empty in the driver mode)."""
    from engine.algorithms import spares_on
    from engine.app import EngineApp

    run = uuid.uuid4().hex[:8]
    s = engine_settings(run, tmp / "ckpt", engine_preaggregate=preaggregate)
    db = fresh_database(pg_url)
    from engine.sinks.publish import ensure_topics

    ensure_topics(bootstrap, s)
    sc = make_scenario()
    produce_rules(sc, bootstrap, s.topic_subscriptions)
    final = (sc.max_ts - s.allowed_lateness_ms) // G * G
    app = EngineApp(s, bootstrap=bootstrap, pg_url=db, engine_id=run)
    spares_were = spares_on()
    q = app.start(spark, trigger_seconds=0.5, max_offsets_per_trigger=2500)
    assert spares_on(), "the engine makes a growth's columns ahead (its warmer faults them in)"
    try:
        wait_for(lambda: len(app.core.rules) == len(RULES), 120, "every rule to be active")
        produce(sc, bootstrap, topics_of(s))
        wait_for(lambda: app.core.applied_until == final, 240, f"the engine to look up at {final}")
        assert app.batches_done >= 3, "the scenario should span several micro-batches"
        # PSoup: a rule added now is answered within one micro-batch, from data it never saw arrive
        sid = add_rule(sc, bootstrap, s.topic_subscriptions, *LATE_RULE)
        wait_for(lambda: sid in app.core.rules, 60, "the new rule to be active")
        # the core takes a rule in mid-batch, before that batch's output is committed: wait for
        # its alerts in PostgreSQL (the reference below says it has some) before stopping
        wait_for(lambda: any(a[0] == sid for a in app.store.alert_log()), 60, "the new rule's alerts")
    finally:
        q.stop()
        app.close()
    assert spares_on() is spares_were, "close() gives the process its spare switch back"

    if preaggregate == "executors":  # the pane rows came from Spark's Python workers, not the driver
        assert app.executor_pids and os.getpid() not in app.executor_pids, app.executor_pids

    log = app.store.alert_log()
    original = {sc.sub_ids[n] for n in RULES}
    got = [a for a in log if a[0] in original]
    expect = backtest(sc, RULES, final)
    assert len(expect) > 100
    missing, extra = sorted(set(expect) - set(got)), sorted(set(got) - set(expect))
    assert not missing and not extra, (
        f"missing {len(missing)}: {missing[:5]}; extra {len(extra)}: {extra[:5]}"
    )
    assert sorted(got) == expect

    late = [a for a in log if a[0] == sid]
    ref = result_at(backtest(sc, dict([LATE_RULE]), final), final)
    assert ref, "the late rule should have a non-empty result"
    assert {a[1] for a in late} == ref and all(a[2] == "ENTER" and a[3] == final for a in late)

    kafka_alerts = read_topic(bootstrap, s.topic_alerts, "alerts")
    ids = [a["id"] for a in kafka_alerts]
    assert len(ids) == len(set(ids)) == len(log)
    assert set(ids) == {f"{a[0]}|{a[1]}|{a[2]}|{a[3]}" for a in log}

    # alerts carry the values that made them fire, the same in Kafka and PostgreSQL
    counted = [a for a in kafka_alerts if a["subscription_id"] == sc.sub_ids["count"]]
    assert counted
    for a in counted:
        assert (a["values"]["COUNT(*) OVER LAST 10 SECONDS"] > 12) == (a["kind"] == "ENTER"), a
    with create_engine(db).connect() as conn:
        rows = conn.execute(text("SELECT alert_id, values FROM alerts")).all()
    pg_values: dict[str, dict[str, Any]] = {str(r[0]): r[1] for r in rows}
    for a in kafka_alerts:
        vals = {k: None if v is None else float(v) for k, v in pg_values[a["id"]].items()}
        assert vals and a["values"] == vals, a

    dead = read_topic(bootstrap, s.topic_dead_letter, "dead_letter")
    assert sorted(d["reason"] for d in dead) == sorted(r for _, r in sc.bad_trades)
    assert sorted(d["value"] for d in dead) == sorted(v for v, _ in sc.bad_trades)
    assert all(d["source_topic"] == s.topic_trades and d["source_offset"] >= 0 for d in dead)

    with create_engine(db).connect() as conn:
        n_metrics = conn.execute(text("SELECT count(*) FROM engine_metrics")).scalar()
        n_results = conn.execute(text("SELECT count(*) FROM current_results")).scalar()
        per_reason = conn.execute(text("SELECT dead_letters, dead_letter_reasons FROM engine_metrics")).all()
        cpu_rows = conn.execute(text("SELECT batch_id, driver_cpu_ms FROM engine_metrics")).all()
    assert n_metrics == app.batches_done
    # the driver's CPU since the batch before (0013): none for the run's first batch, then each
    cpu = [c for _, c in sorted(cpu_rows)]
    assert cpu[0] is None and all(c is not None and c >= 0 for c in cpu[1:]) and sum(cpu[1:]) > 0
    # the per-reason counts the dashboard reads add up to what reached the dead-letter topic
    summed: dict[str, int] = {}
    for total, reasons in per_reason:
        assert sum(reasons.values()) == (total or 0)
        for r, n in reasons.items():
            summed[r] = summed.get(r, 0) + n
    want: dict[str, int] = {}
    for _, r in sc.bad_trades:
        want[r] = want.get(r, 0) + 1
    assert summed == want
    # each batch's top_alerts: its three subscriptions with the most alerts logged (ties by id)
    with create_engine(db).connect() as conn:
        tops: dict[int, dict[str, int]] = {
            int(b): t for b, t in conn.execute(text("SELECT batch_id, top_alerts FROM engine_metrics"))
        }
        per_sub = conn.execute(
            text(
                "SELECT batch_id, subscription_id::text, count(*) FROM alerts GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2"
            )
        ).all()
    logged: dict[int, dict[str, int]] = {}
    for batch, sid, n in per_sub:
        if len(logged.setdefault(batch, {})) < 3:
            logged[batch][sid] = n
    assert any(tops.values()) and {b: t for b, t in tops.items() if t} == logged
    enter_minus_exit = sum(1 if a[2] == "ENTER" else -1 for a in log)
    assert n_results == enter_minus_exit
    return set(app.executor_pids)


@pytest.mark.parametrize("preaggregate", ["driver", "executors"])
def test_engine_equals_backtest_exactly_once(
    spark: Any, kafka_bootstrap: str, pg_url: str, tmp_path: Path, preaggregate: str
) -> None:
    """Spark's Kafka source gives the backtest's alert log, once each in Kafka, every dead
    letter, and PSoup's late rule -- with the records decoded and pre-aggregated on the driver
    and by Spark's tasks (``engine_preaggregate``)."""
    run_scenario(spark, kafka_bootstrap, pg_url, tmp_path, preaggregate)
