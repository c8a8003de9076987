"""The stall bound and retry loop shared by the engine's publisher and the outbox relay."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from tidewatch.kafka.txn import Call, KafkaStalled, bounded, retrying

log = logging.getLogger("test")


def test_bounded_returns_raises_or_gives_up() -> None:
    assert bounded(lambda: 7, 5, "x") == 7
    with pytest.raises(ValueError):
        bounded(lambda: int("no"), 5, "x")
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(KafkaStalled, match="commit: no answer from Kafka within 0 s"):
        bounded(lambda: release.wait(30), 0.3, "commit")
    assert time.monotonic() - t0 < 5
    release.set()


def test_a_call_runs_on_its_thread_and_gives_its_value_or_its_error_at_every_wait() -> None:
    names: list[str] = []
    release = threading.Event()

    def slow() -> int:
        names.append(threading.current_thread().name)
        release.wait(30)
        return 7

    call = Call(slow, "marker", name="tidewatch-probe")
    assert call.alive
    with pytest.raises(KafkaStalled, match="marker: no answer from Kafka within 0 s"):
        call.wait(0.2)
    release.set()
    assert call.wait() == 7 and call.wait(5) == 7 and not call.alive
    assert names == ["tidewatch-probe"]
    failing = Call(lambda: int("no"), "x")
    for _ in range(2):  # the same error, at every wait
        with pytest.raises(ValueError, match="no"):
            failing.wait()
    assert not failing.alive


def test_bounded_gives_up_on_a_slow_call_and_leaves_it_running() -> None:
    release = threading.Event()
    done = threading.Event()

    def slow() -> None:
        release.wait(30)
        done.set()

    with pytest.raises(KafkaStalled, match="send: no answer from Kafka within 0 s"):
        bounded(slow, 0.2, "send")
    assert not done.is_set()  # still running, left in its thread
    release.set()
    assert done.wait(5)


def test_retrying_repeats_kafka_failures_until_one_attempt_succeeds(caplog) -> None:  # type: ignore[no-untyped-def]
    seen: list[int] = []

    def attempt(n: int) -> str:
        seen.append(n)
        if n == 1:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        if n == 2:
            raise KafkaStalled("stalled")
        return "ok"

    with caplog.at_level(logging.INFO):
        assert retrying(attempt, 60, "batch 3", log) == "ok"
    assert seen == [1, 2, 3]
    assert caplog.text.count("batch 3: Kafka transaction failed") == 2
    assert "batch 3: published to Kafka at attempt 3" in caplog.text


def test_retrying_gives_up_after_its_budget_and_passes_other_errors() -> None:
    calls: list[int] = []

    def down(n: int) -> None:
        calls.append(n)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    with pytest.raises(KafkaException):
        retrying(down, 0.6, "x", log)
    assert 2 <= len(calls) <= 3  # 0.5 s pause, then what is left of 0.6 s
    with pytest.raises(RuntimeError):
        retrying(lambda n: (_ for _ in ()).throw(RuntimeError("db")), 60, "x", log)


def test_retrying_stops_when_told() -> None:
    stop = threading.Event()
    calls: list[int] = []

    def down(n: int) -> None:
        calls.append(n)
        if n == 2:
            stop.set()
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    t0 = time.monotonic()
    with pytest.raises(KafkaException):
        retrying(down, 300, "x", log, stop)
    assert calls == [1, 2] and time.monotonic() - t0 < 5


def test_a_refusal_is_raised_at_once_not_retried() -> None:
    """An ACL refusal cannot be ridden out by a new producer: one attempt, then the error."""
    import logging

    from confluent_kafka import KafkaError, KafkaException

    from tidewatch.kafka.txn import retrying

    calls = []

    def attempt(n: int) -> None:
        calls.append(n)
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    with pytest.raises(KafkaException):
        retrying(attempt, 30.0, "test", logging.getLogger("test"))
    assert calls == [1]
