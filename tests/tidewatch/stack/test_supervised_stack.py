"""The real ``tidewatch up`` with its apps under supervisord: a killed app comes back, ``restart``
gives a new process, ``down`` leaves nothing running.

Runs the ``tidewatch`` command (subprocesses, as a user would) on a temporary run dir and free
ports: PostgreSQL, Kafka, then supervisord with the relay, the Spark engine, the dashboard and the
demo feed.  Needs what ``scripts/setup.sh`` installs (java, PostgreSQL binaries, the Kafka jars).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.services import free_port
from tidewatch.settings import PROJECT_ROOT, Settings, get_settings
from tidewatch.stack import postgres_server as postgres
from tidewatch.stack import processes as process
from tidewatch.stack import supervision

pytestmark = pytest.mark.integration

#: how long supervisord may take to have a SIGKILLed relay RUNNING again (startsecs 3 + Python start)
BACK_WITHIN_S = 30.0


def _tidewatch(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidewatch.cli", *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _tree_pids(s: Settings) -> set[int]:
    """Every process of the run now: the recorded ones (PostgreSQL, Kafka, supervisord) and all
    their descendants (the apps, the engine's Spark JVM, PostgreSQL's backends)."""
    pids = set()
    for rec in process.all_records(s.run_dir):
        proc = process.process_of(rec)
        if proc is not None:
            pids |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
    return pids


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _status_row(output: str, name: str) -> list[str]:
    line = next(ln for ln in output.splitlines() if re.match(rf"^\W*{name}\s", ln))
    # cells apart by rules or (the table has no vertical rules) by two spaces or more
    return [c.strip() for c in re.split(r"[│|]|\s{2,}", line) if c.strip()]


def _kill_until_back(s: Settings, name: str) -> tuple[int, int, float]:
    """SIGKILL app ``name`` (the pid supervisord reports) and wait until supervisord has it
    RUNNING again as a new process: (old pid, new pid, seconds it took)."""
    old = supervision.program_infos(s)[name]["pid"]
    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)
    new = 0
    while time.monotonic() - t0 < BACK_WITHIN_S:
        info = supervision.program_infos(s)[name]
        if info["statename"] == "RUNNING" and info["pid"] != old:
            new = info["pid"]
            break
        time.sleep(0.2)
    back_s = time.monotonic() - t0
    assert new, f"the {name} was not RUNNING again within {BACK_WITHIN_S}s"
    assert not _alive(old) and _alive(new)
    print(f"{name} SIGKILLed (pid {old}), RUNNING again as pid {new} after {back_s:.1f}s")
    return old, new, back_s


def test_up_supervises_the_apps_restart_and_down_leaves_nothing(run_root: Path):
    base = get_settings()
    kp = free_port()
    env = {
        **os.environ,
        "TIDEWATCH_RUN_DIR": str(run_root / "run"),
        "TIDEWATCH_KAFKA_PORT": str(kp),
        "TIDEWATCH_KAFKA_BOOTSTRAP": f"127.0.0.1:{kp}",
        "TIDEWATCH_KAFKA_CONTROLLER_PORT": str(free_port()),
        "TIDEWATCH_PG_PORT": str(free_port()),
        "TIDEWATCH_DASHBOARD_PORT": str(free_port()),
        "COLUMNS": "220",  # rich's tables unfolded
    }
    s = Settings(
        run_dir=run_root / "run",
        cache_dir=base.cache_dir,
        kafka_port=kp,
        kafka_bootstrap=f"127.0.0.1:{kp}",
        kafka_controller_port=int(env["TIDEWATCH_KAFKA_CONTROLLER_PORT"]),
        pg_port=int(env["TIDEWATCH_PG_PORT"]),
        dashboard_port=int(env["TIDEWATCH_DASHBOARD_PORT"]),
    )
    if postgres.find_bin_dir(s) is None:
        pytest.fail("PostgreSQL binaries missing: run scripts/setup.sh")
    seen: set[int] = set()
    try:
        res = _tidewatch(env, "up")
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"Dashboard: http://127.0.0.1:{s.dashboard_port}" in res.stdout
        assert "Stop everything with: tidewatch down" in res.stdout
        sup = supervision.record(s)
        assert sup is not None and process.is_running(sup)
        assert not any(
            c.laddr and c.status == psutil.CONN_LISTEN for c in psutil.Process(sup.pid).net_connections()
        )
        infos = supervision.program_infos(s)
        assert {n: i["statename"] for n, i in infos.items()} == {
            "relay": "RUNNING",
            "engine": "RUNNING",
            "dashboard": "RUNNING",
            "feed": "RUNNING",
        }
        seen |= _tree_pids(s)

        # the relay SIGKILLed: supervisord has it RUNNING again, as a new process
        old, new, back_s = _kill_until_back(s, "relay")
        res = _tidewatch(env, "status")
        assert res.returncode == 0, res.stdout + res.stderr
        row = _status_row(res.stdout, "relay")
        assert row[1:3] == ["RUNNING", str(new)] and row[4] == "1", row  # state, pid, restarts

        # tidewatch restart dashboard: a new dashboard process that answers
        before = supervision.program_infos(s)["dashboard"]["pid"]
        res = _tidewatch(env, "restart", "dashboard")
        assert res.returncode == 0, res.stdout + res.stderr
        after = supervision.program_infos(s)["dashboard"]
        assert after["statename"] == "RUNNING" and after["pid"] != before and not _alive(before)
        assert f"dashboard restarted: pid {before} -> {after['pid']}" in res.stdout
        assert process.port_open("127.0.0.1", s.dashboard_port)
        seen |= _tree_pids(s)
    finally:
        seen |= _tree_pids(s)
        res = _tidewatch(env, "down")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "stopped: feed, dashboard, engine, relay, supervisord, kafka, postgres" in res.stdout
    assert len(seen) > 6
    assert [pid for pid in seen if _alive(pid)] == []
    assert process.all_records(s.run_dir) == [] and not supervision.socket_path(s).exists()
    for port in (s.kafka_port, s.pg_port, s.dashboard_port):
        assert not process.port_open("127.0.0.1", port)
    res = _tidewatch(env, "status")
    assert res.returncode == 1  # nothing runs
