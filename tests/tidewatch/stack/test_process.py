"""PID records and process-tree stopping (tidewatch.stack.processes)."""

from __future__ import annotations

import sys
import time

import psutil

from tidewatch.stack import processes as process

# a parent that starts a child and both sleep: ``stop`` must end the whole tree
_TREE = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"


def test_spawn_records_and_stop_kills_children(tmp_path):
    rec = process.spawn(tmp_path, "tree", [sys.executable, "-c", _TREE], log=tmp_path / "tree.log")
    parent = psutil.Process(rec.pid)
    deadline = time.monotonic() + 10
    while not parent.children() and time.monotonic() < deadline:
        time.sleep(0.05)
    children = parent.children(recursive=True)
    assert children, "the child process did not start"
    assert process.is_running(process.read_record(tmp_path, "tree"))

    assert process.stop(tmp_path, "tree", timeout=5) is True
    for p in [parent, *children]:
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    assert process.read_record(tmp_path, "tree") is None
    assert process.stop(tmp_path, "tree") is False  # nothing recorded any more


def test_stale_record_with_reused_pid_is_not_running(tmp_path):
    me = psutil.Process()
    rec = process.ProcessRecord(name="x", pid=me.pid, create_time=me.create_time() - 1000, argv=["x"])
    process.write_record(tmp_path, rec)
    # same PID, different start time: a recycled PID must never be signalled
    assert process.process_of(rec) is None
    assert process.stop(tmp_path, "x") is False
    assert me.is_running()


def test_a_step_of_the_system_clock_does_not_lose_a_process(tmp_path, monkeypatch):
    """psutil's start time of a running process is its ticks since boot plus the boot time read
    from the wall clock now: a clock step (NTP, a resumed virtual machine) moves it.  The record's
    seconds since boot still name the process, so it is running and ``stop`` ends it."""
    from psutil import _pslinux

    rec = process.spawn(
        tmp_path, "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], log=tmp_path / "l"
    )
    proc = psutil.Process(rec.pid)
    real = _pslinux.boot_time
    monkeypatch.setattr(_pslinux, "boot_time", lambda: real() + 7.0)  # the clock stepped 7 s ahead
    assert abs(psutil.Process(rec.pid).create_time() - rec.create_time) > 6  # the wall-clock start moved
    assert process.is_running(rec)
    assert process.stop(tmp_path, "sleeper", timeout=5) is True
    assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    # a recycled PID still is not taken for the recorded process: neither start time matches
    me = psutil.Process()
    stale = process.ProcessRecord(
        name="x",
        pid=me.pid,
        create_time=me.create_time() - 1000,
        argv=["x"],
        since_boot=process.since_boot(me) - 1000,
    )
    assert process.process_of(stale) is None


def test_wait_until_times_out_and_names_what(tmp_path):
    try:
        process.wait_until(lambda: False, timeout=0.3, interval=0.05, what="the moon")
    except TimeoutError as exc:
        assert "the moon" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("wait_until did not time out")


def test_wait_until_stops_at_startup_failure():
    def dead() -> bool:
        raise process.StartupFailed("died")

    t0 = time.monotonic()
    try:
        process.wait_until(dead, timeout=10, what="x")
    except process.StartupFailed:
        pass
    assert time.monotonic() - t0 < 2


# a parent that stops its own child when asked, and reports whether the child was still there
# to stop: the engine stops its Spark JVM itself (``spark.stop()``) on SIGTERM
_ORDERLY = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
def stop(*_):
    time.sleep(0.3)
    alive = child.poll() is None
    open(sys.argv[1], 'w').write('child alive' if alive else 'child already gone')
    child.terminate(); child.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1] + '.ready', 'w').close()
time.sleep(60)
"""


def test_stop_lets_the_parent_stop_its_own_children_first(tmp_path):
    said = tmp_path / "said.txt"
    rec = process.spawn(
        tmp_path, "orderly", [sys.executable, "-c", _ORDERLY, str(said)], log=tmp_path / "orderly.log"
    )
    parent = psutil.Process(rec.pid)
    deadline = time.monotonic() + 10
    while not (tmp_path / "said.txt.ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the child started and the handler is installed
    child = parent.children()[0]
    assert process.stop(tmp_path, "orderly", timeout=10) is True
    assert said.read_text() == "child alive"  # the child was not signalled behind its parent's back
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_port_holder_names_the_listening_process() -> None:
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert process.port_holder(port) == f"pid {os.getpid()} ({psutil.Process().name()})"
    assert process.port_holder(port) == "an unknown process"  # nobody listens any more


# a server that ignores SIGTERM, as a broker stuck in its controlled shutdown does: it listens on a
# port and says which, then sleeps
_STUBBORN = (
    "import signal, socket, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "open(sys.argv[1], 'w').write(str(s.getsockname()[1])); time.sleep(120)"
)


def test_stop_kills_a_process_that_outlives_its_timeout_and_frees_its_port(tmp_path):
    said = tmp_path / "port.txt"
    rec = process.spawn(
        tmp_path, "stubborn", [sys.executable, "-c", _STUBBORN, str(said)], log=tmp_path / "s.log"
    )
    deadline = time.monotonic() + 10
    while (not said.exists() or not said.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    port = int(said.read_text())
    assert process.port_open("127.0.0.1", port)
    assert process.stop(tmp_path, "stubborn", timeout=0.5) is True
    proc = psutil.Process(rec.pid) if psutil.pid_exists(rec.pid) else None
    assert proc is None or proc.status() == psutil.STATUS_ZOMBIE  # killed, not left running unrecorded
    assert not process.port_open("127.0.0.1", port)  # so a restart on the same port can bind it
