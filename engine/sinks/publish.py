"""Kafka side of the engine: alerts, current results and dead letters in one Kafka transaction.

A batch's Avro alerts (topic ``alerts``, keyed by subscription id), its result changes
(compacted topic ``results``, keyed ``subscription|key``: ``present=true`` on ENTER;
``present=false`` then a tombstone on EXIT; a tombstone for every key of a subscription deleted
or paused) and its dead letters are produced in ONE Kafka transaction, committed after the batch
is committed in PostgreSQL (:mod:`engine.sinks.store`); the alert and result
records of the whole batch are encoded together (:mod:`engine.sinks.alert_wire`, one Numba kernel,
from the batch's columns shared with the PostgreSQL commit) and produced by two tight loops over
the prebuilt bytes (``Producer.produce`` takes one record per call: the floor of the Python API;
``produce_batch`` measured no faster, its per-record dicts costing what the calls save).  The
producer reports deliveries only when they fail (``delivery.report.only.error``): no Python
callback per delivered record (confluent-kafka's C trampoline still takes the GIL once per
delivery report, docs/engine.md).  The same
transaction commits a *progress marker*: the offset ``batch_id + 1`` of a private
consumer group on partition 0 of ``alerts`` (``send_offsets_to_transaction``), so the
marker is visible exactly when the batch's records are.  After a crash the engine reads
the marker and re-publishes the last PostgreSQL-committed batch only if its Kafka
transaction never committed: consumers with ``isolation.level=read_committed`` see every
alert exactly once.  The transactional id fences a zombie engine of the same id.  Both the
transactional id and the marker's group are per engine id (``tidewatch-engine-<id>``,
``tidewatch-engine-<id>-progress``), as the batch ids in PostgreSQL are
(:class:`engine.sinks.store.Store`): engines with other ids on the same topics (shards, a second
deployment) neither see nor move this engine's progress.

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

A transaction in two steps (the engine's overlapped delivery, :mod:`engine.sinks.deliver`):
:meth:`Publisher.begin` opens the batch's transaction and produces its records -- invisible to
``read_committed`` consumers until the commit -- and may run while PostgreSQL commits the batch;
:meth:`Publisher.commit` then commits it (marker and records together), with the retries above,
and :meth:`Publisher.abort` aborts it when PostgreSQL did not commit the batch.
:meth:`Publisher.publish` is the two steps in a row.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from engine.dead_letter import DeadLetters
from engine.messages import Alert, AlertSeq
from engine.sinks.alert_columns import AlertColumns
from engine.sinks.alert_wire import encode_alerts, warm_up
from tidewatch.kafka.client import librdkafka_config
from tidewatch.kafka.codes import COORDINATOR, error_code
from tidewatch.kafka.topics import create_topics, topic_specs
from tidewatch.kafka.txn import Call, DeliveryErrors, KafkaStalled, bounded, retrying
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


def marker_reader(settings: Settings, bootstrap: str, tid: str) -> Consumer:
    """The reader of the progress marker of transactional id ``tid`` (its group
    ``<tid>-progress``; module docstring).  Reading it fences nothing: a process that only asks
    how far another's transactions went (a shard's, :mod:`engine.shards.produce`) uses this,
    never a producer of that id."""
    return Consumer(
        librdkafka_config(
            settings,
            "engine",
            bootstrap,
            **{
                "group.id": f"{tid}-progress",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            },
        )
    )


def read_marker(marker: Consumer, tp: TopicPartition) -> int:
    """The id of the last batch whose transaction moved ``marker``'s group on ``tp`` (-1: none).

    Retries while the group coordinator is not ready (a fresh broker creates
    ``__consumer_offsets`` on first use)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            got = marker.committed([tp], timeout=30)[0]
            return -1 if got.offset < 0 else got.offset - 1
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = bool(getattr(err, "retriable", lambda: False)()) or error_code(exc) in COORDINATOR
            if not retriable or time.monotonic() > deadline:
                raise
            log.info("Kafka group coordinator not ready (%s); retrying", err)
            time.sleep(1.0)


def published_up_to(settings: Settings, bootstrap: str, engine_id: str) -> int:
    """The last batch the publisher of ``engine_id`` (:class:`Publisher`) committed in Kafka
    (-1: none), read without a producer of its transactional id (so without fencing it)."""
    marker = marker_reader(settings, bootstrap, f"tidewatch-engine-{engine_id}")
    try:
        return read_marker(marker, TopicPartition(settings.topic_alerts, 0))
    finally:
        marker.close()


#: alerts as :meth:`Publisher.publish` takes them: Alert objects, their columns, or alert rows
Alerts = AlertSeq | list[Alert] | list[dict[str, Any]] | AlertColumns


@dataclass(frozen=True)
class KafkaBatch:
    """One batch's Kafka output, as :meth:`Publisher.publish` takes it (see there)."""

    batch_id: int
    alerts: Alerts
    dead: DeadLetters | None = None
    removed: Mapping[str, Sequence[str]] | None = None
    results: Alerts | None = None


@dataclass
class OpenTransaction:
    """A batch's Kafka transaction opened by :meth:`Publisher.begin`: its records produced on
    ``producer`` (not committed: invisible to ``read_committed`` consumers), or ``error``, the
    Kafka failure (or stall) that stopped the step, which :meth:`Publisher.commit` retries.  The
    batch's output is kept for those retries (a new producer, a whole transaction again)."""

    batch: KafkaBatch
    producer: Producer
    marker: Consumer
    error: KafkaException | KafkaStalled | None = None
    #: the progress marker's ``send_offsets_to_transaction``, sent beside the produce loops
    marking: Marking | None = None


class Marking(Call[None]):
    """The progress marker of an open transaction sent on a thread of its own
    (``send_offsets_to_transaction``, a round trip to the group coordinator that librdkafka
    waits for with the GIL released), started right after the transaction begins, so the
    round trip overlaps the produce loops instead of following them.  Both go into the same
    transaction, so the marker is still visible exactly when the batch's records are (librdkafka
    takes records while the call is in flight; the transaction's other calls -- commit, abort --
    wait for it: :meth:`~tidewatch.kafka.txn.Call.wait`, with no timeout: the caller bounds it,
    :meth:`Publisher._bounded`, and gets the call's error raised again).  A daemon thread
    (:class:`~tidewatch.kafka.txn.Call`): a call blocked past its own timeout (librdkafka issues
    5456 and 5511) is left on its producer, which the retry abandons."""

    def __init__(self, send: Callable[[], None]) -> None:
        super().__init__(send, "the progress marker", name="tidewatch-marker")


class Publisher:
    """Transactional producer of the engine's Kafka output (see module docstring)."""

    #: librdkafka settings of the producer past the transactional ones (delivery reports of
    #: failed records only: :class:`~tidewatch.kafka.txn.DeliveryErrors` keeps only refusals)
    producer_config: dict[str, Any] = {  # noqa: RUF012 - read only
        "linger.ms": 5,
        "compression.type": "lz4",
        "delivery.report.only.error": True,
    }

    def __init__(self, bootstrap: str, settings: Settings, engine_id: str = "default") -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.marker_tp = TopicPartition(settings.topic_alerts, 0)
        self.tid = f"tidewatch-engine-{engine_id}"
        self.producer, self.marker = self._clients()
        #: how a batch's alerts are produced (tests/engine/sinks/test_publish_batch.py swaps in
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
                    **self.producer_config,
                },
            )
        )
        producer.init_transactions(60)
        return producer, marker_reader(s, self.bootstrap, self.tid)

    def last_published(self) -> int:
        """The id of the last batch whose Kafka transaction committed (-1 when none).

        Retries while the group coordinator is not ready (a fresh broker creates
        ``__consumer_offsets`` on first use).
        """
        return read_marker(self.marker, self.marker_tp)

    def publish(
        self,
        batch_id: int,
        alerts: Alerts,
        dead: DeadLetters | None = None,
        removed: Mapping[str, Sequence[str]] | None = None,
        results: Alerts | None = None,
    ) -> None:
        """Produce one batch's output and its progress marker in one transaction, exactly once:
        a failed or stalled transaction is retried with a new producer unless the marker shows
        that it committed (see the module docstring).  ``removed``: ``{subscription_id: keys}``
        of the subscriptions the batch removed (:attr:`engine.messages.BatchOutput.removed_keys`):
        a tombstone for each ``subscription|key`` on ``results``, before the batch's own result
        records (a subscription deleted and subscribed again in one batch has its new result
        after them).  ``results``: the batch's result changes when they are not its alerts (the
        alert cap withheld some: :meth:`engine.messages.BatchOutput.result_changes`, or the rows
        :func:`engine.cap.republished_results` gives): ``results`` gets their records instead of
        the alerts' (no record for a CAPPED one).  :meth:`begin` then :meth:`commit`."""
        self.commit(self.begin(KafkaBatch(batch_id, alerts, dead, removed, results)))

    def begin(self, batch: KafkaBatch) -> OpenTransaction:
        """Open ``batch``'s transaction and produce its records (those :meth:`publish` produces,
        in the same order), without committing it: nothing is visible to ``read_committed``
        consumers, and the progress marker is not moved.  A Kafka failure or a stall (past
        ``engine_kafka_stall_s``) is not raised but kept in the returned transaction, for
        :meth:`commit` to retry; any other error is raised.  Exactly one of :meth:`commit` and
        :meth:`abort` must follow, before the next :meth:`begin`."""
        txn = OpenTransaction(batch, self.producer, self.marker)
        try:
            self._bounded(lambda: self._produce(txn, batch), f"batch {batch.batch_id}")
        except (KafkaException, KafkaStalled) as exc:
            txn.error = exc
        return txn

    def commit(self, txn: OpenTransaction) -> None:
        """Commit ``txn`` with its progress marker (``batch_id + 1``), exactly once: when its
        step failed, or the commit fails or stalls, the whole transaction is retried with a new
        producer unless the marker shows that it committed, as :meth:`publish` does (module
        docstring); the last error is raised after ``engine_kafka_retry_s``."""
        batch_id = txn.batch.batch_id

        def attempt(n: int) -> None:
            if n > 1:
                # the old clients are dropped as they are: a call may still be blocked in them
                self.producer, self.marker = self._bounded(self._clients, "a new producer")
                if self._bounded(self.last_published, "the progress marker") >= batch_id:
                    log.info("batch %d: its Kafka transaction did commit before the failure", batch_id)
                    return
                self._bounded(lambda: self._transaction(txn.batch), f"batch {batch_id}")
            elif txn.error is not None:
                raise txn.error
            else:
                self._bounded(
                    lambda: self._commit(txn.producer, txn.marker, batch_id, txn.marking), f"batch {batch_id}"
                )

        retrying(attempt, self.settings.engine_kafka_retry_s, f"batch {batch_id}", log)

    def abort(self, txn: OpenTransaction) -> None:
        """Abort ``txn`` (its batch is not to be published: PostgreSQL did not commit it); its
        records are never visible to ``read_committed`` consumers.  Does not raise: a failure is
        logged, and the open transaction is then aborted when the producer is next re-created
        (the next batch's :meth:`begin` fails on it and :meth:`commit` retries with a new one)."""
        if txn.error is not None:  # the step failed or stalled: nothing to abort safely here; a
            return  # transaction it left open fails the next begin, whose commit re-creates the producer
        marking = txn.marking

        def abort() -> None:
            if marking is not None:  # the transaction's calls one at a time: the marker's first
                with contextlib.suppress(Exception):  # its failure: aborted with the rest anyway
                    marking.wait()
            txn.producer.abort_transaction(60)

        try:
            self._bounded(abort, f"batch {txn.batch.batch_id}: abort")
        except (KafkaException, KafkaStalled) as exc:
            log.warning("batch %d: its Kafka transaction could not be aborted (%s)", txn.batch.batch_id, exc)

    def _bounded(self, fn: Callable[[], T], what: str) -> T:
        """``fn()`` given up (:class:`~tidewatch.kafka.txn.KafkaStalled`) after ``engine_kafka_stall_s``."""
        return bounded(fn, self.settings.engine_kafka_stall_s, what)

    def _transaction(self, batch: KafkaBatch) -> None:
        """The whole transaction on the current producer: records, marker, commit."""
        txn = OpenTransaction(batch, self.producer, self.marker)
        self._produce(txn, batch)
        self._commit(txn.producer, txn.marker, batch.batch_id, txn.marking)

    def _produce(self, txn: OpenTransaction, batch: KafkaBatch) -> None:
        """Begin a transaction on ``txn``'s producer, send its progress marker beside
        (:class:`Marking`, into ``txn.marking``) and produce ``batch``'s records into it: the
        tombstones of its removed subscriptions, alerts and results, dead letters."""
        s = self.settings
        now = int(time.time() * 1000)
        alerts, dead, removed, results = batch.alerts, batch.dead, batch.removed, batch.results
        p = txn.producer
        p.begin_transaction()
        txn.marking = Marking(lambda: self._send_marker(p, txn.marker, batch.batch_id))
        try:
            if removed:
                keys = [f"{sid}|{key}".encode() for sid, ks in removed.items() for key in ks]
                _produce_all(p, s.topic_results, [None] * len(keys), keys)
            if results is None:
                self.produce_alerts(p, s, alerts, batch.batch_id, now)
            else:
                produce_alerts(p, s, alerts, batch.batch_id, now, results)
            if dead is not None and len(dead):  # rare: fastavro record by record
                recs = dead.records(now)
                _produce_all(
                    p,
                    s.topic_dead_letter,
                    [encode("dead_letter", rec) for rec in recs],
                    [rec["source_topic"].encode() for rec in recs],
                )
        except KafkaException as exc:
            self.deliveries.reraise(p, exc)  # an ACL refused the records: say so, by its code
            raise

    def _send_marker(self, p: Producer, marker: Consumer, batch_id: int) -> None:
        """Move the progress marker to ``batch_id + 1`` in ``p``'s open transaction."""
        p.send_offsets_to_transaction(
            [TopicPartition(self.settings.topic_alerts, 0, batch_id + 1)],
            marker.consumer_group_metadata(),
            60,
        )

    def _commit(self, p: Producer, marker: Consumer, batch_id: int, marking: Marking | None = None) -> None:
        """Commit ``p``'s open transaction with the progress marker at ``batch_id + 1``: the one
        ``marking`` sent (waited for here), or sent now when none."""
        try:
            if marking is None:
                self._send_marker(p, marker, batch_id)
            else:
                marking.wait()
            p.commit_transaction(120)
        except KafkaException as exc:
            self.deliveries.reraise(p, exc)  # an ACL refused the records: say so, by its code
            raise

    def close(self) -> None:
        self.producer.flush(30)
        self.marker.close()


def produce_alerts(
    p: Producer, s: Any, alerts: Alerts, batch_id: int, now: int, results: Alerts | None = None
) -> None:
    """Produce a batch's alert, result and tombstone records (encoded together from the batch's
    columns, :func:`engine.sinks.alert_wire.encode_alerts`): every ``alerts`` record in the
    alerts' order, then every ``results`` record, each EXIT's followed by its tombstone.  Each
    topic's records keep the alerts' order (per partition too), as the one interleaved loop
    before (``bench/delivery_bench.py`` as of commit 34073b8) gave them.  ``results`` (a capped batch: its
    result changes, see :meth:`Publisher.publish`): the ``results`` records are theirs, in their
    order, encoded apart."""
    recs = encode_alerts(alerts, batch_id, now)
    _produce_all(p, s.topic_alerts, recs.alert_values, recs.alert_keys)
    if results is not None:
        recs = encode_alerts(results, batch_id, now, slot="results")
    present = np.asarray(recs.present, np.bool_)
    if present.all():
        _produce_all(p, s.topic_results, recs.result_values, recs.result_keys)
    else:  # a tombstone after each EXIT's result record: its key again, no value
        reps = np.where(present, 1, 2)
        at = np.repeat(np.arange(len(present)), reps)
        vals = _objects(recs.result_values)[at]
        vals[(np.cumsum(reps) - 1)[~present]] = None
        _produce_all(p, s.topic_results, vals.tolist(), _objects(recs.result_keys)[at].tolist())
    p.poll(0)


def _objects(items: list[bytes]) -> np.ndarray:
    """``items`` as a NumPy array of objects (one dimension, whatever the items are)."""
    out = np.empty(len(items), object)
    out[:] = items
    return out


def _produce_all(p: Producer, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes]) -> None:
    """``produce(topic, values[i], keys[i])`` for every i, in order: one call per record, the
    floor of confluent-kafka's Python API.  A full local queue (``BufferError``) waits for
    deliveries, then the record is produced again."""
    produce = p.produce
    i = 0
    n = len(values)
    while i < n:
        try:
            for v, k in zip(values[i:] if i else values, keys[i:] if i else keys, strict=True):
                produce(topic, v, k)
                i += 1
        except BufferError:  # the local queue is full: serve deliveries, then go on from record i
            p.poll(1.0)


def _produce_alerts_per_record(p: Producer, s: Any, alerts: Alerts, batch_id: int, now: int) -> None:
    """The alert loop before :func:`produce_alerts`: a dict and two fastavro encodings per alert.
    Kept as the reference of tests/engine/sinks/test_alert_wire.py."""
    if isinstance(alerts, AlertColumns):
        raise TypeError("the per-record reference takes Alert objects or rows")
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
