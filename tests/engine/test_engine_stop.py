"""The engine's clean stop and its recorded exit (issue #21).

* ``tidewatch engine run`` (a subprocess, Spark ``local[2]``) stopped by SIGTERM mid-stream --
  how supervisord stops it -- exits 0, its log without a Python traceback or py4j's
  ``SPARK_JOB_CANCELLED`` stack traces, and records the stop (:mod:`engine.liveness`).
* Started with a bad configuration (a wrong database password) it exits 1 with the cause
  recorded; the dashboard's Health (:func:`dashboard.queries.health`) shows it in the "down"
  banner with a hint, and ``tidewatch status``'s rule (:func:`engine.liveness.verdict`, the same
  one) says the same.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.engine.support import (
    engine_env,
    kill_engine,
    make_scenario,
    produce,
    produce_rules,
    progress,
    start_engine,
)
from tests.engine.test_engine_integration import engine_settings, fresh_database, topics_of, wait_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_mid_stream_is_clean(kafka_bootstrap: str, pg_url: str, tmp_path: Path, sig: int) -> None:
    """SIGTERM (supervisord, to the CLI alone) or SIGINT (Ctrl-C; PySpark's JVM ignores it) while
    batches are being processed: exit 0, no traceback, the stop recorded."""
    from engine.sinks.publish import ensure_topics

    run = uuid.uuid4().hex[:8]
    s = engine_settings(run, tmp_path / "ckpt")
    db = fresh_database(pg_url)
    ensure_topics(kafka_bootstrap, s)
    sc = make_scenario(n_trades=40_000, n_packets=0, seed=5)
    produce_rules(sc, kafka_bootstrap, s.topic_subscriptions)
    produce(sc, kafka_bootstrap, topics_of(s))
    env = engine_env(s, kafka_bootstrap, db) | {"TIDEWATCH_RUN_DIR": str(tmp_path / "run")}
    env["TIDEWATCH_ENGINE_MAX_OFFSETS_PER_TRIGGER"] = "2000"
    elog = tmp_path / "engine.log"
    proc = start_engine(env, elog, run)
    try:
        wait_for(lambda: progress(db)[0] >= 3, 180, "three committed batches")
        assert proc.poll() is None, elog.read_text()[-3000:]
        done_before = progress(db)[0]
        proc.send_signal(sig)  # the CLI alone, as supervisord does (stopasgroup=false)
        rc = proc.wait(timeout=120)
    finally:
        kill_engine(proc)
    text = elog.read_text(errors="replace")
    print(f"\n{done_before} batches before {signal.Signals(sig).name}; log {len(text.splitlines())} lines")
    assert rc == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "SPARK_JOB_CANCELLED" not in text, text[-3000:]
    assert "Exception" not in text, text[-3000:]  # no Java stack trace either (an interrupted write)
    assert "engine stopped:" in text
    from engine.liveness import read_record

    rec = read_record(s.model_copy(update={"run_dir": tmp_path / "run"}), run)
    assert rec is not None and rec.kind == "stopped"


def test_bad_configuration_health_and_status_give_the_cause(
    kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    """The issue's proof: the engine killed by a bad configuration (a wrong database password)
    exits 1 with its error recorded; Health shows the cause and the hint in its "down" banner;
    ``tidewatch status`` (the real CLI) says the same and exits 1."""
    from sqlalchemy.orm import sessionmaker

    from dashboard import queries
    from engine import liveness
    from tidewatch.db.session import make_db_engine

    run = uuid.uuid4().hex[:8]
    run_dir = tmp_path / "run"
    s = engine_settings(run, tmp_path / "ckpt").model_copy(update={"run_dir": run_dir})
    db = fresh_database(pg_url)
    bad = make_url(db).set(password="not-the-password").render_as_string(hide_password=False)
    env = engine_env(s, kafka_bootstrap, bad) | {"TIDEWATCH_RUN_DIR": str(run_dir)}
    elog = tmp_path / "engine.log"
    proc = start_engine(env, elog, run)
    try:
        rc = proc.wait(timeout=240)
    finally:
        kill_engine(proc)
    text = elog.read_text(errors="replace")
    assert rc == 1, text[-3000:]
    assert "not-the-password" not in text  # the URL's password is never written out
    rec = liveness.read_record(s, run)
    assert rec is not None and rec.kind == "failed", text[-3000:]
    assert rec.error_type == "OperationalError" and "password authentication failed" in rec.message
    assert "database_url" in rec.hint and "tidewatch restart engine" in rec.hint
    assert f"hint: {rec.hint}" in text  # the log says it too

    good = s.model_copy(update={"database_url": db})
    eng = make_db_engine(db)
    try:
        h = queries.health(sessionmaker(bind=eng), good)
    finally:
        eng.dispose()
    assert h.status == "down"
    assert rec.failure in h.banner and rec.hint in h.banner
    assert h.banner.startswith("The engine is down: it stopped on an error at ")

    v = liveness.check(good)  # the rule `tidewatch status` applies
    assert (v.status, v.text) == (h.status, h.banner)
    senv = env | {"TIDEWATCH_DATABASE_URL": db, "COLUMNS": "400"}
    res = subprocess.run(
        [sys.executable, "-m", "tidewatch.cli", "status"],
        env=senv,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    said = f"engine health (down): {h.banner}"
    assert " ".join(said.split()) in " ".join(res.stdout.split()), res.stdout  # rich wraps lines
    rows = [ln.split() for ln in res.stdout.splitlines()]
    row = next(r for r in rows if r[:1] == ["engine"] and len(r) == 7)  # the table's 7 columns
    assert row[-1] == "down", row  # the table's last column: health
