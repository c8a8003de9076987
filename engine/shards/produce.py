"""A shard's Kafka output produced by its own task (``engine_shard_delivery = "tasks"``).

docs/engine.md, "Delivery from Spark tasks".  After a shard's task evaluated batch ``b``
(:class:`engine.shards.processor.ShardProcessor`), it produces the shard's output -- the
tombstones of its removed keys, then its alerts and result records, then its dead letters, the
order of :meth:`engine.sinks.publish.Publisher.publish` -- in ONE Kafka transaction of the
shard's own, ``transactional.id = tidewatch-engine-<id>-shard-<s>``, which also moves the shard's
progress marker (offset ``b + 1`` of group ``tidewatch-engine-<id>-shard-<s>-progress``):
the :class:`~engine.sinks.publish.Publisher` of the driver's engine, under the shard's id.

Exactly once, with the driver committing the batch in PostgreSQL only after every shard's task
returned ("Kafka per shard, then PostgreSQL"):

* a batch Spark runs again (a retried or moved task, a restart after a crash before Spark's
  commit) makes the same output -- the core is deterministic on Spark's logged offsets -- and a
  task whose marker is at or past its batch produces nothing (:func:`publish_shard`);
* the marker is read only when the shard's core is not this worker's live one: a live core is
  the state after the batch before, in this run of the query, whose task had not yet published
  this batch (a task that published and then failed left no live core behind: it is taken out
  of the worker's cache while the batch runs);
* a shard whose output is empty (no alert, dead letter or tombstone) opens no transaction: its
  marker stays behind, and a run again publishes nothing either;
* a retried or moved task's producer fences its earlier attempt (a zombie included) by the
  transactional id, and completes or aborts the transaction that attempt left open.

The producers live in the worker process beside the shards' live cores (:data:`_PUBLISHERS`),
made at a shard's first batch in the worker (``init_transactions``: a round trip to the
transaction coordinator) and dropped when a publish fails, so that the next one starts from a
fresh producer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.messages import BatchOutput
from engine.sinks.alert_columns import AlertColumns

if TYPE_CHECKING:
    from engine.sinks.publish import Publisher

#: (engine id, shard) -> this worker's publisher of the shard (module docstring)
_PUBLISHERS: dict[tuple[str, int], Publisher] = {}


def shard_engine_id(engine_id: str, shard: int) -> str:
    """The engine id a shard's publisher runs under: its transactional id is
    ``tidewatch-engine-<this>`` and its marker's group ``tidewatch-engine-<this>-progress``
    (:class:`engine.sinks.publish.Publisher`)."""
    return f"{engine_id}-shard-{shard}"


def has_output(out: BatchOutput) -> bool:
    """Whether ``out`` has any Kafka record: an alert, a dead letter or a removed key."""
    return bool(out.alerts) or bool(len(out.dead)) or any(out.removed_keys.values())


@dataclass(frozen=True)
class Published:
    """What :func:`publish_shard` did: ``how`` is ``published`` (a transaction committed),
    ``before`` (the marker showed the batch published already: nothing produced), or ``empty``
    (nothing to produce); ``seconds`` it took, the producer's start included."""

    how: str
    seconds: float


def publish_shard(
    settings: Any,
    bootstrap: str,
    engine_id: str,
    shard: int,
    out: BatchOutput,
    *,
    live: bool,
) -> Published:
    """Produce shard ``shard``'s output of batch ``out.batch_id`` exactly once (module
    docstring); ``live``: the batch ran on this worker's live core (the marker is not read).
    Raises Kafka's error when the transaction could not be committed within
    ``engine_kafka_retry_s`` (the task fails; Spark retries it)."""
    from engine.sinks.publish import Publisher

    t0 = time.perf_counter()
    if not has_output(out):
        return Published("empty", 0.0)
    key = (engine_id, shard)
    publisher = _PUBLISHERS.pop(key, None)  # out while it runs: a failure leaves none behind
    if publisher is None:
        publisher = Publisher(bootstrap, settings, shard_engine_id(engine_id, shard))
    how = "published"
    if not live and publisher.last_published() >= out.batch_id:
        how = "before"
    else:
        alerts = AlertColumns.of(out.alerts) if out.alerts else out.alerts
        publisher.publish(out.batch_id, alerts, out.dead, out.removed_keys)
    _PUBLISHERS[key] = publisher
    return Published(how, time.perf_counter() - t0)


def shard_published_up_to(settings: Any, bootstrap: str, engine_id: str, shard: int) -> int:
    """The last batch shard ``shard`` of engine ``engine_id`` published (-1: none), read from its
    marker without fencing its producer (tests, the driver's checks)."""
    from engine.sinks.publish import published_up_to

    return published_up_to(settings, bootstrap, shard_engine_id(engine_id, shard))
