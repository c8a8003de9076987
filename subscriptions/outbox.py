"""The outbox relay: publishes ``outbox`` rows to Kafka exactly once, in ``id`` order.

:mod:`subscriptions.service` writes each subscription change and its outbox row in one
database transaction, so a committed change always has a row and a rolled-back change
never has one.  This relay moves the rows to Kafka (the compacted ``subscriptions`` topic,
keyed by subscription id).  Why every change lands on the topic **exactly once**, wherever
the relay process is killed:

1. *Killed after the change's commit, before any publish*: the row stays unpublished
   (``published_at IS NULL``); the next relay publishes it.  Nothing is lost.
2. *Killed while publishing, before the Kafka transaction commits*: the relay produces
   with a **transactional producer** under a fixed ``transactional.id``.  The next relay's
   ``init_transactions()`` fences the dead one and aborts its open transaction, so those
   records are never visible to ``read_committed`` consumers; the rows are still
   unpublished in the database and are produced again, once.
3. *Killed after the Kafka commit, before the database marks the rows*: the records
   are on the topic but the rows look unpublished.  Before publishing anything, a
   starting relay **recovers**: per partition it reads, ``read_committed``, every record
   after the highest offset already marked in the outbox for that partition -- exactly
   the records published but not marked -- and marks their rows (each record carries its
   ``outbox_id`` header) with that offset.  Those rows are not produced again.
4. Two relays never run at once: each holds a PostgreSQL advisory lock per topic for
   its lifetime, so "after the highest marked offset" is only ever written by one process.

A broker restart under a running relay (5.): a transaction that fails (any Kafka error) or
has not returned within ``relay_kafka_stall_s`` is given up, the producer is re-created with
the same transactional id -- which fences the old one (possibly still blocked in a librdkafka
call) and completes or aborts its open transaction -- and :meth:`OutboxRelay.recover` marks the
rows whose records did commit, exactly as after case 3; the rest are published again
(:mod:`tidewatch.kafka.txn`, the engine's mechanism).  :meth:`OutboxRelay.run` never gives up:
an outage longer than ``relay_kafka_retry_s`` is logged and waited out.

Every message also carries the subscription ``version`` (header and value), so a
consumer can drop anything it has already applied (``version`` ≤ what it holds) -- a
second line of defence for consumers that read ``read_uncommitted`` (Spark's Kafka
source does unless ``kafka.isolation.level=read_committed`` is set).

Compaction: ``min.compaction.lag.ms`` on the topic (1 h, :mod:`tidewatch.kafka.admin`)
keeps the recovery window intact; if a record was compacted away anyway, a later record
of the same key exists after it, and recovery marks every older unpublished row of that
key as superseded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from subscriptions.errors import SubscriptionsError
from tidewatch.db.models import Outbox
from tidewatch.db.session import make_db_engine
from tidewatch.kafka.client import client_config
from tidewatch.kafka.txn import REFUSED, KafkaStalled, bounded, retrying
from tidewatch.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_TRANSACTIONAL_ID = "tidewatch-outbox-relay"


class RelayBusy(SubscriptionsError, RuntimeError):
    """Another relay holds the lock for this topic."""


@dataclass
class Hooks:
    """Fault-injection points for tests (called inside :meth:`OutboxRelay.publish_pending`)."""

    before_kafka_commit: Callable[[], None] | None = None
    after_kafka_commit: Callable[[], None] | None = None


def _lock_key(topic: str) -> int:
    """A stable signed 64-bit advisory lock key per topic."""
    return int.from_bytes(
        hashlib.sha256(f"tidewatch-outbox:{topic}".encode()).digest()[:8], "big", signed=True
    )


def encode_value(row: Outbox) -> bytes:
    if row.payload_bytes is not None:
        return bytes(row.payload_bytes)
    return json.dumps(row.payload, sort_keys=True, separators=(",", ":"), default=str).encode()


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


_Header = tuple[str, str | bytes | None]
#: what a transaction produces of a row: outbox id, key, value, headers
_Record = tuple[int, bytes, bytes, list[_Header]]


def _headers(row: Outbox) -> list[_Header]:
    h: list[_Header] = [("outbox_id", str(row.id).encode())]
    version = row.payload.get("version") if isinstance(row.payload, dict) else None
    if version is not None:
        h.append(("version", str(version).encode()))
    return h


@dataclass
class OutboxRelay:
    """Publishes the outbox rows of one topic.  Use as a context manager or call :meth:`close`."""

    topic: str
    bootstrap: str
    url: str
    transactional_id: str = DEFAULT_TRANSACTIONAL_ID
    batch_size: int = 500
    hooks: Hooks = field(default_factory=Hooks)
    #: the ``relay`` principal's credentials (:func:`tidewatch.kafka.client.client_config`)
    kafka_conf: dict[str, str] = field(default_factory=dict)
    #: a Kafka transaction not done after this long is given up (``relay_kafka_stall_s``)
    stall_s: float = Settings.model_fields["relay_kafka_stall_s"].default
    #: :meth:`drain` retries failed transactions this long (``relay_kafka_retry_s``)
    retry_s: float = Settings.model_fields["relay_kafka_retry_s"].default

    def __post_init__(self) -> None:
        self._db_engine: Engine = make_db_engine(self.url)
        self._sessions = sessionmaker(bind=self._db_engine, expire_on_commit=False)
        self._lock_conn = self._db_engine.connect()
        got = self._lock_conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": _lock_key(self.topic)})
        self._lock_conn.commit()
        if not got:
            self._lock_conn.close()
            self._db_engine.dispose()
            raise RelayBusy(f"another outbox relay is publishing to {self.topic!r}")
        self._producer = self._new_producer()
        self._broken = False  # a transaction failed: re-create the producer and recover first
        self.recovered = self.recover()

    def _new_producer(self) -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                **self.kafka_conf,
                "enable.idempotence": True,
                "acks": "all",
                "transactional.id": f"{self.transactional_id}:{self.topic}",
                "linger.ms": 5,
            }
        )
        # fences a previous relay (or producer) with the same id and completes or aborts its
        # open transaction (case 2)
        producer.init_transactions(30)
        return producer

    @classmethod
    def from_settings(cls, settings: Settings, **kw: Any) -> OutboxRelay:
        """The relay of ``settings.topic_subscriptions``: bootstrap, database, the ``relay``
        principal's credentials and the stall / retry times from ``settings``."""
        s = settings
        kw.setdefault("kafka_conf", client_config(s, "relay"))
        kw.setdefault("stall_s", s.relay_kafka_stall_s)
        kw.setdefault("retry_s", s.relay_kafka_retry_s)
        return cls(topic=s.topic_subscriptions, bootstrap=s.kafka_bootstrap, url=s.sqlalchemy_url, **kw)

    # --- recovery (case 3) --------------------------------------------------------------------

    def _marked_boundaries(self, s: Session) -> dict[int, int]:
        rows = s.execute(
            select(Outbox.kafka_partition, func.max(Outbox.kafka_offset))
            .where(Outbox.topic == self.topic, Outbox.kafka_offset.is_not(None))
            .group_by(Outbox.kafka_partition)
        )
        return {int(p): int(o) for p, o in rows if p is not None and o is not None}

    def recover(self, timeout: float = 30.0) -> int:
        """Mark the rows whose records are on the topic but not yet marked; return how many."""
        with self._sessions.begin() as s:
            boundary = self._marked_boundaries(s)
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                **self.kafka_conf,
                "group.id": f"{self.transactional_id}-recovery",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        found: list[tuple[int, int, int | None, str, int | None]] = []  # partition, offset, id, key, version
        try:
            md = consumer.list_topics(self.topic, timeout=timeout)
            tmd = md.topics.get(self.topic)
            if tmd is None or tmd.error is not None:
                raise KafkaException(
                    tmd.error if tmd is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
                )
            parts = []
            pending: set[int] = set()
            for p in tmd.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout)
                start = boundary[p] + 1 if p in boundary else OFFSET_BEGINNING
                if high <= (boundary.get(p, -1) + 1) or high <= low:
                    continue
                parts.append(TopicPartition(self.topic, p, start))
                pending.add(p)
            if parts:
                consumer.assign(parts)
            deadline = time.monotonic() + timeout
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"outbox recovery could not read {self.topic} to its end")
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(int(msg.partition() or 0))
                        continue
                    raise KafkaException(error)
                raw_headers: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
                hdrs = {k: v for k, v in raw_headers if v is not None}
                oid = int(hdrs["outbox_id"]) if "outbox_id" in hdrs else None
                ver = int(hdrs["version"]) if "version" in hdrs else None
                raw_key = msg.key()
                key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key or "")
                found.append((int(msg.partition() or 0), int(msg.offset() or 0), oid, key, ver))
        finally:
            consumer.close()
        if not found:
            return 0
        marked = 0
        with self._sessions.begin() as s:
            latest_version: dict[str, int] = {}
            for part, off, oid, key, ver in found:
                if oid is not None:
                    marked += _rowcount(
                        s.execute(
                            update(Outbox)
                            .where(
                                Outbox.id == oid, Outbox.topic == self.topic, Outbox.published_at.is_(None)
                            )
                            .values(published_at=func.now(), kafka_partition=part, kafka_offset=off)
                        )
                    )
                if ver is not None:
                    latest_version[key] = max(ver, latest_version.get(key, ver))
            for key, ver in latest_version.items():
                # rows of an older version whose record compaction removed: superseded
                marked += _rowcount(
                    s.execute(
                        update(Outbox)
                        .where(
                            Outbox.topic == self.topic,
                            Outbox.key == key,
                            Outbox.published_at.is_(None),
                            Outbox.payload["version"].as_integer() <= ver,
                        )
                        .values(published_at=func.now())
                    )
                )
        if marked:
            log.info("outbox recovery: %d row(s) were already on %s", marked, self.topic)
        return marked

    # --- publishing ---------------------------------------------------------------------------

    def publish_pending(self) -> int:
        """Publish one batch of unpublished rows in one Kafka transaction; return how many.

        The transaction runs under :func:`~tidewatch.kafka.txn.bounded` (``stall_s``): a Kafka
        error or a stall leaves the rows unmarked and raises; :meth:`drain` then re-creates the
        producer and recovers before publishing again."""
        with self._sessions.begin() as s:
            rows = list(
                s.scalars(
                    select(Outbox)
                    .where(Outbox.topic == self.topic, Outbox.published_at.is_(None))
                    .order_by(Outbox.id)
                    .limit(self.batch_size)
                    .with_for_update(skip_locked=True)
                )
            )
            if not rows:
                return 0
            producer = self._producer
            records = [(row.id, row.key.encode(), encode_value(row), _headers(row)) for row in rows]
            delivered = bounded(
                lambda: self._transaction(producer, records), self.stall_s, f"{len(rows)} change(s)"
            )
            if self.hooks.after_kafka_commit:
                self.hooks.after_kafka_commit()
            for row in rows:
                part, off = delivered[row.id]
                row.published_at = func.now()  # type: ignore[assignment]
                row.kafka_partition, row.kafka_offset = part, off
            return len(rows)

    def _transaction(self, producer: Producer, records: list[_Record]) -> dict[int, tuple[int, int]]:
        """Produce ``records`` in one transaction of ``producer``; their (partition, offset) by
        outbox id.  Runs in a thread of its own (it touches no ORM object or session)."""
        delivered: dict[int, tuple[int, int]] = {}
        errors: list[KafkaError] = []

        def on_delivery(oid: int) -> Callable[[KafkaError | None, Any], None]:
            def report(err: KafkaError | None, msg: Any) -> None:
                if err is not None:
                    errors.append(err)
                else:
                    delivered[oid] = (msg.partition(), msg.offset())

            return report

        producer.begin_transaction()
        try:
            for oid, key, value, headers in records:
                producer.produce(
                    self.topic, key=key, value=value, headers=headers, on_delivery=on_delivery(oid)
                )
            producer.flush(30)
            if errors:  # the first refusal if there is one (told apart by its code), else the first error
                raise KafkaException(next((e for e in errors if e.code() in REFUSED), errors[0]))
            if len(delivered) != len(records):
                raise KafkaException(KafkaError(KafkaError._FAIL, "delivery failed: records not reported"))
            if self.hooks.before_kafka_commit:
                self.hooks.before_kafka_commit()
            producer.commit_transaction(30)
        except BaseException:
            try:
                producer.abort_transaction(10)
            except KafkaException:
                pass  # the next producer's init_transactions aborts it
            raise
        return delivered

    def _reconnect(self) -> None:
        """After a failed or stalled transaction: a new producer of the same transactional id (the
        old one, possibly still blocked in a call, is fenced and its transaction completed or
        aborted), then :meth:`recover` marks the rows whose records did get committed."""
        self._producer = bounded(self._new_producer, self.stall_s, "a new producer")
        self.recovered += self.recover(timeout=self.stall_s)

    def drain(self, stop: threading.Event | None = None) -> int:
        """Publish until nothing is pending; return how many rows.  A failed or stalled Kafka
        transaction is retried (:func:`~tidewatch.kafka.txn.retrying`, for up to ``retry_s`` or
        until ``stop`` is set)."""
        total = 0

        def attempt(n: int) -> int:
            if n > 1 or self._broken:
                self._broken = True
                self._reconnect()
                self._broken = False
            return self.publish_pending()

        while n := retrying(attempt, self.retry_s, f"outbox relay ({self.topic})", log, stop):
            total += n
        return total

    def run(self, stop: threading.Event | None = None, poll_interval: float = 0.5) -> None:
        """Publish forever (until ``stop`` is set), polling the outbox every ``poll_interval`` s;
        a Kafka outage longer than ``retry_s`` is logged and waited out."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                published = self.drain(stop)
            except (KafkaException, KafkaStalled) as exc:
                self._broken = True
                if stop.is_set():
                    break
                log.error("outbox relay: Kafka still unreachable (%s); trying again", exc)
                published = 0
            if published == 0:
                stop.wait(poll_interval)

    def close(self) -> None:
        try:
            self._producer.flush(5)
        finally:
            self._lock_conn.close()
            self._db_engine.dispose()

    def __enter__(self) -> OutboxRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pending_count(url: str, topics: Iterable[str] | None = None) -> int:
    """How many outbox rows wait to be published (all topics unless ``topics``)."""
    db_engine = make_db_engine(url)
    try:
        with db_engine.connect() as conn:
            q = select(func.count()).select_from(Outbox).where(Outbox.published_at.is_(None))
            if topics is not None:
                q = q.where(Outbox.topic.in_(list(topics)))
            return int(conn.scalar(q) or 0)
    finally:
        db_engine.dispose()
