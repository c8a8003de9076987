"""engine.runtime.snapshot_writer: the state snapshot captured in the calling thread, finished and
written by one background thread while the batches go on (no fork)."""

from __future__ import annotations

import functools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.runtime import snapshot_writer
from engine.runtime.snapshot_writer import SnapshotWriter, atomic_write, remove_stale_temporaries


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``fsync`` takes 0.4 s; the names of the threads that called it."""
    threads: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        threads.append(threading.current_thread().name)
        time.sleep(0.4)
        real(fd)

    monkeypatch.setattr(snapshot_writer.os, "fsync", fsync)
    return threads


def test_bytes_are_written_in_the_background_as_they_are(tmp_path: Path, slow_disk: list[str]) -> None:
    state = {"batch": 7}
    serialized_in: list[str] = []

    def serialize() -> bytes:
        serialized_in.append(threading.current_thread().name)
        return repr(state).encode()

    w = SnapshotWriter()
    path = tmp_path / "000000000007.bin"
    t0 = time.perf_counter()
    assert w.write(7, path, serialize)
    assert time.perf_counter() - t0 < 0.3  # the caller does not wait for the disk
    state["batch"] = 8  # the next batch changes the state while the snapshot is written
    assert w.busy and not path.exists()
    w.wait()
    assert not w.busy
    assert path.read_bytes() == b"{'batch': 7}"
    assert serialized_in == [threading.current_thread().name]
    assert slow_disk == ["tidewatch-snapshot-7"]
    assert [(b, p, n) for b, p, n, _ in w.written] == [(7, path, 12)]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_snapshot_due_while_one_is_written_is_skipped(
    tmp_path: Path, slow_disk: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    w = SnapshotWriter()
    assert w.write(1, tmp_path / "000000000001.bin", lambda: b"one")
    with caplog.at_level(logging.INFO, "tidewatch.engine"):
        assert not w.write(2, tmp_path / "000000000002.bin", lambda: b"two")
    assert "snapshot of batch 2 skipped: the one of batch 1 is still being written" in caplog.text
    assert w.skipped == 1
    w.wait()
    assert w.write(3, tmp_path / "000000000003.bin", lambda: b"three")
    w.wait()
    assert sorted(p.name for p in tmp_path.glob("*.bin")) == ["000000000001.bin", "000000000003.bin"]


def test_a_state_that_cannot_be_serialized_is_logged_and_the_next_snapshot_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> bytes:
        raise RuntimeError("boom")

    w = SnapshotWriter()
    with caplog.at_level(logging.WARNING, "tidewatch.engine"):
        assert not w.write(1, tmp_path / "000000000001.bin", broken)
    assert "state snapshot of batch 1 failed" in caplog.text and w.failed == 1
    assert not w.busy and not w.written and not list(tmp_path.iterdir())
    assert w.write(2, tmp_path / "000000000002.bin", lambda: b"ok")
    w.wait()
    assert (tmp_path / "000000000002.bin").read_bytes() == b"ok"


def test_a_failed_write_is_logged_leaves_no_temporary_and_the_next_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot_writer.os, "fsync", full)
    w = SnapshotWriter()
    with caplog.at_level(logging.WARNING, "tidewatch.engine"):
        assert w.write(1, tmp_path / "000000000001.bin", lambda: b"state")
        w.wait()
    assert "state snapshot of batch 1 failed: could not write" in caplog.text and w.failed == 1
    assert not w.written and not list(tmp_path.iterdir())
    monkeypatch.undo()
    assert w.write(2, tmp_path / "000000000002.bin", lambda: b"ok")
    w.wait()
    assert [p.name for p in tmp_path.iterdir()] == ["000000000002.bin"]


class _Capture:
    """A stand-in for a captured state: ``finish`` notes its thread, waits, and gives two pieces."""

    def __init__(self, text: bytes, fail: bool = False) -> None:
        self.text = text
        self.fail = fail
        self.finished_in: list[str] = []

    def finish(self) -> list[Any]:
        self.finished_in.append(threading.current_thread().name)
        time.sleep(0.3)
        if self.fail:
            raise ValueError("cannot finish")
        return [self.text[:2], np.frombuffer(self.text[2:], np.uint8)]


def test_captured_in_the_calling_thread_finished_and_written_in_the_background(tmp_path: Path) -> None:
    captured_in: list[str] = []
    cap = _Capture(b"snapshot")

    def capture() -> _Capture:
        captured_in.append(threading.current_thread().name)
        return cap

    w = SnapshotWriter()
    path = tmp_path / "000000000005.bin"
    t0 = time.perf_counter()
    assert w.write(5, path, capture)
    assert time.perf_counter() - t0 < 0.2  # the caller does not wait for the finish
    assert w.busy
    w.wait()
    assert captured_in == [threading.current_thread().name]
    assert cap.finished_in == ["tidewatch-snapshot-5"]
    assert path.read_bytes() == b"snapshot"
    assert [(b, p, n) for b, p, n, _ in w.written] == [(5, path, 8)]
    assert [b for b, _, _ in w.timings] == [5]


def test_a_capture_that_cannot_be_finished_is_logged_and_the_next_snapshot_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = SnapshotWriter()
    with caplog.at_level(logging.WARNING, "tidewatch.engine"):
        assert w.write(1, tmp_path / "000000000001.bin", lambda: _Capture(b"broken", fail=True))
        w.wait()
    assert "state snapshot of batch 1 failed: the captured state could not be finished" in caplog.text
    assert w.failed == 1 and not w.written and not list(tmp_path.iterdir())
    assert w.write(2, tmp_path / "000000000002.bin", lambda: _Capture(b"fine"))
    w.wait()
    assert (tmp_path / "000000000002.bin").read_bytes() == b"fine"


def test_the_capture_is_freed_once_finished_while_the_file_is_written(
    tmp_path: Path, slow_disk: list[str]
) -> None:
    refs: list[weakref.ref[_Capture]] = []

    def capture() -> _Capture:
        cap = _Capture(b"snapshot")
        refs.append(weakref.ref(cap))
        return cap

    w = SnapshotWriter()
    assert w.write(1, tmp_path / "000000000001.bin", capture)
    time.sleep(0.5)  # finished after 0.3 s, then fsync takes 0.4 s
    assert w.busy and refs[0]() is None
    w.wait()


def test_the_engine_state_as_captured_is_written_whatever_the_next_batches_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.engine.runtime import test_state_capture as capture_tests
    from tests.engine.runtime import test_state_codec as codec_tests

    monkeypatch.setattr(zipfile, "time", capture_tests._FIXED_TIME)
    core, _ = capture_tests._core_state(panes=True)
    before = core.to_bytes()
    w = SnapshotWriter()
    path = tmp_path / "000000000009.bin"
    assert w.write(9, path, core.capture)
    codec_tests._alerts(core, codec_tests._batches(seed=5)[10:14], 10)  # meanwhile, the next batches
    w.wait()
    assert path.read_bytes() == before and core.to_bytes() != before


def test_in_the_calling_thread_when_asked(tmp_path: Path, slow_disk: list[str]) -> None:
    w = SnapshotWriter(background=False)
    assert not w.background
    path = tmp_path / "000000000004.bin"
    assert w.write(4, path, lambda: b"x") and not w.busy  # done on return
    assert path.read_bytes() == b"x"
    assert slow_disk == [threading.current_thread().name]


def test_keeps_the_newest_three(tmp_path: Path) -> None:
    w = SnapshotWriter()
    for b in range(1, 6):
        w.write(b, tmp_path / f"{b:012d}.bin", functools.partial(bytes, str(b).encode()))
        w.wait()
    assert sorted(int(p.stem) for p in tmp_path.glob("*.bin")) == [3, 4, 5]


def test_never_forks_and_leaves_sockets_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer of before forked the driver and patched ``socket.shutdown`` for its child."""

    def no_fork() -> int:
        raise AssertionError("the snapshot writer forked")

    monkeypatch.setattr(os, "fork", no_fork)
    w = SnapshotWriter()
    assert w.write(1, tmp_path / "000000000001.bin", lambda: b"state")
    w.wait()
    assert (tmp_path / "000000000001.bin").read_bytes() == b"state"
    assert not getattr(socket.socket.shutdown, "_tidewatch_guard", False)
    assert socket.socket.shutdown.__qualname__ == "socket.shutdown"


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()  # a pid that is gone
    dead = tmp_path / f"000000000001.bin.{gone.pid}.tmp"
    live = tmp_path / f"000000000002.bin.{os.getpid()}.tmp"
    odd = tmp_path / "000000000003.bin.tmp"
    for f in (dead, live, odd):
        f.write_bytes(b"half")
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted([dead, odd])
    assert live.exists()


def test_atomic_write_leaves_no_temporary(tmp_path: Path) -> None:
    atomic_write(tmp_path / "sub" / "a.json", b"{}")
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["a.json"]
