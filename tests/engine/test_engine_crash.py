"""Crash test: SIGKILL the engine (``tidewatch engine run``, its own process group) at random
moments while it works through a replay, restart it each time; the final alert log in
PostgreSQL and the alerts read from Kafka with ``read_committed`` equal those of an
uninterrupted run (the backtest on the same events): nothing lost, nothing doubled.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from test_engine_integration import engine_settings, fresh_database, topics_of, wait_for  # noqa: I001
from tests_engine_support import RULES, G, backtest, make_scenario, produce, produce_rules, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLS = int(os.environ.get("TIDEWATCH_TEST_KILLS", "3"))


def _env(s: Any, bootstrap: str, db: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "TIDEWATCH_KAFKA_BOOTSTRAP": bootstrap,
            "TIDEWATCH_DATABASE_URL": db,
            "TIDEWATCH_TOPIC_TRADES": s.topic_trades,
            "TIDEWATCH_TOPIC_PACKETS": s.topic_packets,
            "TIDEWATCH_TOPIC_SUBSCRIPTIONS": s.topic_subscriptions,
            "TIDEWATCH_TOPIC_ALERTS": s.topic_alerts,
            "TIDEWATCH_TOPIC_RESULTS": s.topic_results,
            "TIDEWATCH_TOPIC_DEAD_LETTER": s.topic_dead_letter,
            "TIDEWATCH_ALLOWED_LATENESS_MS": str(s.allowed_lateness_ms),
            "TIDEWATCH_ENGINE_HISTORY_MS": str(s.engine_history_ms),
            "TIDEWATCH_SNAPSHOT_EVERY_BATCHES": "2",
            "TIDEWATCH_ENGINE_MAX_OFFSETS_PER_TRIGGER": "400",
            "TIDEWATCH_TRIGGER_SECONDS": "0.2",
            "TIDEWATCH_CHECKPOINT_DIR": str(s.checkpoint_dir),
            "TIDEWATCH_SPARK_MASTER": "local[2]",
        }
    )
    return env


def _start(env: dict[str, str], log: Path, run: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tidewatch.cli", "engine", "run", "--engine-id", run]
    return subprocess.Popen(
        cmd, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def _progress(db: str) -> tuple[int, int | None]:
    with create_engine(db).connect() as conn:
        n, wm = conn.execute(text("SELECT count(*), max(watermark) FROM engine_batches")).one()
    return int(n), None if wm is None else round(wm.timestamp() * 1000)


def test_sigkill_and_restart_gives_the_uninterrupted_alert_log(
    kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    s = engine_settings(run, tmp_path / "ckpt")
    db = fresh_database(pg_url)
    from engine.publish import ensure_topics

    ensure_topics(kafka_bootstrap, s)
    sc = make_scenario(n_trades=8000, n_packets=4000, seed=11)
    produce_rules(sc, kafka_bootstrap, s.topic_subscriptions)
    env = _env(s, kafka_bootstrap, db)
    log = tmp_path / "engine.log"
    final = (sc.max_ts - s.allowed_lateness_ms) // G * G
    rng = random.Random(7)
    proc = _start(env, log, run)
    try:
        wait_for(lambda: _progress(db)[0] >= 1, 180, "the engine's first batch (the rules)")
        produce(sc, kafka_bootstrap, topics_of(s))
        for _ in range(KILLS):
            seen = _progress(db)[0]
            wait_for(lambda seen=seen: _progress(db)[0] > seen + 2, 240, "three committed batches")
            time.sleep(rng.uniform(0.0, 2.5))
            _kill(proc)
            proc = _start(env, log, run)
        wait_for(lambda: (_progress(db)[1] or 0) // G * G == final, 300, f"the engine to reach {final}")
    finally:
        _kill(proc, signal.SIGTERM if proc.poll() is None else signal.SIGKILL)

    from engine.store import Store

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
    assert text_log.count("replaying batches") + text_log.count("restored the state snapshot") >= KILLS
