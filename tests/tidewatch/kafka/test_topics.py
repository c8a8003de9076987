"""The one topic spec (tidewatch/kafka/topics.py) and Kafka errors told apart by code (no services)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from tidewatch.kafka import codes
from tidewatch.kafka.topics import (
    COMPACTED,
    TopicSpec,
    create_topics,
    spec_for,
    stream_topic_spec,
    topic_spec,
    topic_specs,
)
from tidewatch.settings import Settings


class FakeAdmin:
    """An AdminClient stand-in: lists ``existing``, answers create_topics with ``errors``."""

    def __init__(self, existing: set[str], errors: dict[str, int] | None = None) -> None:
        self.existing = existing
        self.errors = errors or {}
        self.created: list[Any] = []

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={t: None for t in self.existing})

    def create_topics(self, new: list[Any], **kw: Any) -> dict[str, Future[None]]:
        out = {}
        for t in new:
            self.created.append(t)
            fut: Future[None] = Future()
            code = self.errors.get(t.topic)
            if code is None:
                fut.set_result(None)
            else:
                fut.set_exception(KafkaException(KafkaError(code)))
            out[t.topic] = fut
        return out


def test_the_spec_is_what_tidewatch_up_creates() -> None:
    s = Settings(topic_partitions=3)
    specs = {t.name: t for t in topic_specs(s)}
    assert {n: t.partitions for n, t in specs.items()} == {
        "trades": 3,
        "packets": 3,
        "subscriptions": 1,
        "alerts": 3,
        "results": 3,
        "dead-letter": 1,
    }
    assert specs["subscriptions"].config == specs["results"].config == COMPACTED
    assert specs["trades"].config == specs["alerts"].config == specs["dead-letter"].config == {}
    specs["results"].config["segment.ms"] = "1"  # each spec has its own copy
    assert COMPACTED["segment.ms"] == "3600000"


def test_lookup_by_name_and_the_stream_defaults_for_other_topics() -> None:
    s = Settings(topic_partitions=4, topic_dead_letter="dlq")
    assert topic_spec("dlq", s) == TopicSpec("dlq", 1)
    assert topic_spec("dead-letter", s) is None and topic_spec("scratch", s) is None
    assert stream_topic_spec("scratch", 7) == TopicSpec("scratch", 7)
    assert spec_for("scratch", s) == TopicSpec("scratch", 4)
    assert spec_for("scratch", s, 2) == TopicSpec("scratch", 2)
    assert spec_for("dlq", s) == TopicSpec("dlq", 1)
    assert spec_for("dlq", s, 1) == TopicSpec("dlq", 1)
    with pytest.raises(ValueError, match="1 partition"):
        spec_for("dlq", s, 4)


def test_new_topic_carries_partitions_and_config() -> None:
    t = TopicSpec("results", 2, dict(COMPACTED)).new_topic()
    assert (t.topic, t.num_partitions, t.replication_factor) == ("results", 2, 1)
    assert t.config == COMPACTED


def test_create_topics_creates_only_the_missing_ones() -> None:
    s = Settings()
    admin = FakeAdmin(existing={s.topic_trades, s.topic_alerts})
    status = create_topics(admin, topic_specs(s))  # type: ignore[arg-type]
    assert status == {
        s.topic_trades: "exists",
        s.topic_alerts: "exists",
        s.topic_packets: "created",
        s.topic_subscriptions: "created",
        s.topic_results: "created",
        s.topic_dead_letter: "created",
    }
    made = {t.topic: t for t in admin.created}
    assert made[s.topic_dead_letter].num_partitions == 1
    assert made[s.topic_results].config == COMPACTED
    assert create_topics(FakeAdmin(existing={"x"}), [stream_topic_spec("x", 1)]) == {"x": "exists"}  # type: ignore[arg-type]


def test_create_topics_tells_a_race_from_a_refusal_by_code() -> None:
    race = FakeAdmin(existing=set(), errors={"t": KafkaError.TOPIC_ALREADY_EXISTS})
    assert create_topics(race, [stream_topic_spec("t", 1)]) == {"t": "exists"}  # type: ignore[arg-type]
    refused = FakeAdmin(existing=set(), errors={"t": KafkaError.TOPIC_AUTHORIZATION_FAILED})
    with pytest.raises(KafkaException) as info:
        create_topics(refused, [stream_topic_spec("t", 1)])  # type: ignore[arg-type]
    assert codes.error_code(info.value) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def _names() -> dict[int, str]:
    out = {}
    for code in range(-200, 200):
        try:
            out[code] = KafkaError(code).name()
        except Exception:  # noqa: BLE001 - not a code
            continue
    return out


def test_code_sets_are_the_codes_the_text_tests_matched() -> None:
    """Same set as ``"COORDINATOR" in str(exc)`` / ``"AUTHORIZATION_FAILED" in err.name()`` did
    (a KafkaException's text starts with ``KafkaError{code=<NAME>,...``)."""
    names = _names()
    assert codes.COORDINATOR == {c for c, n in names.items() if "COORDINATOR" in n}
    assert codes.AUTHORIZATION_FAILED == {c for c, n in names.items() if "AUTHORIZATION_FAILED" in n}
    for c in codes.COORDINATOR:
        assert "COORDINATOR" in str(KafkaException(KafkaError(c)))
    assert KafkaError._WAIT_COORD not in codes.COORDINATOR


def test_error_code() -> None:
    err = KafkaError(KafkaError.NOT_COORDINATOR)
    assert codes.error_code(KafkaException(err)) == KafkaError.NOT_COORDINATOR
    assert codes.error_code(err) == KafkaError.NOT_COORDINATOR
    assert codes.error_code(KafkaException("COORDINATOR in the text only")) is None
    assert codes.error_code(RuntimeError("x")) is None and codes.error_code(None) is None
