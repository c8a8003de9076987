"""The Tidewatch engine: Spark Structured Streaming over Kafka, exact alerts out, exactly once.

Data flow (docs/ARCHITECTURE.md "Data flow", docs/engine.md; figures in docs/measurements/engine.md):

* Spark reads ``trades``, ``packets`` and ``subscriptions`` with its Kafka source; every
  micro-batch goes to :meth:`EngineApp.on_batch` (``foreachBatch``).
* The batch's records reach the driver as Arrow (``DataFrame.toArrow``); they are decoded
  column-wise by the Numba kernel (:mod:`engine.decode`), bad records become dead letters,
  and :class:`engine.core.EngineCore` applies subscription changes first (PSoup), feeds the
  evaluator and looks up every rule at every pane boundary up to *now*.
* Output, idempotent per batch id: the alert log, current results, batch id and metrics in
  ONE PostgreSQL transaction (:mod:`engine.sinks.store`; a committed batch id is skipped), then
  alerts / results / dead letters in ONE Kafka transaction with a progress marker
  (:mod:`engine.sinks.publish`).
* Restart: the per-batch Kafka offset ranges are logged in ``<checkpoint>/tidewatch/batches``
  before the commit, and the whole driver state is snapshotted every
  ``snapshot_every_batches`` batches (written by a forked child while the batches go on:
  :mod:`engine.runtime.snapshot_writer`).  On start the newest snapshot at or
  before the last committed batch is loaded and the batches after it are re-read from
  Kafka by offset and re-run with no output, so the state equals the state at the last
  committed batch; a committed batch whose Kafka transaction is missing is re-published
  from PostgreSQL.  Spark's own checkpoint then re-delivers the first uncommitted batch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.core import EngineCore, make_evaluator, rule_compiler
from engine.decode import STREAMS, predecode
from engine.errors import SnapshotUnreadable
from engine.executors.merge import ExecutorBatch, merge_output
from engine.executors.preagg import BatchParams, preaggregate, spark_preaggregate
from engine.messages import BatchOutput, SubscriptionChange, parse_subscription_change
from engine.runtime.gc_tuning import freeze_state, tune_gc
from engine.runtime.retry import retry_transient
from engine.runtime.snapshot_writer import SnapshotWriter, atomic_write, remove_stale_temporaries
from engine.sinks.publish import Publisher, ensure_topics
from engine.sinks.store import Store
from engine.sources.readers import RECORD_COLUMNS, offset_ranges, read_ranges
from tidewatch.kafka.client import spark_options

if TYPE_CHECKING:
    from tidewatch.settings import Settings

log = logging.getLogger("tidewatch.engine")


def split_topics(tbl: pa.Table, names: dict[str, str]) -> dict[str, pa.Table]:
    """Records of each topic (``names``: role -> topic), roles trades, packets, subscriptions."""
    out = {}
    for role, topic in names.items():
        if not tbl.num_rows:
            out[role] = tbl
            continue
        mask = pc.equal(tbl.column("topic"), topic)
        hits = pc.sum(mask).as_py() or 0
        # the usual batch is one topic's records: no copy of them, and none for the others
        out[role] = tbl if hits == tbl.num_rows else tbl.slice(0, 0) if hits == 0 else tbl.filter(mask)
    return out


def subscription_changes(tbl: pa.Table) -> list[SubscriptionChange]:
    """Parsed subscription changes of a batch, in (partition, offset) order; bad ones logged."""
    if tbl.num_rows == 0:
        return []
    order = np.lexsort(
        (
            tbl.column("offset").to_numpy(zero_copy_only=False),
            tbl.column("partition").to_numpy(zero_copy_only=False),
        )
    )
    keys = tbl.column("key").to_pylist()
    vals = tbl.column("value").to_pylist()
    out = []
    for i in order:
        try:
            out.append(parse_subscription_change(keys[i], vals[i]))
        except (ValueError, KeyError) as exc:
            log.warning("subscription record %d ignored: %s", int(i), exc)
    return out


def default_core(settings: Settings) -> EngineCore:
    """An empty :class:`EngineCore` with the shared-strategy evaluator configured by ``settings``."""
    return EngineCore(
        pane_ms=settings.pane_ms,
        allowed_lateness_ms=settings.allowed_lateness_ms,
        max_future_ms=settings.max_future_ms,
        idle_timeout_ms=getattr(settings, "engine_idle_timeout_ms", 5_000),
        lookup_every_ms=getattr(settings, "engine_lookup_every_ms", None),
        evaluator_factory=lambda: make_evaluator(settings),
        compile_rule=rule_compiler(settings),
    )


@dataclass
class _Preaggregated:
    """A batch through the executors (or :func:`preaggregate` in process, on replay): the
    parameters it was made with and its merged output (``engine_preaggregate = "executors"``)."""

    params: BatchParams
    eb: ExecutorBatch


@dataclass
class _Evaluated:
    """A batch evaluated by the core, waiting for its output to be delivered."""

    batch_id: int
    out: BatchOutput
    metrics: dict[str, Any]
    watermark: int | None
    rules: int
    t0: float  # perf_counter at the start of the evaluation
    read_s: float  # Kafka read (Spark: + toArrow) of the batch
    core_s: float  # evaluation


class EngineApp:
    """One engine instance: state, sinks and the ``foreachBatch`` function."""

    def __init__(
        self,
        settings: Settings,
        *,
        bootstrap: str | None = None,
        pg_url: str | None = None,
        checkpoint: Path | None = None,
        engine_id: str = "default",
        core_factory: Callable[[], EngineCore] | None = None,
    ) -> None:
        from tidewatch.db.session import make_db_engine

        self.settings = settings
        self.bootstrap = bootstrap or settings.kafka_bootstrap
        self.checkpoint = Path(
            checkpoint or settings.checkpoint_dir or (settings.run_dir / "engine-checkpoint")
        )
        self.state_dir = self.checkpoint / "tidewatch"
        self.topics = {
            "trades": settings.topic_trades,
            "packets": settings.topic_packets,
            "subscriptions": settings.topic_subscriptions,
        }
        self.engine_id = engine_id
        self._core_factory = core_factory or (lambda: default_core(settings))
        self.store = Store(make_db_engine(pg_url or settings.sqlalchemy_url))
        ensure_topics(self.bootstrap, settings)
        self.publisher = Publisher(self.bootstrap, settings, engine_id)
        self.core = self._core_factory()
        self.batches_done = 0
        self.read_s = 0.0  # seconds the last batch took to reach the driver (Spark read + toArrow)
        self._worker: Any = None  # pipelined mode: the thread evaluating a batch
        self._out_worker: Any = None  # pipelined mode: the thread delivering a batch's output
        self._inflight: Any = None  # the batch being evaluated
        self._delivering: Any = None  # the output being delivered
        self._evaluated = 0  # batches evaluated since start (snapshot cadence)
        self.snapshots = SnapshotWriter(in_child=getattr(settings, "engine_snapshot_in_child", True))
        #: (start of evaluation, end of delivery, events) of the delivered batches (perf_counter;
        #: the last 50,000-100,000, for benchmarks and metrics)
        self.delivered: list[tuple[float, float, int]] = []
        self.totals: dict[str, float] = {"events": 0, "alerts": 0, "dead_letters": 0, "seconds": 0.0}
        #: ``engine_preaggregate = "executors"``: decode and pre-aggregation in Spark's tasks
        self.executors = getattr(settings, "engine_preaggregate", "driver") == "executors"
        self.executor_pids: set[int] = set()  # process ids the executors' pane rows came from

    # ------------------------------------------------------------------ recovery
    def _snapshot_path(self, batch_id: int) -> Path:
        return self.state_dir / "snapshots" / f"{batch_id:012d}.bin"

    def _batch_log(self, batch_id: int) -> Path:
        return self.state_dir / "batches" / f"{batch_id:012d}.json"

    def recover(self) -> None:
        """Bring the state to the last committed batch and finish its Kafka publication."""
        last = self.store.last_committed()
        for tmp in remove_stale_temporaries(self.state_dir / "snapshots"):
            log.info("removed %s, a snapshot left half-written by a stopped engine", tmp.name)
        snaps = sorted((self.state_dir / "snapshots").glob("*.bin")) if self.state_dir.exists() else []
        snaps = [s for s in snaps if int(s.stem) <= last]
        self.core = self._core_factory()
        if snaps:
            try:
                self.core = EngineCore.from_bytes(snaps[-1].read_bytes(), rule_compiler(self.settings))
                log.info("restored the state snapshot of batch %d", self.core.last_batch)
            except SnapshotUnreadable as exc:  # another state format, moved classes, a damaged file
                log.warning(
                    "the state snapshot %s cannot be read by this engine (%s); rebuilding the state by "
                    "replaying every committed batch from Kafka",
                    snaps[-1],
                    exc,
                )
        first = self.core.last_batch + 1
        if last >= first:
            log.info("replaying batches %d..%d from Kafka (no output) to rebuild the state", first, last)
            for b in range(first, last + 1):
                path = self._batch_log(b)
                if not path.exists():
                    raise RuntimeError(f"batch {b} is committed but its offset log {path} is missing")
                ranges = json.loads(path.read_text())
                tbl = read_ranges(self.bootstrap, ranges, settings=self.settings)
                self._process(b, self._replay_batch(tbl, b))
        # pipelined mode: Spark may have committed batches whose output was not committed yet;
        # they are finished here from their offset logs (Spark will not deliver them again)
        logged = (
            sorted(int(f.stem) for f in (self.state_dir / "batches").glob("*.json"))
            if self.state_dir.exists()
            else []
        )
        pending = [b for b in logged if b > last]
        published = self.publisher.last_published()
        for b in range(published + 1, last + 1):
            rows = self.store.alerts_of_batch(b)
            log.info(
                "batch %d was committed but not published to Kafka: publishing its %d alerts", b, len(rows)
            )
            self.publisher.publish(b, rows)
        for b in pending:
            ranges = json.loads(self._batch_log(b).read_text())
            log.info("batch %d was read but its output not committed: finishing it from its offset log", b)
            self.handle(self._replay_batch(read_ranges(self.bootstrap, ranges, settings=self.settings), b), b)
        log.info(
            "state at batch %d: %d rules, watermark %s",
            self.core.last_batch,
            len(self.core.rules),
            self.core.watermark,
        )

    # ------------------------------------------------------------------ batches
    def _prepare(self, tbl: pa.Table) -> dict[str, Any]:
        """A batch's records by role, its event streams decoded and checked for what does not
        depend on the engine's state (:func:`engine.decode.predecode`).  Pipelined, this runs in
        the reading thread while the evaluation thread works on the previous batch."""
        parts: dict[str, Any] = split_topics(tbl, self.topics)
        for stream, records in parts.items():
            if stream in STREAMS:
                parts[stream] = predecode(stream, records, max_future_ms=self.core.max_future_ms)
        return parts

    def _replay_batch(self, tbl: pa.Table, batch_id: int) -> pa.Table | _Preaggregated:
        """A batch re-read from Kafka by its offset log, ready for :meth:`_process`: as read
        (driver mode), or through the executors' pure function in this process (executors mode:
        the same :class:`~engine.executors.preagg.Preaggregator`, so the state replayed equals
        the state built live)."""
        if not self.executors:
            return tbl
        params = self.core.batch_params(self.topics)
        return _Preaggregated(params, merge_output(preaggregate(tbl, params), params, batch=batch_id))

    def _process(self, batch_id: int, batch: pa.Table | dict[str, Any] | _Preaggregated) -> Any:
        if isinstance(batch, _Preaggregated):
            changes = subscription_changes(batch.eb.records)
            return self.core.process_preaggregated(batch_id, batch.eb, batch.params, changes)
        parts = dict(batch) if isinstance(batch, dict) else self._prepare(batch)
        changes = subscription_changes(parts.pop("subscriptions"))
        return self.core.process(batch_id, parts, changes)

    def on_batch(self, df: Any, batch_id: int) -> None:
        """``foreachBatch`` entry point (idempotent per batch id).

        Pipelined (``engine_pipeline``): the batch's records are collected and its offset ranges
        logged durably, then it is handed to the evaluation thread and this returns, so Spark
        reads the next batch from Kafka (in its JVM) while this one is evaluated; the output of
        an evaluated batch (PostgreSQL, then Kafka) is delivered by a second thread while the
        next batch is evaluated.  At most one batch is being evaluated and one delivered (the
        next call waits, and re-raises a failure of either so the query stops); outputs are
        delivered in batch order.  Spark may then have committed batches whose output is not
        committed yet: :meth:`recover` finishes such batches from their offset logs."""
        if self.executors:
            self.on_batch_executors(df, int(batch_id))
            return
        t0 = time.perf_counter()
        tbl = df.select(*RECORD_COLUMNS).toArrow()
        self.accept(tbl, int(batch_id), time.perf_counter() - t0)

    def on_batch_executors(self, df: Any, batch_id: int) -> None:
        """:meth:`on_batch` with ``engine_preaggregate = "executors"`` (unpipelined): the batch's
        parameters from the core at batch start (:meth:`EngineCore.batch_params`), its records
        decoded and pre-aggregated by Spark's tasks (:func:`spark_preaggregate`), only their
        output collected and merged (:func:`merge_output`); its offset ranges (from that output,
        the format :func:`offset_ranges` writes) logged durably, then evaluated and delivered."""
        if batch_id <= self.core.last_batch:
            log.info("batch %d is already in the state (committed before a restart): skipped", batch_id)
            return
        t0 = time.perf_counter()
        params = self.core.batch_params(self.topics)
        eb = merge_output(spark_preaggregate(df, params).toArrow(), params, batch=batch_id)
        self.read_s = time.perf_counter() - t0
        self.executor_pids |= eb.pids
        atomic_write(self._batch_log(batch_id), json.dumps(eb.offsets).encode())
        self.handle(_Preaggregated(params, eb), batch_id)

    def accept(self, tbl: pa.Table, batch_id: int, read_s: float) -> None:
        """Take one batch of Kafka records (Arrow, :data:`RECORD_COLUMNS`) that took ``read_s``
        to reach the driver: log its offset ranges durably (:func:`offset_ranges`), then handle
        it here, or (pipelined) hand it to the evaluation thread.  Called by :meth:`on_batch`."""
        self.read_s = read_s
        pipelined = getattr(self.settings, "engine_pipeline", False)
        if pipelined:
            t0 = time.perf_counter()
            batch: pa.Table | dict[str, Any] = self._prepare(tbl)  # overlaps the batch in flight
            self.read_s = read_s = read_s + time.perf_counter() - t0
            self.drain()
        atomic_write(self._batch_log(int(batch_id)), json.dumps(offset_ranges(tbl)).encode())
        if not pipelined:
            self.handle(tbl, int(batch_id))
            return
        if self._worker is None:
            from concurrent.futures import ThreadPoolExecutor

            self._worker = ThreadPoolExecutor(1, thread_name_prefix="tidewatch-batch")
            self._out_worker = ThreadPoolExecutor(1, thread_name_prefix="tidewatch-output")
        self._inflight = self._worker.submit(self._handle_pipelined, batch, int(batch_id), self.read_s)

    def drain(self, output: bool = False) -> None:
        """Wait for the batch being evaluated (pipelined mode) and, with ``output``, for the
        output being delivered; re-raise their failure."""
        fut, self._inflight = self._inflight, None
        if fut is not None:
            fut.result()
        if output:
            out, self._delivering = self._delivering, None
            if out is not None:
                out.result()

    def handle(self, tbl: pa.Table | _Preaggregated, batch_id: int) -> None:
        """Process one batch of Kafka records (Arrow) and deliver its output exactly once (its
        offset log is written already: by :meth:`accept`, or it is where :meth:`recover` read
        the batch from)."""
        done = self._evaluate(tbl, batch_id, self.read_s)
        if done is not None:
            self._deliver(done)

    def _handle_pipelined(self, batch: dict[str, Any], batch_id: int, read_s: float) -> None:
        """Evaluation thread: evaluate, wait for the previous batch's output, hand this one's on."""
        done = self._evaluate(batch, batch_id, read_s)
        prev, self._delivering = self._delivering, None
        if prev is not None:
            prev.result()
        if done is not None:
            self._delivering = self._out_worker.submit(self._deliver, done)

    def _evaluate(
        self, tbl: pa.Table | dict[str, Any] | _Preaggregated, batch_id: int, read_s: float
    ) -> _Evaluated | None:
        """Run one batch through the core (no output yet); None if it is already in the state.
        The state snapshot, when due, is written here, before the next batch changes the state
        (:meth:`recover` ignores a snapshot of a batch whose output was not committed)."""
        if batch_id <= self.core.last_batch:
            log.info("batch %d is already in the state (committed before a restart): skipped", batch_id)
            return None
        t0 = time.perf_counter()
        out = self._process(batch_id, tbl)
        n_events = sum(out.events.values())
        core_s = time.perf_counter() - t0
        metrics = {
            "events_per_s": n_events / core_s if core_s > 0 else None,
            "batch_ms": core_s * 1000,
            "lag_ms": None if self.core.max_ts is None else time.time() * 1000 - self.core.max_ts,
            "alerts": len(out.alerts),
            "dead_letters": len(out.dead),
            "dead_letter_reasons": {r: int(n) for r, n in out.dead.counts().items() if n},
            "state_bytes": self.core.state_nbytes(),
        }
        self._evaluated += 1
        self.snapshots.poll()
        if self._evaluated % max(1, self.settings.snapshot_every_batches) == 0:
            self.snapshot()
        return _Evaluated(
            batch_id, out, metrics, self.core.watermark, len(self.core.rules), t0, read_s, core_s
        )

    def _deliver(self, e: _Evaluated) -> None:
        """The batch's output: PostgreSQL (one transaction, idempotent by batch id), then Kafka."""
        out, batch_id = e.out, e.batch_id
        t_pg = time.perf_counter()
        committed = retry_transient(
            lambda: self.store.commit(out, watermark=e.watermark, metrics=e.metrics),
            f"batch {batch_id}",
            deadline_s=self.settings.engine_db_retry_s,
        )
        if not committed:
            log.warning("batch %d was already committed in PostgreSQL: nothing written again", batch_id)
        t_kafka = time.perf_counter()
        self.publisher.publish(batch_id, out.alerts, out.dead, out.removed)
        t_done = time.perf_counter()
        self.batches_done += 1
        n_events = sum(out.events.values())
        total_s = t_done - e.t0
        for k, v in (
            ("events", n_events),
            ("alerts", len(out.alerts)),
            ("dead_letters", len(out.dead)),
            ("seconds", total_s),
        ):
            self.totals[k] += v
        self.delivered.append((e.t0, t_done, n_events))
        if len(self.delivered) > 100_000:  # a long-running engine keeps the recent half only
            del self.delivered[:50_000]
        dl = ", ".join(f"{n} {r}" for r, n in out.dead.counts().items() if n) or "none"
        log.info(
            "batch %d: %d events (%s), dead letters: %s; %d lookups up to %s; %d alerts; %d rules; "
            "done in %.0f ms (read %.0f, evaluation %.0f, waiting for output %.0f, PostgreSQL %.0f, "
            "Kafka %.0f)",
            batch_id, n_events, ", ".join(f"{k} {v}" for k, v in out.events.items()), dl, len(out.lookups),
            out.lookups[-1] if out.lookups else "-", len(out.alerts), e.rules, total_s * 1000,
            e.read_s * 1000, e.core_s * 1000, (t_pg - e.t0 - e.core_s) * 1000, (t_kafka - t_pg) * 1000,
            (t_done - t_kafka) * 1000,
        )  # fmt: skip

    def snapshot(self) -> Path:
        """Snapshot the state of the last processed batch (keeps the newest three), written by a
        forked child while the batches go on (:mod:`engine.runtime.snapshot_writer`)."""
        path = self._snapshot_path(self.core.last_batch)
        self.snapshots.write(self.core.last_batch, path, self.core.to_bytes)
        return path

    # ------------------------------------------------------------------ Spark
    def start(
        self,
        spark: Any,
        trigger_seconds: float | None = None,
        max_offsets_per_trigger: int | None = None,
        available_now: bool = False,
    ) -> Any:
        """Recover, then start the streaming query; returns the ``StreamingQuery``.

        ``available_now``: process what is in Kafka now (in batches of at most
        ``max_offsets_per_trigger`` records), then stop -- for replays and benchmarks.
        """
        tune_gc(self.settings.engine_gc_threshold)
        if self.executors:
            log.info(
                "engine_preaggregate = executors: batches decoded and pre-aggregated by Spark's tasks, unpipelined"
            )
        self.recover()
        freeze_state()
        max_offsets_per_trigger = max_offsets_per_trigger or self.settings.engine_max_offsets_per_trigger
        trig = trigger_seconds if trigger_seconds is not None else self.settings.trigger_seconds
        reader = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", ",".join(self.topics.values()))
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", "false")
            .option("kafka.isolation.level", "read_committed")
            .options(**spark_options(self.settings, "engine"))  # SASL/SCRAM in the scram mode
        )
        if max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
        writer = reader.load().writeStream.foreachBatch(self.on_batch)
        writer = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime=f"{trig} seconds")
        )
        return (
            writer.option("checkpointLocation", str(self.checkpoint / "spark"))
            .queryName(f"tidewatch-engine-{self.engine_id}")
            .start()
        )

    def close(self) -> None:
        self.drain(output=True)
        self.snapshots.wait()
        if self._worker is not None:
            self._worker.shutdown()
            self._out_worker.shutdown()
        self.publisher.close()
        self.store.engine.dispose()
