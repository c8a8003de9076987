"""Topic creation for Tidewatch's Kafka topics (idempotent).

``subscriptions`` and ``results`` are compacted: a consumer that starts from the beginning
sees the latest record per key (the current subscription set, the current result set).
``min.compaction.lag.ms`` keeps recent records uncompacted so the outbox relay's recovery
scan (:mod:`subscriptions.outbox`) always finds what it published in the last hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tidewatch.settings import Settings, get_settings

_COMPACTED = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": str(3_600_000),
    "segment.ms": str(3_600_000),
}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(settings: Settings | None = None) -> list[TopicSpec]:
    """All of Tidewatch's topics with their partition counts and configs."""
    s = settings or get_settings()
    n = s.topic_partitions
    return [
        TopicSpec(s.topic_trades, n),
        TopicSpec(s.topic_packets, n),
        # one partition: the engine applies subscription changes in one total order
        TopicSpec(s.topic_subscriptions, 1, dict(_COMPACTED)),
        TopicSpec(s.topic_alerts, n),
        TopicSpec(s.topic_results, n, dict(_COMPACTED)),
        TopicSpec(s.topic_dead_letter, 1),
    ]


def admin_client(bootstrap: str | None = None, settings: Settings | None = None) -> AdminClient:
    """An admin client connected as the broker's ``admin`` (its credentials in the scram mode)."""
    from tidewatch.kafka.client import ADMIN, librdkafka_config

    return AdminClient(librdkafka_config(settings or get_settings(), ADMIN, bootstrap))


def ensure_topics(
    bootstrap: str | None = None, settings: Settings | None = None, *, timeout: float = 30.0
) -> dict[str, str]:
    """Create the missing topics; return ``{topic: "created" | "exists"}``."""
    s = settings or get_settings()
    admin = admin_client(bootstrap or s.kafka_bootstrap, s)
    existing = set(admin.list_topics(timeout=timeout).topics)
    specs = topic_specs(s)
    new = [
        NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, config=t.config)
        for t in specs
        if t.name not in existing
    ]
    status = {t.name: "exists" for t in specs if t.name in existing}
    if new:
        for name, fut in admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout).items():
            try:
                fut.result(timeout=timeout)
                status[name] = "created"
            except KafkaException as exc:
                if exc.args and getattr(exc.args[0], "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
                    status[name] = "exists"
                else:
                    raise
    return status
