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
  (:mod:`engine.sinks.publish`), its records produced while PostgreSQL commits, committed after
  it (:mod:`engine.sinks.deliver`).
* Restart: the per-batch Kafka offset ranges are logged in ``<checkpoint>/tidewatch/batches``
  before the commit, and the whole driver state is snapshotted every
  ``snapshot_every_batches`` batches (in the versioned format of
  :mod:`engine.runtime.state_codec`, which runs no code when read; captured in the evaluation
  thread, serialized and written to disk by a background thread:
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from engine.algorithms import make_spares
from engine.core import EngineCore, default_core
from engine.dead_letter import DeadLetters
from engine.decode import STREAMS, predecode
from engine.errors import CheckpointMismatch, SnapshotUnreadable
from engine.executors.collect import collect_preaggregated
from engine.executors.history import records_source, spark_history
from engine.executors.output import ExecutorBatch, merge_output, preaggregate_here
from engine.executors.preagg import BatchParams
from engine.executors.warmup import warm_up
from engine.messages import BatchOutput
from engine.overload import Marks
from engine.rule_evaluator import rule_compiler
from engine.runtime.driver_cpu import DriverCpu
from engine.runtime.driver_warmup import warm_driver
from engine.runtime.gc_tuning import freeze_state, tune_gc
from engine.runtime.hugepages import numpy_hugepages
from engine.runtime.prefault import SpareWarmer
from engine.runtime.snapshot_writer import SnapshotWriter, atomic_write, remove_stale_temporaries
from engine.runtime.thread_usage import ThreadUsage, thread_usage
from engine.sinks.charts import ChartAnswers
from engine.sinks.deliver import Delivery, republish_committed
from engine.sinks.publish import Publisher, ensure_topics
from engine.sinks.store import Store
from engine.sources.offsets import (
    BatchLog,
    Ends,
    Epoch,
    check_batch,
    checkpoint_agrees,
    last_spark_batch,
    spark_end_offsets,
    starting_offsets,
    stream_partitions,
)
from engine.sources.readers import (
    RECORD_COLUMNS,
    kafka_stream,
    offset_ranges,
    read_ranges,
    spark_kafka_options,
    split_topics,
    subscription_changes,
)
from engine.sources.retention import batch_lost, log_end_offsets, topic_partitions

if TYPE_CHECKING:
    from tidewatch.settings import Settings

log = logging.getLogger("tidewatch.engine")


@dataclass
class _Preaggregated:
    """A batch through the executors (or :func:`preaggregate_here` in process, on replay): the
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
    #: the evaluation thread's time in the kernel and page faults during the evaluation
    core_usage: ThreadUsage = ThreadUsage(0.0, 0)


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
        self.store = Store(make_db_engine(pg_url or settings.sqlalchemy_url), engine_id)
        self.charts = ChartAnswers(self.store.engine, settings, engine_id)  # the key page's charts
        ensure_topics(self.bootstrap, settings)
        self.publisher = Publisher(self.bootstrap, settings, engine_id)
        self.delivery = Delivery(self.store, self.publisher, settings.engine_db_retry_s)
        self.core = self._core_factory()
        self.batches_done = 0
        self.read_s = 0.0  # seconds the last batch took to reach the driver (Spark read + toArrow)
        self._worker: Any = None  # pipelined mode: the thread evaluating a batch
        self._out_worker: Any = None  # pipelined mode: the thread delivering a batch's output
        self._inflight: Any = None  # the batch being evaluated
        self._delivering: Any = None  # the output being delivered
        self._evaluated = 0  # batches evaluated since start (snapshot cadence)
        self._driver_cpu = DriverCpu()  # the driver's CPU between batches' metrics (Health)
        self.snapshots = SnapshotWriter(
            fork=settings.engine_snapshot_fork, prefault=settings.engine_snapshot_prefault
        )
        #: the row columns made ahead of a structure's growth, faulted in off the batch
        self.spares = SpareWarmer()
        self._spares_before: bool | None = None  # the process's spare switch before start()
        #: (start of evaluation, end of delivery, events) of the delivered batches (perf_counter;
        #: the last 50,000-100,000, for benchmarks and metrics)
        self.delivered: list[tuple[float, float, int]] = []
        self.totals: dict[str, float] = {"events": 0, "alerts": 0, "dead_letters": 0, "seconds": 0.0}
        #: ``engine_preaggregate = "executors"``: decode and pre-aggregation in Spark's tasks
        self.executors = settings.engine_preaggregate == "executors"
        self.executor_pids: set[int] = set()  # process ids the executors' pane rows came from
        #: batch id -> its partitions with records not yet readable, until the batch is processed
        self._waiting_of: dict[int, list[tuple[str, int]]] = {}
        self._last_begun = -1  # the last batch in the state or taken from Spark (see _begin)
        #: engine batch id = Spark's batch id + ``epoch.base`` (:meth:`_align_checkpoint`)
        self.epoch = Epoch.read(self.state_dir / "spark-epoch.json")
        #: batch id -> its ``lost`` dead letters (offsets deleted by retention before they were read)
        self._lost: dict[int, DeadLetters] = {}
        #: executors mode: where the core reads events again by offsets (a new rule's history, a
        #: stream's pending events after a spec change): Spark's tasks live, this process on a
        #: replay (:mod:`engine.executors.history`)
        self._events: Any = records_source(self._read_ranges, self.topics, settings.max_future_ms)
        #: executors mode, pipelined: the next batch's parameters (:meth:`on_batch_executors`)
        self._next_params: BatchParams | None = None
        #: the overload policy: its marks and the trigger interval a batch's load is measured
        #: against (:meth:`_evaluate`, :mod:`engine.overload`; :meth:`start` sets the one in use)
        self.marks, self.trigger_s = Marks.of(settings), float(settings.trigger_seconds)

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
        self._next_params = None  # made for the state being replaced
        self.core = self._core_factory()
        for snap in reversed(snaps):  # the newest one this engine can read
            try:
                self.core = EngineCore.from_bytes(
                    snap.read_bytes(),
                    rule_compiler(self.settings),
                    alert_cap=getattr(self.settings, "engine_alert_cap_per_lookup", 0),
                )
                log.info("restored the state snapshot of batch %d", self.core.last_batch)
                break
            except SnapshotUnreadable as exc:  # another state format, moved classes, a damaged file
                log.warning(
                    "the state snapshot %s cannot be read by this engine (%s); trying %s",
                    snap,
                    exc,
                    "the one before it"
                    if snap != snaps[0]
                    else "a replay of every committed batch from Kafka",
                )
        first = self.core.last_batch + 1
        if last >= first:
            log.info("replaying batches %d..%d from Kafka (no output) to rebuild the state", first, last)
            for b in range(first, last + 1):
                path = self._batch_log(b)
                if not path.exists():
                    raise CheckpointMismatch(
                        f"batch {b} is committed but its offset log {path} is missing, and no state "
                        f"snapshot at or after it could be read ({self.state_dir / 'snapshots'}): the "
                        "state cannot be rebuilt exactly. Restore the checkpoint directory from a backup, "
                        "or start the engine with a new checkpoint directory and a new --engine-id."
                    )
                blog = self._read_log(b)
                tbl = read_ranges(self.bootstrap, blog.ranges, settings=self.settings)
                # the strides the batch committed, never a new decision (engine.overload)
                self._process(b, self._replay_batch(tbl, b), self.store.strides_of_batch(b))
        # pipelined mode: Spark may have committed batches whose output was not committed yet;
        # they are finished here from their offset logs (Spark will not deliver them again)
        logged = (
            sorted(int(f.stem) for f in (self.state_dir / "batches").glob("*.json"))
            if self.state_dir.exists()
            else []
        )
        pending = [b for b in logged if b > last]
        republish_committed(self.store, self.publisher, last)
        for b in pending:
            ranges = self._read_log(b).ranges
            log.info("batch %d was read but its output not committed: finishing it from its offset log", b)
            self.handle(self._replay_batch(read_ranges(self.bootstrap, ranges, settings=self.settings), b), b)
        self._last_begun = self.core.last_batch
        log.info(
            "state at batch %d: %d rules, watermark %s",
            self.core.last_batch,
            len(self.core.rules),
            self.core.watermark,
        )

    # ------------------------------------------------------------------ batches
    def _read_ranges(self, ranges: dict[str, dict[str, list[int]]]) -> pa.Table:
        return read_ranges(self.bootstrap, ranges, settings=self.settings)

    def kafka_options(self) -> dict[str, str]:
        """Spark's Kafka source options every read of the engine uses
        (:func:`engine.sources.readers.spark_kafka_options`)."""
        return spark_kafka_options(self.bootstrap, self.settings)

    def _spark_events(self, spark: Any) -> Callable[..., Any]:
        """The core's ``EventSource`` through Spark (:func:`spark_history`): a batch read of the
        offsets, decoded and filtered in the executors."""

        def source(stream: str, index: Any, lo: int | None, hi: int | None) -> Any:
            t0 = time.perf_counter()
            d = spark_history(
                spark,
                self.kafka_options(),
                index,
                stream,
                self.topics[stream],
                lo=lo,
                hi=hi,
                max_future_ms=self.settings.max_future_ms,
            )
            log.info(
                "read %d %s events again from Kafka (%d batches' offsets) in %.2f s",
                len(d), stream, len(index), time.perf_counter() - t0,
            )  # fmt: skip
            return d

        return source

    def _read_log(self, batch_id: int) -> BatchLog:
        """The batch's log; notes its partitions for :meth:`_process` (a replay decides as live)."""
        blog = BatchLog.read(self._batch_log(batch_id))
        self._waiting_of[batch_id] = blog.waiting
        return blog

    def _spark_ends(self, batch_id: int) -> Ends | None:
        """Spark's end offsets of the engine's batch ``batch_id`` (the epoch's start offsets for
        the batch before its first one)."""
        sid = batch_id - self.epoch.base
        if sid < 0:
            return self.epoch.start if sid == -1 else None
        return spark_end_offsets(self.checkpoint / "spark", sid)

    def _begin(self, batch_id: int) -> tuple[bool, BatchLog | None]:
        """Spark's offsets of batch ``batch_id``, checked against the state
        (:func:`engine.sources.offsets.check_batch`): ``(True, None)`` when the batch is already
        in the state -- the same offsets, re-delivered after a restart; else ``(False, log)`` with
        the log to write once its records are read.  Raises ``CheckpointMismatch`` when Spark's
        checkpoint and the state disagree (never a skip on the batch id alone)."""
        spark_dir = self.checkpoint / "spark"
        ends = self._spark_ends(batch_id)
        where = f"checkpoint {spark_dir}, state {self.state_dir}"
        path = self._batch_log(batch_id)
        if path.exists() or batch_id <= self._last_begun:
            logged = BatchLog.read(path) if path.exists() else None
            if logged is not None and logged.ends is None:  # a log of an older engine: id only
                log.warning(
                    "batch %d is in the state (an older log, no offsets to compare): skipped", batch_id
                )
                return True, None
            check_batch(batch_id, ends, logged, where=where)
            log.info("batch %d is already in the state (committed before a restart): skipped", batch_id)
            return True, None
        if batch_id != self._last_begun + 1:
            raise CheckpointMismatch(
                f"Spark's next batch is {batch_id} but the engine's state is at batch {self._last_begun} "
                f"({where}): the state was reset or restored from another point in time. The engine "
                "stops; start it again and it replaces Spark's checkpoint with one that starts where "
                "its state ends."
            )
        prev = self._batch_log(batch_id - 1)
        if prev.exists():  # the batch starts where the state's last one ended
            logged = BatchLog.read(prev)
            if logged.ends is not None:
                check_batch(batch_id - 1, self._spark_ends(batch_id - 1), logged, where=where)
        self._last_begun = batch_id
        waiting = self._waiting(ends)
        self._waiting_of[batch_id] = waiting
        return False, BatchLog({}, ends, waiting)

    def _waiting(self, ends: Ends | None) -> list[tuple[str, int]]:
        """The stream partitions no event has come from yet whose records written in Kafka
        reach past the batch's end offsets (high watermark > Spark's end, read ``read_committed``:
        not yet committed, or committed but the partition's commit marker not yet written)."""
        known = stream_partitions(ends, self.topics, STREAMS) or []
        silent = [k for k in known if k not in self.core.part_max]
        if not silent or ends is None:
            return []
        try:
            high = log_end_offsets(self.bootstrap, self.settings, [(self.topics[s], p) for s, p in silent])
        except Exception as exc:  # noqa: BLE001 -- Kafka unreachable: waiting for all of them is safe
            log.warning(
                "cannot ask Kafka for the silent partitions' high watermarks (%s): all treated as waiting",
                exc,
            )
            return silent
        return [
            (s, p) for s, p in silent if high.get((self.topics[s], p), 0) > ends[self.topics[s]].get(p, 0)
        ]

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
        return _Preaggregated(params, preaggregate_here(tbl, params, batch=batch_id))

    def _process(
        self,
        batch_id: int,
        batch: pa.Table | dict[str, Any] | _Preaggregated,
        strides: dict[str, int] | None = None,
    ) -> Any:
        waiting = self._waiting_of.pop(batch_id, None)
        if isinstance(batch, _Preaggregated):
            changes = subscription_changes(batch.eb.records)
            out = self.core.process_preaggregated(
                batch_id, batch.eb, batch.params, changes, waiting, history=self._events, strides=strides
            )
        else:
            parts = dict(batch) if isinstance(batch, dict) else self._prepare(batch)
            changes = subscription_changes(parts.pop("subscriptions"))
            out = self.core.process(batch_id, parts, changes, waiting, strides)
        lost = self._lost.pop(batch_id, None)
        if lost is not None:
            out.dead.extend(lost)
        return out

    def _note_lost(self, batch_id: int, blog: BatchLog) -> None:
        """Find the offsets of this batch that retention deleted before Spark read them
        (:mod:`engine.sources.retention`): they become ``lost`` dead letters of the batch."""
        starts = self._spark_ends(batch_id - 1)  # None for the first batch: the oldest offsets
        dead = batch_lost(
            self.bootstrap, self.settings, batch_id, starts, blog.ends, blog.ranges, self.core.watermark
        )
        if dead is not None:
            self._lost[batch_id] = dead

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
        batch_id = int(batch_id) + self.epoch.base  # Spark's id -> the engine's
        done, blog = self._begin(batch_id)
        if done or blog is None:
            return
        if self.executors:
            self.on_batch_executors(df, int(batch_id), blog)
            return
        t0 = time.perf_counter()
        tbl = df.select(*RECORD_COLUMNS).toArrow()
        self.accept(tbl, int(batch_id), time.perf_counter() - t0, blog)

    def on_batch_executors(self, df: Any, batch_id: int, blog: BatchLog) -> None:
        """:meth:`on_batch` with ``engine_preaggregate = "executors"``: the batch's records
        decoded and pre-aggregated by Spark's tasks with the batch's parameters
        (:func:`collect_preaggregated`), only their output collected and merged
        (:func:`merge_output`); its offset ranges (from that output, the format
        :func:`offset_ranges` writes) logged durably, then evaluated and delivered.

        Pipelined (``engine_pipeline``), Spark's tasks work on this batch while the evaluation
        thread works on the one before: this batch's parameters -- its ``late`` bound and
        watermark, which the batch before decides -- were computed when that batch was handed
        on, from its per-partition event-time maxima (:meth:`EngineCore.params_after`; the core
        refuses a batch whose parameters are not its state's).  Unpipelined (or before the first
        lookup), they are the core's at batch start (:meth:`EngineCore.batch_params`)."""
        pipelined = self.settings.engine_pipeline
        t0 = time.perf_counter()
        self._events = self._spark_events(df.sparkSession)
        params, self._next_params = (self._next_params if pipelined else None), None
        if params is None:
            self.drain()
            params = self.core.batch_params(self.topics)
        eb = merge_output(collect_preaggregated(df, params), params, batch=batch_id)
        self.read_s = time.perf_counter() - t0
        self.executor_pids |= eb.pids
        blog.ranges = eb.offsets
        self._note_lost(batch_id, blog)
        atomic_write(self._batch_log(batch_id), blog.to_json())
        batch = _Preaggregated(params, eb)
        if not pipelined:
            self.handle(batch, batch_id)
            return
        self.drain()  # the batch before is in the state now: this one's effect can be computed
        self._next_params = self.core.params_after(self.topics, eb, self._waiting_of.get(batch_id))
        self._submit(batch, batch_id)

    def accept(self, tbl: pa.Table, batch_id: int, read_s: float, blog: BatchLog | None = None) -> None:
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
        blog = blog or BatchLog({})
        blog.ranges = offset_ranges(tbl)
        self._note_lost(int(batch_id), blog)
        atomic_write(self._batch_log(int(batch_id)), blog.to_json())
        if not pipelined:
            self.handle(tbl, int(batch_id))
            return
        self._submit(batch, int(batch_id))

    def _submit(self, batch: dict[str, Any] | _Preaggregated, batch_id: int) -> None:
        """Hand a batch to the evaluation thread (pipelined mode; nothing else is in flight)."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="tidewatch-batch")
            self._out_worker = ThreadPoolExecutor(1, thread_name_prefix="tidewatch-output")
        self._inflight = self._worker.submit(self._handle_pipelined, batch, batch_id, self.read_s)

    def drain(self, output: bool = False) -> None:
        """Wait for the batch being evaluated (pipelined mode) and, with ``output``, for the
        output being delivered and expanded into the per-alert tables; re-raise their failure."""
        fut, self._inflight = self._inflight, None
        if fut is not None:
            fut.result()
        if output:
            out, self._delivering = self._delivering, None
            if out is not None:
                out.result()
            self.delivery.settle()

    def handle(self, tbl: pa.Table | _Preaggregated, batch_id: int) -> None:
        """Process one batch of Kafka records (Arrow) and deliver its output exactly once (its
        offset log is written already: by :meth:`accept`, or it is where :meth:`recover` read
        the batch from); in the per-alert tables too when it returns (the expansion waited for)."""
        done = self._evaluate(tbl, batch_id, self.read_s)
        if done is not None:
            self._deliver(done)
            self.delivery.settle()

    def _handle_pipelined(self, batch: dict[str, Any] | _Preaggregated, batch_id: int, read_s: float) -> None:
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
        usage0 = thread_usage()
        with self.charts.lock:  # chart answers read the state between batches (engine/sinks/charts.py)
            out = self._process(batch_id, tbl)
        n_events = sum(out.events.values())
        core_s = time.perf_counter() - t0
        core_usage = thread_usage() - usage0
        self.spares.after_batch(self.core.evaluator)
        # the overload policy's load: the evaluation's share of the trigger interval (none when
        # batches run back to back, trigger 0); it decides the next batch's strides
        self.core.observe_load(core_s / self.trigger_s if self.trigger_s > 0 else None, self.marks)
        metrics = {
            "events_per_s": n_events / core_s if core_s > 0 else None,
            "batch_ms": core_s * 1000,
            "lag_ms": None if self.core.max_ts is None else time.time() * 1000 - self.core.max_ts,
            "alerts": len(out.alerts),
            "dead_letters": len(out.dead),
            "dead_letter_reasons": {r: int(n) for r, n in out.dead.counts().items() if n},
            "state_bytes": self.core.state_nbytes(),
            "driver_cpu_ms": self._driver_cpu.since_last(),
        }
        self._evaluated += 1
        self.snapshots.poll()
        if self._evaluated % max(1, self.settings.snapshot_every_batches) == 0:
            with self.charts.lock:  # the capture compacts the structures: no chart read meanwhile
                self.snapshot()
        return _Evaluated(
            batch_id, out, metrics, self.core.watermark, len(self.core.rules), t0, read_s, core_s, core_usage
        )

    def _deliver(self, e: _Evaluated) -> None:
        """The batch's output: PostgreSQL (one transaction, idempotent by batch id), Kafka's records
        produced meanwhile, Kafka's transaction committed after PostgreSQL's (:mod:`engine.sinks.deliver`)."""
        out, batch_id = e.out, e.batch_id
        t_pg = time.perf_counter()
        d = self.delivery.deliver(out, watermark=e.watermark, metrics=e.metrics)
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
            "done in %.0f ms (read %.0f, evaluation %.0f (in the kernel %.0f, %d page faults), waiting for "
            "output %.0f, PostgreSQL %.0f "
            "(Kafka records produced meanwhile), Kafka commit %.0f, the previous batch's expansion "
            "into the alert log %.0f (waited %.0f))",
            batch_id, n_events, ", ".join(f"{k} {v}" for k, v in out.events.items()), dl, len(out.lookups),
            out.lookups[-1] if out.lookups else "-", len(out.alerts), e.rules, total_s * 1000,
            e.read_s * 1000, e.core_s * 1000, e.core_usage.kernel_s * 1000, e.core_usage.faults, (t_pg - e.t0 - e.core_s) * 1000, d.pg_s * 1000, d.kafka_s * 1000,
            d.expanded_s * 1000, d.waited_s * 1000,
        )  # fmt: skip

    def snapshot(self) -> Path:
        """Snapshot the state of the last processed batch (keeps the newest three): captured
        here, finished and written to disk by a background thread
        (:mod:`engine.runtime.snapshot_writer`)."""
        path = self._snapshot_path(self.core.last_batch)
        self.snapshots.write(self.core.last_batch, path, self.core.capture, self.core.evaluator)
        self._prune_logs()
        return path

    def _prune_logs(self) -> None:
        """Drop the batch logs no restart can need: those before the oldest snapshot kept (a
        restart replays from a snapshot onwards; the log of the snapshot's own batch stays, for
        :meth:`_begin`'s check of the batch after it)."""
        snaps = sorted(int(f.stem) for f in (self.state_dir / "snapshots").glob("*.bin"))
        if not snaps:
            return
        for f in (self.state_dir / "batches").glob("*.json"):
            if f.stem.isdigit() and int(f.stem) < snaps[0]:
                f.unlink(missing_ok=True)

    def _align_checkpoint(self) -> str:
        """Make Spark's checkpoint carry on exactly where the state ends; returns the
        ``startingOffsets`` for a new checkpoint.

        When Spark's checkpoint disagrees with the state (:func:`checkpoint_agrees`: deleted,
        or restored from an older or newer point in time), it is moved aside
        (``spark.discarded-<time>``) and a new one starts at the state's end offsets, its batch
        0 being the state's next batch (a new :class:`Epoch`): every offset after the state is
        read once, none before it again, and subscription changes made meanwhile are read too.
        Refused (``CheckpointMismatch``) only when the state's end offsets are not known (a
        log written by an older engine)."""
        spark_dir = self.checkpoint / "spark"
        last = self.core.last_batch
        path = self._batch_log(last)
        state_ends = BatchLog.read(path).ends if last >= 0 and path.exists() else None
        newest = last_spark_batch(spark_dir)
        if checkpoint_agrees(last, state_ends, newest, self.epoch, lambda m: spark_end_offsets(spark_dir, m)):
            if last >= 0 and state_ends is None:
                log.warning(
                    "batch %d's log predates end offsets: Spark's checkpoint is trusted by batch id", last
                )
            return (
                starting_offsets(self.epoch.start, self._topic_partitions()) if newest is None else "earliest"
            )
        if last >= 0 and state_ends is None:
            check_batch(last, None, None, where=f"checkpoint {spark_dir}, state {self.state_dir}")
        if spark_dir.exists():
            aside = spark_dir.with_name(f"spark.discarded-{time.strftime('%Y%m%dT%H%M%S')}")
            spark_dir.rename(aside)
            log.warning(
                "Spark's checkpoint (newest batch %s, engine batch %s) disagrees with the state (batch %d): "
                "moved aside to %s; a new one starts where the state ends",
                newest,
                None if newest is None else newest + self.epoch.base,
                last,
                aside,
            )
        else:
            log.warning(
                "Spark's checkpoint %s is missing; a new one starts where the state (batch %d) ends",
                spark_dir,
                last,
            )
        self.epoch = Epoch(base=last + 1, start=state_ends)
        atomic_write(self.state_dir / "spark-epoch.json", self.epoch.to_json())
        return starting_offsets(self.epoch.start, self._topic_partitions())

    def _topic_partitions(self) -> dict[str, list[int]]:
        """The partitions of the subscribed topics now (as the ``engine`` principal)."""
        out: dict[str, list[int]] = {}
        for t, p in topic_partitions(self.bootstrap, self.settings, list(self.topics.values()), 30.0):
            out.setdefault(t, []).append(p)
        return {t: sorted(ps) for t, ps in out.items()}

    # ------------------------------------------------------------------ Spark
    def _refuse_sharded_checkpoint(self) -> None:
        """A checkpoint the sharded engine made (its marker, :mod:`engine.shards.engine`) holds
        the state in Spark's state store, not here: refused, with what to do."""
        marker = self.state_dir / "shards.json"
        if not marker.exists():
            return
        try:
            was = str(int(json.loads(marker.read_text())["shards"]))
        except (OSError, ValueError, KeyError, TypeError):
            was = "N"
        raise CheckpointMismatch(
            f"the checkpoint was made by the sharded engine ({was} shards), whose state the driver's "
            f"engine (engine_shards=0) does not read: run with engine_shards={was}, or start with a "
            f"new checkpoint directory and a new --engine-id. Checkpoint: {self.checkpoint}"
        )

    def start(
        self,
        spark: Any,
        trigger_seconds: float | None = None,
        max_offsets_per_trigger: int | None = None,
        available_now: bool = False,
        wrap: Callable[[Callable[[Any, int], None]], Callable[[Any, int], None]] | None = None,
    ) -> Any:
        """Recover, then start the streaming query; returns the ``StreamingQuery``.

        ``wrap``: given :meth:`on_batch`, returns the function Spark calls per batch (e.g. the
        command's stop gate, :class:`engine.cli.StopGate`).

        ``available_now``: process what is in Kafka now (in batches of at most
        ``max_offsets_per_trigger`` records), then stop -- for replays and benchmarks.
        """
        tune_gc(self.settings.engine_gc_threshold)
        numpy_hugepages(self.settings.engine_numpy_hugepages)
        # a growth's row columns made ahead, faulted in by self.spares; close() restores the switch
        self._spares_before = make_spares(True)
        if self.executors:
            log.info(
                "engine_preaggregate = executors: batches decoded and pre-aggregated by Spark's tasks%s",
                ", pipelined" if self.settings.engine_pipeline else "",
            )
        self._refuse_sharded_checkpoint()
        self.recover()
        starting = self._align_checkpoint()
        freeze_state()
        self._warm_up(spark)
        self.charts.start(lambda: self.core)  # answers the key page's chart requests
        max_offsets_per_trigger = max_offsets_per_trigger or self.settings.engine_max_offsets_per_trigger
        trig = trigger_seconds if trigger_seconds is not None else self.settings.trigger_seconds
        self.trigger_s = float(trig)
        # offsets deleted by retention: not a stop of every stream -- each gap is found and
        # dead-lettered as ``lost`` (engine.sources.retention), never skipped silently
        records = kafka_stream(
            spark,
            self.bootstrap,
            self.settings,
            self.topics.values(),
            fail_on_data_loss=False,
            starting_offsets=starting,
            max_offsets_per_trigger=max_offsets_per_trigger,
        )
        writer = records.writeStream.foreachBatch(self.on_batch if wrap is None else wrap(self.on_batch))
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

    def _warm_up(self, spark: Any) -> None:
        """What the first micro-batch would otherwise pay, paid before the stream starts: the
        driver's kernels loaded by a throwaway core (:mod:`engine.runtime.driver_warmup`), in a
        thread while Spark starts its Python workers (executors mode,
        :mod:`engine.executors.warmup`) -- the one waits on Spark, the other computes."""
        with ThreadPoolExecutor(1, thread_name_prefix="tidewatch-warm-up") as pool:
            driver = pool.submit(warm_driver, self._core_factory, self.topics, executors=self.executors)
            if self.executors:  # the Python workers' start-up paid now, not by the first batch
                took = warm_up(spark, self.core.batch_params(self.topics))
                log.info("Spark's Python workers started (warm-up) in %.1f s", took)
            took, alerts = driver.result()
        log.info(
            "the driver's kernels loaded (warm-up: %d alerts of a throwaway core) in %.1f s", alerts, took
        )

    def close(self) -> None:
        self.charts.stop()
        self.drain(output=True)
        self.snapshots.wait()
        self.spares.close()
        if self._spares_before is not None:  # nothing faults spares in from now on
            make_spares(self._spares_before)
            self._spares_before = None
        if self._worker is not None:
            self._worker.shutdown()
            self._out_worker.shutdown()
        self.delivery.close()
        self.publisher.close()
        self.store.engine.dispose()
