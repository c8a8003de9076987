"""The progress marker sent beside a transaction's produce loops (:class:`engine.sinks.publish.Marking`):
a :class:`~tidewatch.kafka.txn.Call` on a thread of its own, waited for by the transaction's other
calls, its error raised to each.  No services."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from engine.sinks.publish import Marking


def test_the_marker_is_sent_on_its_thread_and_its_error_raised_at_every_wait() -> None:
    names: list[str] = []
    marking = Marking(lambda: names.append(threading.current_thread().name))
    assert marking.wait() is None
    assert names == ["tidewatch-marker"] and not marking.alive

    def refused() -> None:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    failed = Marking(refused)
    for _ in range(2):  # commit, then abort: both see it
        with pytest.raises(KafkaException):
            failed.wait()
