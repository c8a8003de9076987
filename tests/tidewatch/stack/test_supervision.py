"""supervisord under the stack's apps (tidewatch.stack.supervision), with stand-in programs.

No Kafka, no PostgreSQL: a real supervisord on a temporary run dir runs small Python programs
under the apps' names -- ``relay`` sleeps, ``feed`` fails at once, ``engine`` is never started --
so restarts, FATAL, ``tidewatch status`` / ``restart`` and the stop are checked in seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from tidewatch.settings import Settings, get_settings
from tidewatch.stack import embedded as stack
from tidewatch.stack import processes as process
from tidewatch.stack import supervision

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]
CRASHER = [
    sys.executable,
    "-c",
    "import sys; print('starting', flush=True); print('ValueError: boom at start-up', flush=True); sys.exit(3)",
]


def _programs(s: Settings) -> list[supervision.Program]:
    log = s.run_dir / "logs"
    return [
        supervision.Program("relay", SLEEPER, log / "relay.log", priority=10, startsecs=1, stopwaitsecs=5),
        supervision.Program("engine", SLEEPER, log / "engine.log", priority=20, startsecs=1, stopwaitsecs=5),
        supervision.Program(
            "feed", CRASHER, log / "feed.log", priority=40, startsecs=1, startretries=1, stopwaitsecs=5
        ),
    ]


@pytest.fixture()
def run_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short temporary run dir (a Unix socket path holds at most 107 bytes), also the settings'
    ``run_dir`` of the CLI commands run here."""
    root = Path(tempfile.mkdtemp(prefix="tw-sv-"))
    monkeypatch.setenv("TIDEWATCH_RUN_DIR", str(root / "run"))
    get_settings.cache_clear()
    try:
        yield root / "run"
    finally:
        supervision.shutdown(Settings(run_dir=root / "run"), timeout=10)
        get_settings.cache_clear()
        shutil.rmtree(root, ignore_errors=True)


def _wait(predicate, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_conf_uses_a_unix_socket_in_the_run_dir_and_no_tcp_port(tmp_path):
    s = Settings(run_dir=tmp_path / "r%n")
    conf = supervision.render_conf(s, _programs(s))
    assert "[unix_http_server]" in conf and "inet_http_server" not in conf
    assert f"file={tmp_path}/r%%n/supervisor.sock" in conf and "chmod=0700" in conf
    relay = conf[conf.index("[program:relay]") :].split("\n\n")[0]
    for line in ("autostart=false", "autorestart=true", "startsecs=1", "startretries=3", "stopwaitsecs=5"):
        assert line in relay.splitlines()
    assert "stopasgroup=true" in relay and "killasgroup=true" in relay
    assert f"stdout_logfile={tmp_path}/r%%n/logs/relay.log" in relay
    with pytest.raises(supervision.SupervisionError):
        supervision.render_conf(s, [supervision.Program("x", ["a\nb"], tmp_path / "x.log", priority=1)])


def test_the_apps_programs_run_through_app_exec_in_start_order():
    s = Settings()
    progs = stack.programs(s, stack.APPS)
    assert [p.name for p in progs] == [a.name for a in stack.APPS]
    assert [p.priority for p in progs] == sorted(p.priority for p in progs)
    assert all(p.argv[1:3] == ["-m", "tidewatch.stack.app_exec"] for p in progs)
    # the engine alone gets SIGTERM, so it can stop its own Spark JVM first
    assert [p.name for p in progs if not p.stopasgroup] == ["engine"]
    assert {a.value for a in stack.AppName} == set(stack.APP_NAMES)


def test_supervisord_restarts_a_killed_program_and_a_crash_loop_ends_fatal(run_dir):
    s = Settings(run_dir=run_dir)
    rec = supervision.start(s, _programs(s))
    assert process.read_record(run_dir, supervision.NAME) == rec and supervision.is_up(s)
    assert oct(supervision.socket_path(s).stat().st_mode & 0o777) == "0o700"

    first = supervision.start_program(s, "relay", timeout=20)["pid"]
    assert first and psutil.Process(first).ppid() == rec.pid
    os.kill(first, signal.SIGKILL)
    info = _wait(
        lambda: (
            (i := supervision.program_infos(s)["relay"])["statename"] == "RUNNING" and i["pid"] != first and i
        )
    )
    second = info["pid"]
    assert _gone(first) and psutil.Process(second).is_running()

    with pytest.raises(supervision.ProgramFailed):
        supervision.start_program(s, "feed", timeout=30)
    assert supervision.program_infos(s)["feed"]["statename"] == "FATAL"
    assert supervision.spawn_counts(s) == {"relay": 2, "feed": 2}  # startretries=1: two tries

    rows = {r["name"]: r for r in stack.status_rows(s)}
    assert rows["supervisord"]["state"] == "running" and rows["supervisord"]["ok"] == "yes"
    assert rows["relay"]["state"] == "RUNNING" and rows["relay"]["pid"] == str(second)
    assert rows["relay"]["restarts"] == "1" and rows["relay"]["ok"] == "yes"
    assert rows["feed"]["state"] == "FATAL" and rows["feed"]["ok"] == "no"
    assert rows["feed"]["error"] == "ValueError: boom at start-up"
    assert rows["feed"]["log"] == str(run_dir / "logs" / "feed.log")
    assert rows["engine"]["state"] == "STOPPED (not started)" and rows["engine"]["ok"] == "yes"
    assert rows["dashboard"]["state"] == "stopped"  # not one of this supervisord's programs

    from tidewatch.cli import app

    res = CliRunner().invoke(app, ["status"], env={"COLUMNS": "200"})
    assert res.exit_code == 1, res.output
    line = next(ln for ln in res.output.splitlines() if "feed is FATAL" in ln)  # (supervisord's reason)
    assert line.endswith("; log: " + str(run_dir / "logs" / "feed.log"))
    assert "last error: ValueError: boom at start-up" in res.output

    res = CliRunner().invoke(app, ["restart", "relay"])
    assert res.exit_code == 0, res.output
    third = supervision.program_infos(s)["relay"]["pid"]
    assert f"relay restarted: pid {second} -> {third}" in res.output and _gone(second)

    res = CliRunner().invoke(app, ["restart", "nosuchapp"])
    assert res.exit_code == 2  # not one of the choices

    stopped = stack.stop_all(s)
    assert stopped == ["relay", "supervisord"]
    assert _gone(rec.pid) and _gone(third)
    assert process.all_records(run_dir) == [] and not supervision.socket_path(s).exists()
    assert supervision.program_infos(s) == {} and not supervision.is_up(s)


def test_status_without_supervisord_and_restart_says_it_is_not_up(run_dir):
    from tidewatch.cli import app

    rows = {r["name"]: r for r in stack.status_rows(Settings(run_dir=run_dir))}
    assert rows["supervisord"]["state"] == "stopped" and rows["supervisord"]["ok"] == "yes"
    assert rows["kafka"]["ok"] == "no"  # nothing runs: status exits 1
    res = CliRunner().invoke(app, ["restart", "dashboard"])
    assert res.exit_code == 1 and "supervisord is not running" in res.output

    # a supervisord that died (its PID file left): status says so, with its log's last line
    s = Settings(run_dir=run_dir)
    print_and_exit = [sys.executable, "-c", "print('INFO supervisord started with pid 1', flush=True)"]
    rec = process.spawn(run_dir, supervision.NAME, print_and_exit, log=supervision.log_path(s))
    _wait(lambda: _gone(rec.pid))
    rows = {r["name"]: r for r in stack.status_rows(s)}
    assert rows["supervisord"]["state"] == "dead (stale pid file)" and rows["supervisord"]["ok"] == "no"
    assert rows["supervisord"]["last"] == "INFO supervisord started with pid 1"
    assert rows["supervisord"]["error"] == ""
    assert all(rows[a]["state"] == "stopped" for a in stack.APP_NAMES)
    res = CliRunner().invoke(app, ["status"], env={"COLUMNS": "200"})
    assert res.exit_code == 1 and "last log line: INFO supervisord started with pid 1" in res.output


# a parent that starts a child which asks to be killed when its parent dies (as app_exec does
# before it becomes the app), and would otherwise sleep on
_ORPHAN = """
import subprocess, sys
child = '''
import os, sys, time
from tidewatch.stack.app_exec import _die_with_parent
_die_with_parent(os.getppid())
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
'''
subprocess.Popen([sys.executable, "-c", child, sys.argv[1]])
import time; time.sleep(60)
"""


def test_an_app_is_killed_when_its_supervisor_is_killed(tmp_path):
    rec = process.spawn(
        tmp_path, "parent", [sys.executable, "-c", _ORPHAN, str(tmp_path / "c")], log=tmp_path / "p.log"
    )
    try:
        _wait(lambda: (tmp_path / "c.ready").exists())
        child = psutil.Process(rec.pid).children()[0]
        os.kill(rec.pid, signal.SIGKILL)
        _wait(lambda: _gone(child.pid), timeout=10)
    finally:
        process.stop(tmp_path, "parent", timeout=2)
