"""Creation of Tidewatch's Kafka topics as the broker's ``admin`` (idempotent).

The topics, their partitions and configs are the one spec of :mod:`tidewatch.kafka.topics`;
``tidewatch up`` and compose's ``init`` create them through :func:`ensure_topics`.
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from tidewatch.kafka.topics import create_topics, topic_specs
from tidewatch.settings import Settings


def admin_client(bootstrap: str | None, settings: Settings) -> AdminClient:
    """An admin client connected as the broker's ``admin`` (its credentials in the scram mode)."""
    from tidewatch.kafka.client import ADMIN, librdkafka_config

    return AdminClient(librdkafka_config(settings, ADMIN, bootstrap))


def ensure_topics(bootstrap: str | None, settings: Settings, *, timeout: float = 30.0) -> dict[str, str]:
    """Create the missing topics; return ``{topic: "created" | "exists"}``."""
    s = settings
    admin = admin_client(bootstrap or s.kafka_bootstrap, s)
    return create_topics(admin, topic_specs(s), timeout=timeout)
