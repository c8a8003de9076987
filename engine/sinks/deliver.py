"""A batch's output delivered to PostgreSQL and Kafka, the two overlapped, PostgreSQL first.

:meth:`Delivery.deliver` opens the batch's Kafka transaction and produces its records
(:meth:`engine.sinks.publish.Publisher.begin`) on a thread of its own while the delivery thread
commits the batch in PostgreSQL (:meth:`engine.sinks.store.Store.commit`, retried while the server
is unreachable); the producing thread and psycopg2 (which releases the GIL while the server
works) run at the same time.  The Kafka transaction is committed
(:meth:`~engine.sinks.publish.Publisher.commit`) only AFTER PostgreSQL committed: a record of the
open transaction is invisible to ``read_committed`` consumers, so the order exactly-once and
recovery rely on -- "PostgreSQL commit, then Kafka commit" (:mod:`engine.app`, docs/engine.md,
"Exactly once and restart") -- is the one of the sequential delivery: a crash before the Kafka
commit leaves a batch committed in PostgreSQL whose transaction never committed (the restarted
engine's producer aborts it, and :meth:`engine.app.EngineApp.recover` re-publishes the batch from
PostgreSQL); a crash before the PostgreSQL commit leaves nothing visible anywhere.  When the
PostgreSQL commit fails for good, the open transaction is aborted and the error raised.

Both steps read the batch's alert columns (:class:`engine.sinks.alert_columns.AlertColumns`),
built here once, before the threads start.

PostgreSQL's commit writes the batch's alerts as ONE ``engine_outputs`` row (migration 0011); the
per-alert tables the dashboard reads, ``alerts`` and ``current_results``, are written from it by
a third thread, behind the commit (:meth:`engine.sinks.store.Store.project`: the row expanded and
deleted in one transaction, so exactly once).  A batch counts as delivered when both commits are
done; the next :meth:`Delivery.deliver`, once its own two commits are done, waits for the previous
batch's expansion (so the per-alert tables are at most one batch behind, and an expansion slower
than the batches holds the engine back rather than falling behind without bound) and raises its
failure.  :meth:`settle`
waits for the last one.  A crash before an expansion leaves its row: the restarted engine expands
it before anything else (:meth:`engine.app.EngineApp.recover`).

Each batch's ``engine_metrics`` row carries the figures of the delivery before it
(:func:`figures`, migration 0012): the dashboard's Health view shows them.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from engine.cap import republished_results
from engine.messages import BatchOutput
from engine.runtime.retry import retry_transient
from engine.sinks.alert_columns import AlertColumns
from engine.sinks.output_block import expands, with_columns
from engine.sinks.publish import KafkaBatch, OpenTransaction, Publisher
from engine.sinks.store import Store

log = logging.getLogger("tidewatch.engine")


@dataclass(frozen=True)
class Delivered:
    """What :meth:`Delivery.deliver` did: ``committed`` False when PostgreSQL had the batch
    already (nothing written again there; Kafka's transaction is committed all the same, as
    ever); ``pg_s``: seconds until PostgreSQL committed (the Kafka records produced meanwhile);
    ``kafka_s``: seconds after it until the Kafka transaction committed."""

    committed: bool
    pg_s: float
    kafka_s: float
    #: seconds waited for the previous batch's expansion into the per-alert tables, and that
    #: expansion's own seconds (0 when there was none)
    waited_s: float = 0.0
    expanded_s: float = 0.0


def figures(d: Delivered | None) -> dict[str, float | None]:
    """The ``engine_metrics`` figures of delivery ``d`` (None: no delivery yet), in ms:
    ``delivery_ms`` (both commits, the wait for the expansion before included) and
    ``expansion_ms`` (that expansion's own time; None when there was none); migration 0012."""
    if d is None:
        return {"delivery_ms": None, "expansion_ms": None}
    return {
        "delivery_ms": (d.pg_s + d.kafka_s + d.waited_s) * 1000,
        "expansion_ms": d.expanded_s * 1000 if d.expanded_s else None,
    }


class Delivery:
    """The overlapped delivery of a store and a publisher (module docstring); owns the thread
    the Kafka records are produced on (:meth:`close` ends it).  One batch at a time."""

    def __init__(self, store: Store, publisher: Publisher, db_retry_s: float) -> None:
        self.store = store
        self.publisher = publisher
        self.db_retry_s = db_retry_s
        self._producing = ThreadPoolExecutor(1, thread_name_prefix="tidewatch-produce")
        self._expanding = ThreadPoolExecutor(1, thread_name_prefix="tidewatch-expand")
        #: the expansion in flight (its future: its seconds), at most one
        self._expansion: Future[float] | None = None
        #: the last delivery done (its figures go into the next batch's metrics row)
        self.last: Delivered | None = None

    def deliver(
        self, out: BatchOutput, *, watermark: int | None, metrics: dict[str, Any], kafka: bool = True
    ) -> Delivered:
        """Deliver ``out`` exactly once: its Kafka records produced while PostgreSQL commits it,
        its Kafka transaction committed after PostgreSQL's commit returned (see the module
        docstring).  ``kafka`` False: PostgreSQL only -- the batch's Kafka records were produced
        and committed before, elsewhere (the sharded mode's tasks: :mod:`engine.shards.produce`).
        Raises PostgreSQL's error (the Kafka transaction aborted) when the commit
        fails for good, and Kafka's when its transaction could not be committed within
        ``engine_kafka_retry_s`` (the batch then committed in PostgreSQL only: :meth:`recover
        <engine.app.EngineApp.recover>` publishes it)."""
        batch_id = out.batch_id
        t0 = time.perf_counter()
        metrics = metrics | figures(self.last)
        alerts = AlertColumns.of(out.alerts) if out.alerts else out.alerts  # once, for both sinks
        results = out.result_changes() if out.withheld else None  # capped: not its alerts
        batch = KafkaBatch(batch_id, alerts, out.dead, out.removed_keys, results)
        opened = self._producing.submit(self.publisher.begin, batch) if kafka else None
        try:
            committed = retry_transient(
                lambda: self.store.commit(out, watermark=watermark, metrics=metrics),
                f"batch {batch_id}",
                deadline_s=self.db_retry_s,
            )
        except BaseException:
            if opened is not None:
                self._abort(opened, batch_id)
            raise
        if not committed:
            log.warning("batch %d was already committed in PostgreSQL: nothing written again", batch_id)
        t1 = time.perf_counter()
        if opened is not None:
            self.publisher.commit(opened.result())  # only now: PostgreSQL committed the batch
        t2 = time.perf_counter()
        expanded_s = self.settle()
        if committed and expands(out):
            cols = alerts if isinstance(alerts, AlertColumns) else None
            self._expansion = self._expanding.submit(self._expand, with_columns(out, cols))
        self.last = Delivered(committed, t1 - t0, t2 - t1, time.perf_counter() - t2, expanded_s)
        return self.last

    def _expand(self, out: BatchOutput) -> float:
        t0 = time.perf_counter()
        retry_transient(
            lambda: self.store.project(out.batch_id, out),
            f"expanding batch {out.batch_id}",
            deadline_s=self.db_retry_s,
        )
        return time.perf_counter() - t0

    def settle(self) -> float:
        """Wait for the expansion in flight, if any (its seconds; 0.0 when none); raise its failure
        (the batch's row stays: expanded at the restart)."""
        fut, self._expansion = self._expansion, None
        return 0.0 if fut is None else fut.result()

    def _abort(self, opened: Future[OpenTransaction], batch_id: int) -> None:
        """Abort the batch's Kafka transaction once its records are produced (PostgreSQL failed)."""
        try:
            txn = opened.result()
        except Exception as exc:  # noqa: BLE001 -- PostgreSQL's error is the one raised
            log.warning("batch %d: producing its Kafka records failed too (%s)", batch_id, exc)
            return
        self.publisher.abort(txn)
        log.info("batch %d: PostgreSQL did not commit it: its Kafka transaction is aborted", batch_id)

    def close(self) -> None:
        """End the producing and expanding threads (after the steps they run, if any; an
        expansion's failure is logged: its row is expanded at the next start)."""
        try:
            self.settle()
        except Exception as exc:  # noqa: BLE001 -- closing: the row stays for the next start
            log.warning(
                "expanding the last batch into the alert log failed (%s): done at the next start", exc
            )
        self._producing.shutdown()
        self._expanding.shutdown()


def republish_committed(store: Store, publisher: Publisher, last: int, *, publish: bool = True) -> None:
    """Expand the committed batches whose ``engine_outputs`` row a stop left
    (:meth:`Store.project_pending <engine.sinks.store.Store.project_pending>`), then publish to
    Kafka the batches up to ``last`` committed in PostgreSQL whose Kafka transaction never
    committed (a crash between the two commits), from what PostgreSQL holds of them.
    ``publish`` False: the expansion only (Kafka's records were committed before PostgreSQL's:
    the sharded mode's tasks produce them, :mod:`engine.shards.produce`)."""
    n = store.project_pending()
    if n:
        log.info("expanded %d committed batches into the alert log (the engine stopped before it had)", n)
    if not publish:
        return
    published = publisher.last_published()
    for b in range(published + 1, last + 1):
        rows, dead = store.alerts_of_batch(b), store.dead_letters_of_batch(b)
        removed, withheld = store.removed_of_batch(b), store.withheld_of_batch(b)
        log.info(
            "batch %d was committed but not published to Kafka: publishing its %d alerts, %d dead "
            "letters, the tombstones of %d removed subscriptions and the results of %d withheld "
            "keys", b, len(rows), len(dead), len(removed), sum(map(len, withheld.values())),
        )  # fmt: skip
        # only the last committed batch can be here, before any new commit: current_results
        # holds the state after it, which the results of the keys it withheld are read from
        results = republished_results(rows, withheld, store.current_of(withheld))
        publisher.publish(b, rows, dead, removed, results)
