"""engine.runtime.snapshot_writer with ``fork=True``: the snapshot serialized and written by a
forked child from the copy-on-write image of the state, while the parent goes on; a child that
fails, hangs or outlives its parent."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from engine.runtime.snapshot_writer import SnapshotWriter

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def test_the_state_at_the_fork_is_written_whatever_the_parent_does_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.engine.runtime import test_state_capture as capture_tests
    from tests.engine.runtime import test_state_codec as codec_tests

    monkeypatch.setattr(zipfile, "time", capture_tests._FIXED_TIME)
    core, _ = capture_tests._core_state(panes=True)
    before = core.to_bytes()
    w = SnapshotWriter(fork=True)
    path = tmp_path / "000000000009.bin"
    assert w.write(9, path, core.capture)
    codec_tests._alerts(core, codec_tests._batches(seed=5)[10:14], 10)  # meanwhile, the next batches
    w.wait()
    assert path.read_bytes() == before and core.to_bytes() != before
    assert [(b, p, n) for b, p, n, _ in w.written] == [(9, path, len(before))]
    assert w.failed == 0 and not list(tmp_path.glob("*.tmp"))


def test_the_caller_waits_for_the_fork_only(tmp_path: Path) -> None:
    def slow(*, private_image: bool = False) -> bytes:
        time.sleep(1.0)
        return f"{os.getpid()} {os.nice(0)} {private_image}".encode()

    w = SnapshotWriter(fork=True)
    path = tmp_path / "000000000001.bin"
    t0 = time.perf_counter()
    assert w.write(1, path, slow)
    assert time.perf_counter() - t0 < 0.6
    assert w.busy and not path.exists()
    assert not w.write(2, tmp_path / "000000000002.bin", slow) and w.skipped == 1  # one in flight
    w.wait()
    pid, niceness, private = path.read_bytes().split()
    assert int(pid) != os.getpid()  # serialized by another process, at a lower priority
    assert int(niceness) == min(19, os.nice(0) + 10)
    assert private == b"True"  # its image of the state never changes: captured without copies
    ((_, forked_s, busy_s),) = w.timings
    assert forked_s < 0.6 and busy_s >= 1.0


def test_a_child_that_cannot_capture_is_logged_and_the_next_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*, private_image: bool = False) -> bytes:
        raise RuntimeError("boom")

    w = SnapshotWriter(fork=True)
    with caplog.at_level(logging.WARNING, "tidewatch.engine"):
        assert w.write(1, tmp_path / "000000000001.bin", broken)
        w.wait()
    assert (
        "state snapshot of batch 1 failed: the state could not be captured or finished (RuntimeError: boom)"
        in (caplog.text)
    )
    assert w.failed == 1 and not w.written and not list(tmp_path.iterdir())
    assert w.write(2, tmp_path / "000000000002.bin", lambda private_image=False: b"ok")
    w.wait()
    assert (tmp_path / "000000000002.bin").read_bytes() == b"ok" and w.fork


def test_a_child_that_hangs_is_killed_and_snapshots_go_on_from_a_thread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def hang(*, private_image: bool = False) -> bytes:
        (tmp_path / f"000000000001.bin.{os.getpid()}.tmp").write_bytes(b"half")
        threading.Event().wait()  # as on a lock another thread held at the fork
        return b""

    w = SnapshotWriter(fork=True, fork_timeout_s=1.0)
    with caplog.at_level(logging.WARNING, "tidewatch.engine"):
        assert w.write(1, tmp_path / "000000000001.bin", hang)
        w.wait()
    assert "did not finish in 1 s and was killed" in caplog.text
    assert w.failed == 1 and not w.fork and not list(tmp_path.iterdir())

    def here(*, private_image: bool = False) -> bytes:
        return f"{os.getpid()} {private_image}".encode()

    assert w.write(2, tmp_path / "000000000002.bin", here)
    w.wait()
    assert (tmp_path / "000000000002.bin").read_bytes() == f"{os.getpid()} False".encode()  # copies, here


def test_sockets_other_threads_hold_are_left_alone(tmp_path: Path) -> None:
    """py4j keeps a connection per thread in a ``threading.local`` and shuts its socket down when
    it is freed; the child frees other threads' locals after the fork, and a ``shutdown`` there
    would cut the parent's own connection (the socket is shared).  The parent's must still work."""
    a, b = socket.socketpair()
    local = threading.local()
    ready = threading.Event()
    done = threading.Event()

    class Conn:
        def __del__(self) -> None:
            a.shutdown(socket.SHUT_RDWR)

    def hold() -> None:
        local.conn = Conn()
        ready.set()
        done.wait()
        local.conn = None  # the parent's own clean-up, not the child's

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    ready.wait()
    w = SnapshotWriter(fork=True)
    assert w.write(1, tmp_path / "000000000001.bin", lambda private_image=False: b"state")
    w.wait()
    assert (tmp_path / "000000000001.bin").read_bytes() == b"state"
    a.sendall(b"still here")
    assert b.recv(64) == b"still here"
    done.set()
    t.join(5)
    a.close()
    b.close()


_DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from engine.runtime.snapshot_writer import SnapshotWriter

    def slow(*, private_image: bool = False) -> bytes:
        time.sleep(60)
        return b"late"

    w = SnapshotWriter(fork=True)
    w.write(1, Path(sys.argv[1]) / "000000000001.bin", slow)
    print("forked", flush=True)
    time.sleep(60)
    """
)


def test_a_killed_driver_leaves_no_snapshot_process(tmp_path: Path) -> None:
    """SIGKILL the driver mid-snapshot: its child goes too (no orphan holding its pipes)."""
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    assert driver.stdout is not None
    assert driver.stdout.readline().strip() == "forked"
    children = psutil.Process(driver.pid).children(recursive=True)
    assert len(children) == 1
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(10)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive and len(gone) == 1
    assert not list(tmp_path.glob("*.bin"))


def test_the_prefault_runs_once_in_this_process_beside_the_caller(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``prefault``, the step after the fork (the pages the evaluator's next batch writes
    made private, engine/runtime/prefault.py) runs in the parent, on the fork's thread, once the
    child exists; its failure is logged and the snapshot is written all the same.  Without a
    fork, without ``prefault`` or without an evaluator it is not run."""
    from engine.runtime import snapshot_writer

    calls: list[tuple[int, str]] = []
    asked: list[object] = []

    def after() -> None:
        calls.append((os.getpid(), threading.current_thread().name))
        raise RuntimeError("boom")

    def ahead(evaluator: object) -> object:  # as the real one: no step for no evaluator
        asked.append(evaluator)
        return after if evaluator is not None else None

    monkeypatch.setattr(snapshot_writer, "ahead_of_next_batch", ahead)
    evaluator = object()
    w = SnapshotWriter(fork=True, prefault=True)
    path = tmp_path / "000000000004.bin"
    with caplog.at_level(logging.ERROR, logger="tidewatch.engine"):
        assert w.write(4, path, lambda **_: b"state", evaluator)
        w.wait()
    assert asked == [evaluator]
    assert calls == [(os.getpid(), "tidewatch-snapshot-4")]
    assert path.read_bytes() == b"state" and w.failed == 0
    assert any("after its fork failed" in r.getMessage() for r in caplog.records)

    thread_mode = SnapshotWriter(fork=False, prefault=True)
    assert thread_mode.write(5, tmp_path / "000000000005.bin", lambda: b"s", evaluator)
    thread_mode.wait()
    off = SnapshotWriter(fork=True)
    assert off.write(6, tmp_path / "000000000006.bin", lambda **_: b"s", evaluator)
    off.wait()
    no_evaluator = SnapshotWriter(fork=True, prefault=True)
    assert no_evaluator.write(7, tmp_path / "000000000007.bin", lambda **_: b"s")
    no_evaluator.wait()
    assert asked == [evaluator, None] and len(calls) == 1  # neither without a fork nor without prefault
    assert (tmp_path / "000000000006.bin").read_bytes() == b"s"
