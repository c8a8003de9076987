"""Kafka side of the engine: alerts, current results and dead letters in one Kafka transaction.

After a batch is committed in PostgreSQL (:mod:`engine.sinks.store`), its Avro alerts (topic
``alerts``, keyed by subscription id), its result changes (compacted topic ``results``,
keyed ``subscription|key``: ``present=true`` on ENTER; ``present=false`` then a tombstone
on EXIT) and its dead letters are produced in ONE Kafka transaction; the alert and result
records of the whole batch are encoded together (:mod:`engine.sinks.alert_wire`, one Numba kernel)
and produced in one loop.  The same
transaction commits a *progress marker*: the offset ``batch_id + 1`` of a private
consumer group on partition 0 of ``alerts`` (``send_offsets_to_transaction``), so the
marker is visible exactly when the batch's records are.  After a crash the engine reads
the marker and re-publishes the last PostgreSQL-committed batch only if its Kafka
transaction never committed: consumers with ``isolation.level=read_committed`` see every
alert exactly once.  The transactional id fences a zombie engine of the same id.

A broker restart under the running engine: a batch's transaction that fails (any Kafka
error: retriable, abortable or fatal) or does not return within ``engine_kafka_stall_s``
is given up, the producer is re-created with the same transactional id -- its
``init_transactions`` fences the old producer and completes or aborts the open transaction --
and the marker decides, as after a crash, whether the batch must be published again; this
is retried for up to ``engine_kafka_retry_s`` (:mod:`tidewatch.kafka.txn`, shared with the
outbox relay).  The stall bound is needed because librdkafka
(2.16) can block in ``send_offsets_to_transaction`` past its own timeout after a restart of the
group coordinator (librdkafka issues 5456 and 5511); such a call is left in its thread, on the
abandoned producer, which the new one has fenced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from engine.dead_letter import DeadLetters
from engine.messages import Alert
from engine.sinks.alert_wire import encode_alerts, warm_up
from tidewatch.kafka.client import librdkafka_config
from tidewatch.kafka.codes import COORDINATOR, error_code
from tidewatch.kafka.topics import create_topics, topic_specs
from tidewatch.kafka.txn import DeliveryErrors, bounded, retrying
from tidewatch.wire.avro import encode

if TYPE_CHECKING:
    from tidewatch.settings import Settings

log = logging.getLogger("tidewatch.engine")

T = TypeVar("T")


def ensure_topics(bootstrap: str, settings: Settings) -> None:
    """Create Tidewatch's topics when missing, as the ``engine`` principal, from the one topic
    spec (:mod:`tidewatch.kafka.topics`; ``subscriptions`` and ``results`` compacted)."""
    admin = AdminClient(librdkafka_config(settings, "engine", bootstrap))
    for name, status in create_topics(admin, topic_specs(settings)).items():
        if status == "created":
            log.info("created topic %s", name)


class Publisher:
    """Transactional producer of the engine's Kafka output (see module docstring)."""

    def __init__(self, bootstrap: str, settings: Settings, engine_id: str = "default") -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.marker_tp = TopicPartition(settings.topic_alerts, 0)
        self.tid = f"tidewatch-engine-{engine_id}"
        self.producer, self.marker = self._clients()
        #: how a batch's alerts are produced (``bench/delivery_bench.py`` swaps in
        #: :func:`_produce_alerts_per_record`, the path :func:`produce_alerts` replaced)
        self.produce_alerts: Callable[[Producer, Any, Any, int, int], None] = produce_alerts
        warm_up()  # the alert encoder's kernel, compiled before the first batch

    def _clients(self) -> tuple[Producer, Consumer]:
        """A transactional producer (fencing any older one of the same id) and the marker's reader."""
        s = self.settings
        self.deliveries = DeliveryErrors()
        producer = Producer(
            librdkafka_config(
                s,
                "engine",
                self.bootstrap,
                **{
                    "on_delivery": self.deliveries,
                    "transactional.id": self.tid,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                    "compression.type": "lz4",
                },
            )
        )
        producer.init_transactions(60)
        marker = Consumer(
            librdkafka_config(
                s,
                "engine",
                self.bootstrap,
                **{
                    "group.id": f"{self.tid}-progress",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                },
            )
        )
        return producer, marker

    def last_published(self) -> int:
        """The id of the last batch whose Kafka transaction committed (-1 when none).

        Retries while the group coordinator is not ready (a fresh broker creates
        ``__consumer_offsets`` on first use).
        """
        deadline = time.monotonic() + 120
        while True:
            try:
                got = self.marker.committed([self.marker_tp], timeout=30)[0]
                return -1 if got.offset < 0 else got.offset - 1
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                retriable = bool(getattr(err, "retriable", lambda: False)()) or error_code(exc) in COORDINATOR
                if not retriable or time.monotonic() > deadline:
                    raise
                log.info("Kafka group coordinator not ready (%s); retrying", err)
                time.sleep(1.0)

    def publish(
        self,
        batch_id: int,
        alerts: list[Alert] | list[dict[str, Any]],
        dead: DeadLetters | None = None,
        removed: list[str] | None = None,
    ) -> None:
        """Produce one batch's output and its progress marker in one transaction, exactly once:
        a failed or stalled transaction is retried with a new producer unless the marker shows
        that it committed (see the module docstring)."""

        def attempt(n: int) -> None:
            if n > 1:
                # the old clients are dropped as they are: a call may still be blocked in them
                self.producer, self.marker = self._bounded(self._clients, "a new producer")
                if self._bounded(self.last_published, "the progress marker") >= batch_id:
                    log.info("batch %d: its Kafka transaction did commit before the failure", batch_id)
                    return
            self._bounded(lambda: self._transaction(batch_id, alerts, dead), f"batch {batch_id}")

        retrying(attempt, self.settings.engine_kafka_retry_s, f"batch {batch_id}", log)

    def _bounded(self, fn: Callable[[], T], what: str) -> T:
        """``fn()`` given up (:class:`~tidewatch.kafka.txn.KafkaStalled`) after ``engine_kafka_stall_s``."""
        return bounded(fn, self.settings.engine_kafka_stall_s, what)

    def _transaction(
        self, batch_id: int, alerts: list[Alert] | list[dict[str, Any]], dead: DeadLetters | None
    ) -> None:
        s = self.settings
        now = int(time.time() * 1000)
        p = self.producer
        p.begin_transaction()
        try:
            self.produce_alerts(p, s, alerts, batch_id, now)
            if dead is not None and len(dead):
                for rec in dead.records(now):
                    p.produce(
                        s.topic_dead_letter,
                        key=rec["source_topic"].encode(),
                        value=encode("dead_letter", rec),
                    )
            p.send_offsets_to_transaction(
                [TopicPartition(s.topic_alerts, 0, batch_id + 1)], self.marker.consumer_group_metadata(), 60
            )
            p.commit_transaction(120)
        except KafkaException as exc:
            self.deliveries.reraise(p, exc)  # an ACL refused the records: say so, by its code
            raise

    def close(self) -> None:
        self.producer.flush(30)
        self.marker.close()


def produce_alerts(
    p: Producer, s: Any, alerts: list[Alert] | list[dict[str, Any]], batch_id: int, now: int
) -> None:
    """Produce a batch's alert, result and tombstone records (encoded together,
    :func:`engine.sinks.alert_wire.encode_alerts`) in one loop, in the order of the alerts."""
    recs = encode_alerts(alerts, batch_id, now)
    produce = p.produce

    def put(topic: str, value: bytes | None, key: bytes) -> None:
        try:
            produce(topic, value=value, key=key)
        except BufferError:  # the local queue is full: wait for deliveries, then once more
            p.poll(1.0)
            produce(topic, value=value, key=key)

    ta, tr = s.topic_alerts, s.topic_results
    for i, (ak, av, rk, rv, present) in enumerate(
        zip(
            recs.alert_keys,
            recs.alert_values,
            recs.result_keys,
            recs.result_values,
            recs.present,
            strict=True,
        )
    ):
        put(ta, av, ak)
        put(tr, rv, rk)
        if not present:
            put(tr, None, rk)
        if i % 1000 == 999:
            p.poll(0)  # serve delivery reports
    p.poll(0)


def _produce_alerts_per_record(
    p: Producer, s: Any, alerts: list[Alert] | list[dict[str, Any]], batch_id: int, now: int
) -> None:
    """The alert loop before :func:`produce_alerts`: a dict and two fastavro encodings per alert.
    Kept as the reference of tests/engine/sinks/test_alert_wire.py and ``bench/delivery_bench.py``."""
    for a in alerts:
        rec = _alert_record(a, batch_id, now)
        p.produce(s.topic_alerts, key=rec["subscription_id"].encode(), value=encode("alerts", rec))
        rkey = f"{rec['subscription_id']}|{rec['key']}".encode()
        present = rec["kind"] == "ENTER"
        res = {
            "subscription_id": rec["subscription_id"],
            "key": rec["key"],
            "present": present,
            "as_of": rec["as_of"],
            "values": rec["values"],
            "batch_id": batch_id,
        }
        p.produce(s.topic_results, key=rkey, value=encode("results", res))
        if not present:
            p.produce(s.topic_results, key=rkey, value=None)
        p.poll(0)


def _alert_record(a: Alert | dict[str, Any], batch_id: int, now: int) -> dict[str, Any]:
    d: dict[str, Any]
    if isinstance(a, Alert):
        d = {
            "id": a.id,
            "subscription_id": a.subscription_id,
            "rule_name": a.rule_name,
            "stream": a.stream,
            "key": a.key,
            "kind": a.kind,
            "as_of": a.as_of,
            "values": a.values,
        }
    else:
        d = {"rule_name": "", "stream": "", "values": {}, **a}
    return {**d, "values": avro_values(d["values"]), "batch_id": batch_id, "emitted_at": now}


def avro_values(values: dict[str, Any] | None) -> dict[str, float | None]:
    """An alert's values as the Avro ``map<null|double>`` (COUNTs as doubles, NULL as null)."""
    return {str(k): None if v is None else float(v) for k, v in (values or {}).items()}
