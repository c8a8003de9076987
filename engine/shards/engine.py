"""The sharded engine: the collective indexes held in Spark's executors, by key (issue #23).

One streaming query (docs/engine.md, "Sharded evaluation"; docs/ARCHITECTURE.md "Data flow"):

1. Spark's Kafka source reads ``trades``, ``packets`` and ``subscriptions``;
2. ``mapInArrow(Router)`` (:mod:`engine.shards.route`), in Spark's tasks: each record's key
   decoded, the record routed to the shard(s) owning it, every rule change to every shard;
3. ``groupBy("shard").transformWithStateInPandas(ShardProcessor)``
   (:mod:`engine.shards.processor`), in Spark's tasks: each shard evaluates its keys with its
   own :class:`engine.core.EngineCore`, its state in Spark's state store (RocksDB), and emits
   its output -- alerts, dead letters, the rule changes' effects -- as one row;
4. ``foreachBatch`` (:meth:`ShardedEngine.on_batch`), on the driver: the shards' rows merged
   (:func:`engine.shards.step.merge_outputs`) and delivered exactly once by the engine's sinks
   (:mod:`engine.sinks.deliver`, idempotent by batch id).  Who produces the Kafka records
   (``engine_shard_delivery``, fixed per checkpoint): ``tasks`` (the default) -- each shard's
   task in step 3 produced its own in a transaction of its own (:mod:`engine.shards.produce`),
   so the driver commits the batch in PostgreSQL only ("Kafka per shard, then PostgreSQL");
   ``driver`` -- the driver produces the merged batch after PostgreSQL's commit, as the
   driver's engine does.  The alert cap needs the merged alerts: ``driver`` whenever it is on.

The driver sees one row per shard and batch, never a record.  Spark places the shards (one
shuffle partition each: ``spark.sql.shuffle.partitions`` = N, the labels chosen so that shard
``s`` lands in partition ``s``), reruns and moves them; its checkpoint holds the Kafka offsets
and the shards' state together, so a restart resumes from both at the same batch.  Spark
commits a batch after ``foreachBatch`` returns: a crash between the sinks' commit and Spark's
makes Spark run the batch again from the state before it, with the same output, which the
PostgreSQL sink recognizes by its batch id and skips (and the shards' tasks by their progress
markers, when they produce); with the driver's delivery a batch committed in PostgreSQL and not
in Kafka is published from PostgreSQL when the engine starts
(:func:`engine.sinks.deliver.republish_committed`).

Offsets deleted by the topics' retention before the query read them are found as the driver's
engine finds them (:mod:`engine.sources.retention`; Spark's source runs with ``failOnDataLoss =
false``): the batch's start and end offsets from Spark's offset log, the records' offset ranges
from the shards' metas (every shard got every routing task's), the broker asked for the
log-start offsets of the candidates only; each lost range is one ``lost`` dead letter of the
batch, delivered with its output (:meth:`ShardedEngine._lost`) -- when the shards produce, in a
Kafka transaction of the driver's own before the PostgreSQL commit (:meth:`ShardedEngine._publish_lost`).

The alert cap (``engine_alert_cap_per_lookup``) is the driver's: the shards run uncapped and say
where each lookup's alerts start, the driver caps the merged alerts in the one core's order
(:mod:`engine.shards.capped`).

The overload policy is the driver's too: after each batch it feeds the controller the slowest
shard's load and records the next batch's strides in a file of the checkpoint, which every shard
reads (:mod:`engine.shards.strides`).

The key page's charts are answered by the shard owning the key, from its state, the requests
handed over by the driver through a file of the checkpoint (:mod:`engine.shards.charts`); on an
idle stream the driver makes Spark run a batch for them (a tick: :mod:`engine.shards.ticks`, a
second source of the query).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core import default_core
from engine.dead_letter import DeadLetters
from engine.errors import CheckpointMismatch
from engine.executors.warmup import warm_up
from engine.messages import AlertSeq, BatchOutput
from engine.overload import Marks
from engine.runtime.driver_cpu import DriverCpu
from engine.shards.charts import RequestFile, ShardCharts
from engine.shards.panes import PARAMS_PROPERTY, property_value
from engine.shards.processor import OUTPUT_DDL, ShardProcessor
from engine.shards.route import ROUTED_DDL, Router, merge_ranges
from engine.shards.step import ShardMeta, decode_output, merge_outputs
from engine.shards.strides import StrideFile
from engine.shards.ticks import TickDir
from engine.sinks.charts import ChartAnswers
from engine.sinks.deliver import Delivery, republish_committed
from engine.sinks.publish import Publisher, ensure_topics
from engine.sinks.store import Store
from engine.sources.offsets import spark_end_offsets
from engine.sources.readers import RECORD_COLUMNS, kafka_stream
from engine.sources.retention import batch_lost
from engine.spark_session import local_task_slots

if TYPE_CHECKING:
    from tidewatch.settings import Settings

log = logging.getLogger("tidewatch.engine")


def placement_warning(master: str, shards: int) -> str | None:
    """What to tell a user who runs ``shards`` shards on Spark's one local executor of several
    task slots (:func:`engine.spark_session.local_task_slots` > 1), else None.  Its tasks take its
    Python workers in turn, so a shard's task often lands in a worker that does not hold its live
    core: the shard is caught up or rebuilt, batches read again from Kafka and run again
    (docs/engine.md, "Where shards run").  One shard, or one-core executors, keep each shard in
    one worker."""
    if shards < 2 or (local_task_slots(master) or 1) < 2:
        return None
    return (
        f"{shards} shards on Spark's one local executor ({master}): its tasks take its Python "
        "workers in turn, so a shard's task often runs in a worker that does not hold the shard and "
        "must catch it up or rebuild it, reading its batches again from Kafka (seconds a batch). "
        "On one machine run 1 shard (--shards 1, a new checkpoint and engine id); one-core "
        "executors (tidewatch up --workers N) keep each shard in its worker too, where there are "
        "cores for them; docs/engine.md, 'Where shards run'."
    )


def shard_labels(spark: Any, n: int) -> list[int]:
    """For each shard 0..n-1 an INT whose Spark hash partitioning (``pmod(hash(x), n)``, what
    ``groupBy`` shuffles by) is that shard: so N shards are N partitions, one task each."""
    rows = (
        spark.range(0, 64 * n)
        .selectExpr("CAST(id AS INT) AS x", f"pmod(hash(CAST(id AS INT)), {n}) AS p")
        .collect()
    )
    first: dict[int, int] = {}
    for r in rows:
        first.setdefault(int(r["p"]), int(r["x"]))
    missing = [s for s in range(n) if s not in first]
    if missing:
        raise CheckpointMismatch(f"no shard label found for partitions {missing} of {n}")
    return [first[s] for s in range(n)]


class ShardedEngine:
    """One sharded engine instance (module docstring): sinks and the ``foreachBatch`` function;
    the state is in Spark's.  What tests and the command read: ``batches_done``, ``totals``,
    ``metas`` (the last batch's :class:`ShardMeta` per shard), ``rebuilds``, ``skipped``, :attr:`applied_until`,
    :attr:`rules`, ``executor_pids``."""

    def __init__(
        self,
        settings: Settings,
        *,
        bootstrap: str | None = None,
        pg_url: str | None = None,
        checkpoint: Path | None = None,
        engine_id: str = "default",
    ) -> None:
        from tidewatch.db.session import make_db_engine

        if settings.engine_shards < 1:
            raise ValueError("ShardedEngine needs engine_shards >= 1")
        self.settings = settings
        self.n = int(settings.engine_shards)
        #: what the shards evaluate (``engine_shard_input``): ``panes`` or ``records``
        self.input = str(settings.engine_shard_input)
        #: who produces the Kafka output (``engine_shard_delivery``; module docstring): ``tasks``
        #: or ``driver`` -- the driver whenever the alert cap is on (it caps the merged alerts)
        self.delivery_by = (
            "driver" if settings.engine_alert_cap_per_lookup > 0 else str(settings.engine_shard_delivery)
        )
        #: on pane rows: (batch id, parameters) shard 0 sent for the batch after the last one
        #: (:mod:`engine.shards.panes`), handed to that batch's tasks
        self._next_params: tuple[int, bytes] | None = None
        self.bootstrap = bootstrap or settings.kafka_bootstrap
        self.checkpoint = Path(
            checkpoint or settings.checkpoint_dir or (settings.run_dir / "engine-checkpoint")
        )
        self.topics = {
            "trades": settings.topic_trades,
            "packets": settings.topic_packets,
            "subscriptions": settings.topic_subscriptions,
        }
        self.engine_id = engine_id
        self.store = Store(make_db_engine(pg_url or settings.sqlalchemy_url), engine_id)
        ensure_topics(self.bootstrap, settings)
        self.publisher = Publisher(self.bootstrap, settings, engine_id)
        self.delivery = Delivery(self.store, self.publisher, settings.engine_db_retry_s)
        self.batches_done = 0
        self._driver_cpu = DriverCpu()  # the driver's CPU between batches' metrics (Health)
        self.totals: dict[str, float] = {"events": 0, "alerts": 0, "dead_letters": 0, "seconds": 0.0}
        self.metas: dict[int, ShardMeta] = {}
        self.executor_pids: set[int] = set()
        #: per shard, the batches that rebuilt it from Spark's state store (not from a live core)
        self.rebuilds: dict[int, int] = {}
        #: per what a shard evaluated (:attr:`ShardMeta.input`: panes, read again, records), the
        #: shard batches
        self.inputs: dict[str, int] = {}
        #: per what a shard's task did with its Kafka output (:attr:`ShardMeta.published`:
        #: published, before, empty), the shard batches (``engine_shard_delivery = "tasks"``)
        self.published: dict[str, int] = {}
        #: per shard, the batches whose worker brought an older live core forward from the log
        self.catch_ups: dict[int, int] = {}
        #: per shard, the batch of its snapshot in Spark's state store when a batch started it
        #: again from the state store (``rebuilt``): -1 when it was rebuilt from the log alone
        self.rebuilt_from: dict[int, int] = {}
        #: per delivered batch, its lookup times and the strides its shards ran with (the
        #: schedule a check replays: :func:`engine.overload.schedule`; the last 100,000 batches)
        self.schedule: dict[int, tuple[list[int], dict[str, int]]] = {}
        #: per delivered batch, the slowest shard's evaluation (s; the last 100,000 batches)
        self.shard_seconds: list[float] = []
        #: per delivered batch, the largest over its shards of each part of a shard's task
        #: (:attr:`ShardMeta.extra`: input, catch_up, evaluate, log, snapshot, snapshot_start; s)
        self.shard_parts: list[dict[str, float]] = []
        #: (shard, batch of the snapshot, its bytes) for each snapshot file a shard named in
        #: Spark's state store (the last 1,000)
        self.snapshots_stored: list[tuple[int, int, int]] = []
        #: (start of the batch's delivery, its end, events) per delivered batch (benchmarks)
        self.delivered: list[tuple[float, float, int]] = []
        #: batches Spark ran again after a restart that PostgreSQL had committed: skipped
        self.skipped: list[int] = []
        #: the last batch id this instance committed or found committed (None: unknown, read from
        #: PostgreSQL): Spark hands one query's ``foreachBatch`` increasing batch ids, so only the
        #: first batch of a run -- or the one after a failed delivery -- asks PostgreSQL
        self._committed: int | None = None
        self._conf_back: tuple[Any, str] | None = None
        #: the overload policy, decided here for every shard (:mod:`engine.shards.strides`): its
        #: marks, the trigger interval a batch's load is measured against (:meth:`start` sets the
        #: one in use), the lookup period, and the file the shards read each batch's strides from
        self.marks, self.trigger_s = Marks.of(settings), float(settings.trigger_seconds)
        self.lookup_ms = int(settings.engine_lookup_every_ms or settings.pane_ms)
        self.stride_file = StrideFile(self.checkpoint / "tidewatch" / "strides.json")
        #: the key page's charts: requests handed to the shards, their answers written back
        self.ticks = TickDir(self.checkpoint / "tidewatch" / "ticks")
        self.charts = ShardCharts(
            ChartAnswers(self.store.engine, settings, engine_id),
            RequestFile(self.checkpoint / "tidewatch" / "chart_requests.json"),
            float(settings.chart_answer_poll_s),
            self.ticks,
        )

    # ------------------------------------------------------------------ what the shards say
    @property
    def applied_until(self) -> int | None:
        """The last lookup time every shard has passed (None before the first)."""
        times = [m.applied_until for m in self.metas.values()]
        if len(times) < self.n or any(t is None for t in times):
            return None
        return min(t for t in times if t is not None)

    @property
    def rules(self) -> int:
        """Active rules (every shard holds every rule)."""
        return min((m.rules for m in self.metas.values()), default=0)

    # ------------------------------------------------------------------ start
    def _check_checkpoint(self) -> int:
        """The checkpoint is one this query can go on from -- a sharded one (its marker
        ``tidewatch/shards.json``, not the driver's engine's), of N shards, of the same input, with
        the ticks source -- and a checkpoint exists when PostgreSQL has batches of this engine:
        else refuse with what to do (the state is in the checkpoint, nowhere else).  Returns the
        last batch PostgreSQL has committed for this engine (-1: none)."""
        spark_dir = self.checkpoint / "spark"
        marker = self.checkpoint / "tidewatch" / "shards.json"
        last = self.store.last_committed()
        has_commits = (spark_dir / "commits").exists() and any((spark_dir / "commits").iterdir())
        if last >= 0 and not has_commits:
            raise CheckpointMismatch(
                f"engine {self.engine_id!r} has committed batches up to {last} in PostgreSQL, but "
                f"Spark's checkpoint {spark_dir} holds none: the shards' state is lost. Restore the "
                "checkpoint directory from a backup, or start with a new checkpoint directory and a "
                "new --engine-id."
            )
        if not marker.exists() and (has_commits or (self.checkpoint / "tidewatch" / "batches").exists()):
            raise CheckpointMismatch(
                "the checkpoint was made by the driver's engine (engine_shards=0, the default before "
                "Dec 8), whose state shards do not read: run with engine_shards=0 (--shards 0, or "
                "TIDEWATCH_ENGINE_SHARDS=0 in the environment or .env), or start with a new checkpoint "
                "directory and a new --engine-id (the topics are read again into the shards). "
                f"Checkpoint: {self.checkpoint}"
            )
        if marker.exists():
            doc = json.loads(marker.read_text())
            was = int(doc["shards"])
            if was != self.n:
                raise CheckpointMismatch(
                    f"the checkpoint {self.checkpoint} holds {was} shards, the settings ask for "
                    f"{self.n} (engine_shards): a checkpoint's shard count is fixed. Run with "
                    f"engine_shards={was}, or start with a new checkpoint directory and a new "
                    f"--engine-id to re-read the topics into {self.n} shards."
                )
            was_input = str(doc.get("input", "records"))  # a checkpoint from before the choice
            if was_input != self.input:
                raise CheckpointMismatch(
                    f"the checkpoint {self.checkpoint} was made by shards evaluating {was_input}, "
                    f"the settings ask for {self.input} (engine_shard_input): the shards' state "
                    f"differs between the two. Run with engine_shard_input={was_input}, or start "
                    "with a new checkpoint directory and a new --engine-id."
                )
            if not doc.get("ticks"):  # a checkpoint of a query without the ticks source
                raise CheckpointMismatch(
                    "the checkpoint was made by a sharded engine without ticks (engine/shards/ticks.py), "
                    "and Spark does not restart a query whose sources changed: start with a new "
                    f"checkpoint directory and a new --engine-id. Checkpoint: {self.checkpoint}"
                )
            was_by = str(doc.get("delivery", "driver"))  # a checkpoint from before the shards produced
            if was_by != self.delivery_by:
                raise CheckpointMismatch(
                    f"the checkpoint {self.checkpoint} was made with the Kafka output produced by the "
                    f"{was_by}, the settings ask for the {self.delivery_by} (engine_shard_delivery; the "
                    "alert cap, engine_alert_cap_per_lookup > 0, needs the driver): the two keep their "
                    f"progress in Kafka apart. Run with engine_shard_delivery={was_by}"
                    + (" and engine_alert_cap_per_lookup=0" if was_by == "tasks" else "")
                    + ", or start with a new checkpoint directory and a new --engine-id."
                )
        else:
            marker.parent.mkdir(parents=True, exist_ok=True)
            doc = {"shards": self.n, "input": self.input, "ticks": True, "delivery": self.delivery_by}
            marker.write_text(json.dumps(doc))
        return last

    def start(
        self,
        spark: Any,
        trigger_seconds: float | None = None,
        max_offsets_per_trigger: int | None = None,
        available_now: bool = False,
        wrap: Callable[[Callable[[Any, int], None]], Callable[[Any, int], None]] | None = None,
    ) -> Any:
        """Publish what a crash left unpublished, then start the streaming query (module
        docstring); returns the ``StreamingQuery``."""
        # with the shards producing, Kafka is never behind PostgreSQL: nothing to publish again
        last = self._check_checkpoint()
        republish_committed(self.store, self.publisher, last, publish=self.delivery_by == "driver")
        labels = shard_labels(spark, self.n)
        if self.input == "panes":  # the routing tasks' Python workers started now, not by a batch
            took = warm_up(spark, default_core(self.settings).batch_params(self.topics))
            log.info("Spark's Python workers started (warm-up) in %.1f s", took)
        # one shuffle partition per shard: the query's session (cloned by its thread once it runs)
        # keeps it, and its checkpoint from then on; the caller's session gets its own value back
        # with the first batch (:meth:`on_batch`), when the clone is made
        self._conf_back = (spark, spark.conf.get("spark.sql.shuffle.partitions"))
        spark.conf.set("spark.sql.shuffle.partitions", str(self.n))
        cap = max_offsets_per_trigger or self.settings.engine_max_offsets_per_trigger
        # a retention gap does not stop the query: each batch's gaps are found and dead-lettered
        # as `lost` (on_batch, _lost), never skipped silently
        records = kafka_stream(
            spark,
            self.bootstrap,
            self.settings,
            self.topics.values(),
            fail_on_data_loss=False,
            max_offsets_per_trigger=cap,
        )
        panes = self.input == "panes"
        router = Router(
            self.topics, labels, self.settings.max_future_ms, self.bootstrap, self.settings, panes=panes
        )
        routed = records.select(*RECORD_COLUMNS).mapInArrow(router, ROUTED_DDL)
        # a batch on purpose when chart requests wait on an idle stream (engine.shards.ticks)
        routed = routed.unionByName(self.ticks.stream(spark))
        # the live cores of a worker serve this run of the query only: a restart rebuilds every
        # shard from Spark's state store, even where a worker process outlived the query
        engine = f"{self.checkpoint.resolve()}|{self.engine_id}"
        processor = ShardProcessor(
            # the shards run uncapped: the driver caps the batch's alerts (merge_outputs)
            self.settings.model_copy(update={"engine_alert_cap_per_lookup": 0}),
            engine,
            uuid.uuid4().hex,
            labels,
            self.topics,
            self.bootstrap,
            str(self.checkpoint.resolve() / "tidewatch" / "shards"),
            str(self.stride_file.path.resolve()),
            str(self.charts.requests.path.resolve()),
            panes=panes,
            publish_as=self.engine_id if self.delivery_by == "tasks" else None,
        )
        shards = routed.groupBy("shard").transformWithStateInPandas(processor, OUTPUT_DDL, "Append", "None")
        writer = shards.writeStream.foreachBatch(self.on_batch if wrap is None else wrap(self.on_batch))
        trig = trigger_seconds if trigger_seconds is not None else self.settings.trigger_seconds
        self.trigger_s = float(trig)
        writer = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime=f"{trig} seconds")
        )
        log.info("sharded evaluation: %d shards (labels %s)", self.n, labels)
        self.charts.start(labels, idle_s=max(2 * self.trigger_s, self.charts.poll_s))
        if warning := placement_warning(str(spark.sparkContext.master), self.n):
            log.warning(warning)
        return (
            writer.option("checkpointLocation", str(self.checkpoint / "spark"))
            .queryName(f"tidewatch-engine-{self.engine_id}")
            .start()
        )

    # ------------------------------------------------------------------ per batch
    def on_batch(self, df: Any, batch_id: int) -> None:
        """``foreachBatch``: the shards' outputs of batch ``batch_id`` merged and delivered once."""
        self.charts.batch_started()  # not idle: no tick while it runs
        try:
            self._on_batch(df, int(batch_id))
        finally:
            self.charts.batch_ended()

    def _on_batch(self, df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        if self._conf_back is not None:
            spark, value = self._conf_back
            spark.conf.set("spark.sql.shuffle.partitions", value)
            self._conf_back = None
        tbl = self._run_batch(df, batch_id)
        pairs = [decode_output(b) for b in tbl.column("out").to_pylist()]
        metas = [m for _, m in pairs]
        self._next_params = next(((batch_id + 1, m.next_params) for m in metas if m.next_params), None)
        for m in metas:  # also of a batch run again: its shards' rebuilds happened
            self.metas[m.shard] = m
            self.executor_pids.add(m.pid)
            self.rebuilds[m.shard] = self.rebuilds.get(m.shard, 0) + int(m.how == "rebuilt")
            self.catch_ups[m.shard] = self.catch_ups.get(m.shard, 0) + int(m.how == "caught up")
            self.inputs[m.input] = self.inputs.get(m.input, 0) + 1
            if m.published:
                self.published[m.published] = self.published.get(m.published, 0) + 1
            if m.how == "rebuilt":
                self.rebuilt_from[m.shard] = m.snapshot_of
            if m.snapshot_bytes:
                self.snapshots_stored = [
                    *self.snapshots_stored[-999:],
                    (m.shard, m.snapshot_of, m.snapshot_bytes),
                ]
        last = self.store.last_committed() if self._committed is None else self._committed
        if batch_id <= last:
            log.info("batch %d is committed already (Spark ran it again after a restart): skipped", batch_id)
            self.skipped.append(batch_id)
            self._committed = last
            return
        out = merge_outputs(batch_id, [o for o, _ in pairs], self.settings.engine_alert_cap_per_lookup)
        lost = self._lost(batch_id, metas)
        if lost is not None:
            if self.delivery_by == "tasks":  # the shards produced theirs: the driver's own, first
                self._publish_lost(batch_id, lost)
            out.dead.extend(lost)
        self._committed = None  # a failed delivery: PostgreSQL says again what is committed
        self._deliver(out, metas, t0)
        self._committed = batch_id
        self._decide_strides(batch_id, metas)
        try:
            self.charts.after_batch({rid: a for m in metas for rid, a in m.charts.items()})
        except Exception as exc:  # PostgreSQL restarting: the requests wait for the next batch
            log.warning("chart requests not answered now: %s", type(exc).__name__)

    def _run_batch(self, df: Any, batch_id: int) -> Any:
        """The shards' rows of batch ``batch_id`` (``df`` collected: the routing tasks and the
        shards run now).  On pane rows the routing tasks get the batch's parameters, when shard 0
        sent them with the batch before, as a task-local property (:mod:`engine.shards.panes`)."""
        given = self._next_params
        if given is None or given[0] != batch_id:
            return df.toArrow()
        sc = df.sparkSession.sparkContext
        sc.setLocalProperty(PARAMS_PROPERTY, property_value(batch_id, given[1]))
        try:
            return df.toArrow()
        finally:
            sc.setLocalProperty(PARAMS_PROPERTY, None)

    def _decide_strides(self, batch_id: int, metas: list[ShardMeta]) -> None:
        """The overload controller fed batch ``batch_id``'s load -- its slowest shard's
        evaluation over the trigger interval (none when batches run back to back) -- and the
        strides of the next batch recorded for every shard (:mod:`engine.shards.strides`),
        before Spark commits this batch and plans the next."""
        budgets = metas[0].budgets if metas else {}
        shard_s = max((m.seconds for m in metas), default=0.0)
        load = shard_s / self.trigger_s if self.trigger_s > 0 else None
        self.stride_file.decide(batch_id, budgets, load, self.lookup_ms, self.marks)

    def _watermark(self) -> int | None:
        """The engine's watermark: the smallest of the shards' (None until every shard has one)."""
        wms = [m.watermark for m in self.metas.values() if m.watermark is not None]
        return min(wms) if len(wms) == self.n else None

    def _lost(self, batch_id: int, metas: list[ShardMeta]) -> DeadLetters | None:
        """The ``lost`` dead letters of batch ``batch_id``: the offsets it should have covered
        (from the end of Spark's batch before to its own end) that retention deleted before they
        were read (:mod:`engine.sources.retention`; module docstring).  None when there are none.
        The first batch of a checkpoint starts at the oldest offsets Kafka has: nothing before
        them to lose."""
        spark_dir = self.checkpoint / "spark"
        starts = spark_end_offsets(spark_dir, batch_id - 1) if batch_id > 0 else None
        ranges = merge_ranges(m.ranges for m in metas)
        ends = spark_end_offsets(spark_dir, batch_id)
        return batch_lost(self.bootstrap, self.settings, batch_id, starts, ends, ranges, self._watermark())

    def _publish_lost(self, batch_id: int, lost: DeadLetters) -> None:
        """With the shards producing: the ``lost`` dead letters of batch ``batch_id`` -- which only
        the driver knows -- produced in a Kafka transaction of the driver's own (its publisher,
        its marker), before the batch's PostgreSQL commit, unless its marker shows them produced
        (the batch run again after a crash before that commit)."""
        if self.publisher.last_published() >= batch_id:
            log.info("batch %d: its lost dead letters were produced before the restart", batch_id)
            return
        self.publisher.publish(batch_id, AlertSeq(), lost)

    def _deliver(self, out: BatchOutput, metas: list[ShardMeta], t0: float) -> None:
        watermark = self._watermark()
        tops = [m.max_ts for m in metas if m.max_ts is not None]
        n_events = sum(out.events.values())
        shard_s = max((m.seconds for m in metas), default=0.0)
        metrics = {
            "events_per_s": n_events / shard_s if shard_s > 0 else None,
            "batch_ms": shard_s * 1000,
            "lag_ms": time.time() * 1000 - max(tops) if tops else None,
            "alerts": len(out.alerts),
            "dead_letters": len(out.dead),
            "dead_letter_reasons": {r: int(k) for r, k in out.dead.counts().items() if k},
            "state_bytes": sum(m.state_bytes for m in self.metas.values()),
            "driver_cpu_ms": self._driver_cpu.since_last(),
        }
        d = self.delivery.deliver(
            out, watermark=watermark, metrics=metrics, kafka=self.delivery_by == "driver"
        )
        t_done = time.perf_counter()
        self.batches_done += 1
        for k, v in (
            ("events", n_events),
            ("alerts", len(out.alerts)),
            ("dead_letters", len(out.dead)),
            ("seconds", t_done - t0),
        ):
            self.totals[k] += v
        self.delivered.append((t0, t_done, n_events))
        self.schedule[out.batch_id] = (list(out.lookups), dict(out.strides))
        self.shard_seconds.append(shard_s)
        parts = {k for m in metas for k in m.extra}
        self.shard_parts.append({k: max(float(m.extra.get(k, 0.0)) for m in metas) for k in sorted(parts)})
        if len(self.delivered) > 100_000:
            del self.delivered[:50_000]
            del self.shard_seconds[:50_000]
            del self.shard_parts[:50_000]
            for b in sorted(self.schedule)[:50_000]:
                del self.schedule[b]
        log.info(
            "batch %d: %d events, %d alerts, %d dead letters, %d lookups up to %s over %d shards "
            "(slowest shard %.0f ms%s); delivered in %.0f ms (PostgreSQL %.0f, Kafka commit %.0f)",
            out.batch_id, n_events, len(out.alerts), len(out.dead), len(out.lookups),
            out.lookups[-1] if out.lookups else "-", len(metas), shard_s * 1000,
            "".join(f", shard {m.shard} {m.how} (Python worker {m.pid})" for m in metas if m.how != "live")
            + "".join(f", shard {m.shard}'s batch read again from Kafka" for m in metas if m.input == "read again"),
            (t_done - t0) * 1000, d.pg_s * 1000, d.kafka_s * 1000,
        )  # fmt: skip

    def close(self) -> None:
        self.charts.stop()
        self.delivery.close()
        self.publisher.close()
        self.store.engine.dispose()
