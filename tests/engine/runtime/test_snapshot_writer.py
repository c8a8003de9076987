"""engine.runtime.snapshot_writer: the state snapshot written by a forked child while the batches go on."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import threading
import time
from pathlib import Path

import pytest

from engine.runtime.snapshot_writer import SnapshotWriter, atomic_write, remove_stale_temporaries

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def test_the_child_writes_the_state_as_it_was_at_the_fork(tmp_path: Path) -> None:
    state = {"batch": 7, "values": list(range(100_000))}
    w = SnapshotWriter()
    path = tmp_path / "000000000007.bin"
    assert w.write(7, path, lambda: (time.sleep(0.3), pickle.dumps(state))[1])
    # the parent goes on at once and changes the state while the child writes
    state["batch"] = 8
    state["values"].append(-1)
    assert w.busy
    w.wait()
    assert pickle.loads(path.read_bytes()) == {"batch": 7, "values": list(range(100_000))}
    assert [(b, p) for b, p, _, _ in w.written] == [(7, path)]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_snapshot_due_while_one_is_written_is_skipped(tmp_path: Path) -> None:
    w = SnapshotWriter()
    assert w.write(1, tmp_path / "000000000001.bin", lambda: (time.sleep(1.0), b"one")[1])
    assert not w.write(2, tmp_path / "000000000002.bin", lambda: b"two")
    assert w.skipped == 1
    w.wait()
    assert w.write(3, tmp_path / "000000000003.bin", lambda: b"three")
    w.wait()
    assert sorted(p.name for p in tmp_path.glob("*.bin")) == ["000000000001.bin", "000000000003.bin"]


def test_a_failing_child_is_logged_and_the_next_snapshot_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> bytes:
        raise RuntimeError("boom")

    w = SnapshotWriter()
    with caplog.at_level(logging.WARNING, "tidewatch.engine"):
        w.write(1, tmp_path / "000000000001.bin", broken)
        w.wait()
    assert "state snapshot of batch 1 failed" in caplog.text
    assert not w.written and not list(tmp_path.iterdir())
    assert w.write(2, tmp_path / "000000000002.bin", lambda: b"ok")
    w.wait()
    assert (tmp_path / "000000000002.bin").read_bytes() == b"ok"


def test_a_stuck_child_is_killed_after_the_timeout(tmp_path: Path) -> None:
    w = SnapshotWriter(timeout_s=0.5)
    w.write(1, tmp_path / "000000000001.bin", lambda: (time.sleep(60), b"late")[1])
    t0 = time.monotonic()
    while w.busy and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert not w.busy and time.monotonic() - t0 < 5
    assert not w.written and not (tmp_path / "000000000001.bin").exists()


def test_in_the_calling_thread_when_asked(tmp_path: Path) -> None:
    w = SnapshotWriter(in_child=False)
    pid_seen: list[int] = []
    assert w.write(4, tmp_path / "000000000004.bin", lambda: (pid_seen.append(os.getpid()), b"x")[1])
    assert pid_seen == [os.getpid()] and not w.busy
    assert (tmp_path / "000000000004.bin").read_bytes() == b"x"


def test_keeps_the_newest_three(tmp_path: Path) -> None:
    w = SnapshotWriter()
    for b in range(1, 6):
        w.write(b, tmp_path / f"{b:012d}.bin", lambda b=b: str(b).encode())
        w.wait()
    assert sorted(int(p.stem) for p in tmp_path.glob("*.bin")) == [3, 4, 5]


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a pid that is gone
    dead = tmp_path / f"000000000001.bin.{pid}.tmp"
    live = tmp_path / f"000000000002.bin.{os.getpid()}.tmp"
    odd = tmp_path / "000000000003.bin.tmp"
    for f in (dead, live, odd):
        f.write_bytes(b"half")
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted([dead, odd])
    assert live.exists()


def test_atomic_write_leaves_no_temporary(tmp_path: Path) -> None:
    atomic_write(tmp_path / "sub" / "a.json", b"{}")
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["a.json"]


class _ClosesItsSocket:
    """Like py4j's connection to the JVM: shuts its socket down when it is freed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


def test_the_child_leaves_the_parents_connections_open(tmp_path: Path) -> None:
    """At the fork CPython clears the thread states of the threads the child lacks; what they
    held alone (here, as in py4j, in a thread-local) is freed and its finalizer shuts the
    socket down -- which would end the connection for the parent too."""
    ours, theirs = socket.socketpair()
    local = threading.local()
    ready, done = threading.Event(), threading.Event()

    def holder() -> None:
        local.conn = _ClosesItsSocket(ours)  # only this thread's thread-local holds it
        ready.set()
        done.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    ready.wait(10)
    try:
        w = SnapshotWriter()
        w.write(1, tmp_path / "000000000001.bin", lambda: b"state")
        w.wait()
        assert (tmp_path / "000000000001.bin").read_bytes() == b"state"
        ours.sendall(b"still open")  # the parent's connection works in both directions
        assert theirs.recv(100) == b"still open"
        theirs.sendall(b"both ways")
        assert ours.recv(100) == b"both ways"
    finally:
        done.set()
        t.join()
        ours.close()
        theirs.close()
