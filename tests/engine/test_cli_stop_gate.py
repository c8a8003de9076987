""":class:`engine.cli.StopGate`: the streaming query is stopped between two batches (no Spark)."""

from __future__ import annotations

import threading
import time
from typing import Any

from engine.cli import StopGate


class FakeQuery:
    def __init__(self, gate: StopGate, log: list[str]) -> None:
        self.gate, self.log = gate, log

    def stop(self) -> None:
        self.log.append("stop")


class FakeDf:
    """A batch's DataFrame: ``sparkSession._jvm.java.lang.Thread.interrupted()`` as py4j gives it."""

    def __init__(self, log: list[str]) -> None:
        thread = type("Thread", (), {"interrupted": staticmethod(lambda: log.append("clear") or True)})
        lang = type("Lang", (), {"Thread": thread})
        java = type("Java", (), {"lang": lang})
        jvm = type("Jvm", (), {"java": java})
        self.sparkSession = type("S", (), {"_jvm": jvm})


def test_stop_waits_for_the_batch_in_progress_and_holds_the_next() -> None:
    log: list[str] = []
    started = threading.Event()

    def on_batch(df: Any, batch_id: int) -> None:
        log.append(f"begin {batch_id}")
        started.set()
        time.sleep(0.3)
        log.append(f"end {batch_id}")

    gate = StopGate(on_batch, drain_s=5, next_s=5, hold_s=0.05)
    query = FakeQuery(gate, log)
    first = threading.Thread(target=gate, args=(FakeDf(log), 1))
    first.start()
    started.wait(5)
    stopper = threading.Thread(target=gate.stop, args=(query,))
    stopper.start()
    time.sleep(0.5)  # batch 1 done; the stop waits for the next batch to reach the gate
    assert log == ["begin 1", "end 1"]
    second = threading.Thread(target=gate, args=(FakeDf(log), 2))
    second.start()
    for t in (first, stopper, second):
        t.join(5)
    # stopped while batch 2 waited at the gate; batch 2 then ran whole, after the interrupt was cleared
    assert log == ["begin 1", "end 1", "stop", "clear", "begin 2", "end 2"]


def test_an_idle_query_is_stopped_after_next_s() -> None:
    log: list[str] = []
    gate = StopGate(lambda df, b: log.append(f"batch {b}"), drain_s=5, next_s=0.2, hold_s=0)
    t0 = time.monotonic()
    assert gate.stop(FakeQuery(gate, log)) is True
    assert log == ["stop"] and 0.2 <= time.monotonic() - t0 < 2


def test_a_batch_that_outlasts_drain_s_is_stopped_anyway() -> None:
    log: list[str] = []
    gate = StopGate(lambda df, b: time.sleep(1.0), drain_s=0.1, next_s=0.1, hold_s=0)
    t = threading.Thread(target=gate, args=(None, 1))
    t.start()
    time.sleep(0.05)
    assert gate.stop(FakeQuery(gate, log)) is False and log == ["stop"]
    t.join(5)
