"""engine.runtime.poll_thread: a look every few seconds, a failing look logged and tried again."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from engine.runtime.poll_thread import PollThread


def test_looks_until_stopped_and_goes_on_after_a_failing_look(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[float] = []
    three = threading.Event()

    def look() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise ConnectionError("PostgreSQL restarting")
        if len(calls) >= 3:
            three.set()

    t = PollThread("test-poll", 0.01, look, "nothing looked at")
    with caplog.at_level(logging.WARNING, logger="tidewatch.engine"):
        t.start()
        t.start()  # a second start adds no thread
        assert three.wait(5)
        t.stop()
    n = len(calls)
    time.sleep(0.05)
    assert len(calls) == n  # no look after stop
    assert [r.getMessage() for r in caplog.records] == ["nothing looked at now: ConnectionError"]
    assert not [th for th in threading.enumerate() if th.name == "test-poll"]
