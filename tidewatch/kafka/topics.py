"""The one spec of Tidewatch's Kafka topics, and their idempotent creation.

Every topic is created from here -- by ``tidewatch up`` and compose's ``init``
(:func:`tidewatch.kafka.admin.ensure_topics`, as the ``admin`` principal), the engine at start-up
(:func:`engine.sinks.publish.ensure_topics`, as ``engine``), a feed for its topic
(:func:`ingest.producer.ensure_topic`, as ``feed``) and the tests:

* :func:`topic_specs` -- Tidewatch's six topics.  ``subscriptions`` and ``results`` are
  compacted: a consumer that starts from the beginning sees the latest record per key (the
  current subscription set, the current result set).  ``min.compaction.lag.ms`` keeps recent
  records uncompacted so the outbox relay's recovery scan (:mod:`subscriptions.outbox`) always
  finds what it published in the last hour.  ``subscriptions`` and ``dead-letter`` have one
  partition, the others ``settings.topic_partitions``.
* :func:`topic_spec` -- the spec of one of them by name (None for any other name).
* :func:`stream_topic_spec` -- a topic outside the spec (a test's scratch topic, a feed's own
  ``--topic``) with the streams' defaults: no config, the given number of partitions
  (:func:`spec_for`: ``settings.topic_partitions`` unless told).
* :func:`spec_for` -- Tidewatch's spec of a topic name, else the streams' defaults.
* :func:`create_topics` -- create the missing ones of some specs through an admin client.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient, NewTopic

    from tidewatch.settings import Settings

__all__ = [
    "COMPACTED",
    "TopicSpec",
    "create_topics",
    "spec_for",
    "stream_topic_spec",
    "topic_spec",
    "topic_specs",
]

#: the config of the compacted topics (``subscriptions``, ``results``)
COMPACTED = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": str(3_600_000),
    "segment.ms": str(3_600_000),
}


@dataclass(frozen=True)
class TopicSpec:
    """A topic as Tidewatch creates it (replication factor 1)."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)

    def new_topic(self) -> NewTopic:
        """The topic as an argument of :meth:`~confluent_kafka.admin.AdminClient.create_topics`."""
        from confluent_kafka.admin import NewTopic

        return NewTopic(self.name, num_partitions=self.partitions, replication_factor=1, config=self.config)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """All of Tidewatch's topics with their partition counts and configs."""
    s = settings
    n = s.topic_partitions
    return [
        TopicSpec(s.topic_trades, n),
        TopicSpec(s.topic_packets, n),
        # one partition: the engine applies subscription changes in one total order
        TopicSpec(s.topic_subscriptions, 1, dict(COMPACTED)),
        TopicSpec(s.topic_alerts, n),
        TopicSpec(s.topic_results, n, dict(COMPACTED)),
        TopicSpec(s.topic_dead_letter, 1),
    ]


def topic_spec(name: str, settings: Settings) -> TopicSpec | None:
    """The spec of Tidewatch's topic ``name`` (as the settings name its topics); None when
    ``name`` is not one of them."""
    return next((t for t in topic_specs(settings) if t.name == name), None)


def stream_topic_spec(name: str, partitions: int) -> TopicSpec:
    """A topic that is not in the spec (a test's scratch topic, a feed's custom ``--topic``),
    created with the streams' defaults: ``partitions`` partitions, no config."""
    return TopicSpec(name, partitions)


def spec_for(name: str, settings: Settings, partitions: int | None = None) -> TopicSpec:
    """The spec of ``name``: Tidewatch's own (:func:`topic_spec`), else the streams' defaults
    with ``partitions`` or ``settings.topic_partitions`` partitions (:func:`stream_topic_spec`).
    A ValueError when ``partitions`` contradicts the spec of one of Tidewatch's topics."""
    spec = topic_spec(name, settings)
    if spec is None:
        return stream_topic_spec(name, partitions if partitions is not None else settings.topic_partitions)
    if partitions is not None and partitions != spec.partitions:
        raise ValueError(
            f"topic {name!r} has {spec.partitions} partition(s) in the topic spec, not {partitions}"
        )
    return spec


def create_topics(admin: AdminClient, specs: Iterable[TopicSpec], *, timeout: float = 30.0) -> dict[str, str]:
    """Create the topics of ``specs`` that the broker lacks; ``{topic: "created" | "exists"}``.

    A topic created meanwhile by someone else (``TOPIC_ALREADY_EXISTS``) counts as existing;
    any other refusal (e.g. ``TOPIC_AUTHORIZATION_FAILED`` for a principal that may not create
    topics) is raised as the :class:`~confluent_kafka.KafkaException`."""
    from confluent_kafka import KafkaError, KafkaException

    from tidewatch.kafka.codes import error_code

    specs = list(specs)
    existing = set(admin.list_topics(timeout=timeout).topics)
    status = {t.name: "exists" for t in specs if t.name in existing}
    new = [t.new_topic() for t in specs if t.name not in existing]
    if not new:
        return status
    for name, fut in admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout).items():
        try:
            fut.result(timeout=timeout)
            status[name] = "created"
        except KafkaException as exc:
            if error_code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            status[name] = "exists"
    return status
