"""A shard as Spark state: the stateful processor of ``transformWithStateInPandas`` (issue #23).

Spark groups the routed rows by shard (:mod:`engine.shards.route`) and calls
:meth:`ShardProcessor.handleInputRows` once per shard and micro-batch, in an executor's Python
worker, with the shard's state in Spark's state store (RocksDB, checkpointed with the query):

* ``snapshot`` (value state): the batch, file name and size of the shard's last snapshot: its
  whole :class:`engine.core.EngineCore` in the snapshot format (versioned, no pickle, CRC-32), a
  file of the engine's checkpoint directory (``tidewatch/shards/shard-<s>/<batch>.<run>.bin``),
  due every ``snapshot_every_batches`` batches, written by a child the task forks and named by
  the shard's next batch in any worker (:meth:`ShardProcessor._snapshot`).  A file, not the value
  itself: a value of hundreds of MB through the state server ran the executor's JVM out of heap
  (10,000 rules over 100,000 keys, ≈ 350 MB per shard: docs/measurements/engine.md);
* ``log`` (list state): each batch since ``snapshot``: its Kafka offset ranges and its span (a few
  hundred bytes), appended every batch -- the records themselves are in Kafka, where a rebuild
  reads them again by offset (the engine's replay reader, :func:`engine.sources.readers.read_ranges`)
  and routes them again (deterministic): as Spark's own Kafka source re-reads an unfinished batch,
  a rebuild needs the batches since the last snapshot still within the topics' retention;
* ``at`` (value state): the last batch the state holds.

Each batch runs with the overload policy's strides the driver recorded for it
(:mod:`engine.shards.strides`, a file of the checkpoint directory), a rebuilt one too; after it
the shard answers the key page's chart requests of its keys the driver handed over
(:mod:`engine.shards.charts`).  With ``engine_shard_delivery = "tasks"`` (the default) the task
produces the shard's Kafka output itself, right after the evaluation, in a Kafka transaction of
the shard's own, exactly once (:mod:`engine.shards.produce`).

The state store is versioned by batch: a retried task, a task moved to another executor, or a
restarted query reads the state as of the batch before the one it runs.  What rebuilds the shard
is therefore in it (with the file it names): the snapshot restored, then the batches of ``log`` read again and run again (no
output), which gives the same state, as the core is deterministic.  (Logging the records
themselves in the state store cost ~0.9 s per batch of 100,000 records per shard through the
state server, more than the evaluation: docs/measurements/engine.md.)

A live core is kept between batches in the worker process (a Python worker serves many tasks,
Spark's ``spark.python.worker.reuse``) -- for speed only: it is used for batch ``b`` only if it is
exactly the state after the last batch the state store holds (``at``), and it is taken out of
the cache while a batch runs, so a task that fails half-way leaves nothing to reuse.  A worker
whose core is a few batches behind (another worker ran the shard meanwhile: Spark gives a task
any idle Python worker of its executor) brings it forward with the logged batches; otherwise the
shard is rebuilt from the snapshot.

The worker also does what the driver's engine does for its first and its growing batches: at its
first shard task it loads the evaluation's compiled kernels (the driver's warm-up), and it runs
the driver's :class:`engine.runtime.prefault.SpareWarmer` -- the row columns a shard's structures
make ahead of their next growth are faulted in on a thread of the worker between its tasks, so a
growth does not hold the shard's batch up for its page faults.  Its cores' log lines (a
subscription active, dropped or refused; a snapshot written) go to the worker's stderr, which
Spark hands to the executor's log -- in local mode the engine's own (:func:`_worker_log`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from engine.algorithms import make_spares
from engine.core import EngineCore, default_core
from engine.errors import CheckpointMismatch
from engine.executors.preagg import OUTPUT_SCHEMA
from engine.runtime.gc_tuning import freeze_worker
from engine.runtime.prefault import SpareWarmer
from engine.runtime.snapshot_writer import SnapshotWriter, remove_stale_temporaries
from engine.shards.charts import RequestFile, answer_owned
from engine.shards.panes import params_bytes, params_match, run_shard_panes, shard_rows, task_params
from engine.shards.produce import publish_shard
from engine.shards.route import (
    SPAN_SCHEMA,
    Ranges,
    ipc_bytes,
    ipc_table,
    merge_ranges,
    merge_spans,
    route_records,
    split_span,
)
from engine.shards.step import encode_output, meta_of, run_shard
from engine.shards.strides import StrideFile
from engine.shards.ticks import is_tick

log = logging.getLogger("tidewatch.engine")

#: the processor's output: one row per shard and batch
OUTPUT_DDL = "shard INT, out BINARY"
#: (engine, shard) -> (the query run it serves, the shard's live core, the last batch it holds);
#: module state of the Python worker (see the module docstring).  One entry per engine and shard:
#: a new run of the query replaces its old run's.
_LIVE: dict[tuple[str, int], tuple[str, EngineCore, int]] = {}
#: (engine, shard) -> (the query run it serves, the writer of the shard's snapshot files in this
#: worker: what it wrote is named in the state store by a later batch of that run)
_WRITERS: dict[tuple[str, int], tuple[str, SnapshotWriter]] = {}
#: this worker's thread faulting in the row columns its shards' structures make ahead of their
#: next growth (:class:`engine.runtime.prefault.SpareWarmer`, as the driver's engine runs one):
#: made, with the structures' spares turned on in the worker, by the first shard task it runs
_WARMER: list[SpareWarmer] = []


#: the seconds this worker took to load the evaluation's compiled kernels (empty: not yet)
_KERNELS: list[float] = []
#: whether this worker's engine log is set up (:func:`_worker_log`; empty: not yet)
_LOGGING: list[bool] = []
#: the worker's engine log lines: the engine CLI's format (``engine.cli``), the worker named
WORKER_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s (shard worker %(process)d): %(message)s"


def _worker_log() -> None:
    """The engine's log lines of this worker -- its cores' "subscription ... is active" (one
    per shard it holds), "... refused" and "... dropped", its snapshots -- written to its stderr,
    which Spark hands to the executor's log (in local mode the engine's own log).  A Spark Python
    worker starts with no logging handler, so those INFO lines reached no log.  Done once per
    worker, and only where nothing is set up (a shard run in a process that logs already, as in
    the tests, keeps that process's handlers)."""
    if _LOGGING:
        return
    _LOGGING.append(True)
    engine_log = logging.getLogger("tidewatch.engine")
    if engine_log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(WORKER_LOG_FORMAT))
    engine_log.addHandler(handler)
    engine_log.setLevel(logging.INFO)


def _load_kernels(settings: Any, topics: dict[str, str]) -> None:
    """The evaluation's compiled kernels loaded in this worker at its first shard task, by the
    driver engine's warm-up (:func:`engine.runtime.driver_warmup.warm_driver`: a throwaway core
    through a few synthetic batches on pane rows), so that the shard's first batches with events
    do not pay for them (live: 2.3-2.6 s on a shard's first lookup batch)."""
    if _KERNELS:
        return
    from engine.runtime.driver_warmup import warm_driver

    took, _ = warm_driver(lambda: default_core(settings), topics, executors=True)
    _KERNELS.append(took)
    log.info("a shard's Python worker loaded the evaluation's kernels (warm-up) in %.1f s", took)


def _spare_warmer() -> SpareWarmer:
    """This worker's :data:`_WARMER` (spares on in this process from the first call)."""
    if not _WARMER:
        make_spares(True)
        _WARMER.append(SpareWarmer())
    return _WARMER[0]


def batch_of_task() -> int:
    """The micro-batch the running task belongs to (Spark sets it as a local property)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    value = tc.getLocalProperty("streaming.sql.batchId") if tc is not None else None
    if value is None:
        raise CheckpointMismatch("a shard ran outside a streaming micro-batch: no batch id")
    return int(value)


class ShardProcessor(StatefulProcessor):
    """The shard's state and its per-batch step (module docstring).  Picklable: the settings, the
    engine (its checkpoint and id), the query run, the shard labels and the topics."""

    def __init__(
        self,
        settings: Any,
        engine: str,
        run: str,
        labels: list[int],
        topics: dict[str, str],
        bootstrap: str,
        snapshots: str,
        strides: str | None = None,
        charts: str | None = None,
        panes: bool = False,
        publish_as: str | None = None,
    ) -> None:
        self.settings, self.engine, self.run, self.bootstrap = settings, engine, run, bootstrap
        #: the engine id under which each shard's task produces its Kafka output
        #: (:mod:`engine.shards.produce`); None: the driver delivers the merged batch
        self.publish_as = publish_as
        #: the shards evaluate pane rows (``engine_shard_input = "panes"``, :mod:`engine.shards.panes`)
        self.panes = panes
        self.snapshots = snapshots
        #: the driver's strides file (:mod:`engine.shards.strides`); None: no overload policy
        self.strides = strides
        #: the driver's chart requests file (:mod:`engine.shards.charts`); None: no charts
        self.charts = charts
        self.labels, self.topics = list(labels), dict(topics)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.at = handle.getValueState("at", "batch LONG")
        self.snapshot = handle.getValueState("snapshot", "batch LONG, file STRING, size LONG")
        self.log = handle.getListState("log", "batch LONG, ranges BINARY, span BINARY")

    def _fresh(self) -> EngineCore:
        return default_core(self.settings)

    def _catch_up(
        self, shard: int, at: int, live: tuple[str, EngineCore, int] | None
    ) -> tuple[EngineCore, str]:
        """The shard's core at batch ``at`` (the last the state store holds): this worker's live
        core if it is there already (``"live"``); else that core brought forward by the batches of
        ``log`` after it, when ``log`` has every one of them (``"caught up"``: another worker ran
        them); else the snapshot restored and every batch of ``log`` run again (``"rebuilt"``).  A live
        core of another run of the query is never used."""
        if live is not None and live[0] == self.run and live[2] == at:
            return live[1], "live"
        t0 = time.perf_counter()
        since = int(self.snapshot.get()[0]) if self.snapshot.exists() else -1  # type: ignore[index]
        usable = live is not None and live[0] == self.run and since <= live[2] < at
        if usable:
            core, how = live[1], "caught up"  # type: ignore[index]
        elif since >= 0:
            core, how = self._restore(shard), "rebuilt"
        else:
            core, how = self._fresh(), "rebuilt"
        entries = sorted(self.log.get(), key=lambda e: int(e[0])) if self.log.exists() else []
        n, ran = len(self.labels), 0
        for b, ranges, span in entries:
            if core.last_batch < int(b) <= at:
                spans = merge_spans([ipc_table(bytes(span))])
                if self.panes:
                    own = core.batch_params(self.topics)
                    rows = self._rows_again(json.loads(bytes(ranges)), own, shard)
                    waiting = split_span(spans)[1]
                    run_shard_panes(
                        core, int(b), shard, n, rows, own, waiting, self._history(), self._strides(int(b))
                    )
                else:
                    records = self._read_again(json.loads(bytes(ranges)), shard)
                    run_shard(core, int(b), shard, n, records, spans, self.topics, self._strides(int(b)))
                ran += 1
        if core.last_batch != at:
            raise CheckpointMismatch(
                f"shard {shard}: Spark's state store holds batch {at}, but its snapshot and batch "
                f"log rebuild batch {core.last_batch}: the state store is damaged. Start the engine "
                "with a new checkpoint directory and a new --engine-id."
            )
        log.info(
            "shard %d %s at batch %d from Spark's state store (%d batches run again) in %.2f s",
            shard, how, at, ran, time.perf_counter() - t0,
        )  # fmt: skip
        return core, how

    def _read_again(self, ranges: Ranges, shard: int) -> pa.Table:
        """This shard's records of a logged batch: its offset ranges read again from Kafka (the
        engine's replay reader) and routed again (:func:`route_records`, deterministic)."""
        from engine.sources.readers import read_ranges

        records = read_ranges(self.bootstrap, ranges, settings=self.settings)
        tables, _ = route_records(records, self.topics, len(self.labels), self.settings.max_future_ms)
        return tables[shard]

    def _no_records(self, shard: int) -> pa.Table:
        """A shard's records of a batch that has none (a tick's, :mod:`engine.shards.ticks`)."""
        from engine.sources.readers import records_table

        tables, _ = route_records(
            records_table([]), self.topics, len(self.labels), self.settings.max_future_ms
        )
        return tables[shard]

    def _rows_again(self, ranges: Ranges, params: Any, shard: int) -> pa.Table:
        """This shard's pane rows of a batch (:func:`engine.shards.panes.shard_rows`): its offset
        ranges read again from Kafka and pre-aggregated here with ``params``."""
        from engine.sources.readers import read_ranges

        records = read_ranges(self.bootstrap, ranges, settings=self.settings)
        return shard_rows(records, params, shard, len(self.labels))

    def _history(self) -> Any:
        """Where a rule's history is read again from Kafka (:mod:`engine.executors.history`)."""
        from engine.executors.history import records_source
        from engine.sources.readers import read_ranges

        return records_source(
            lambda r: read_ranges(self.bootstrap, r, settings=self.settings),
            self.topics,
            self.settings.max_future_ms,
        )

    def _strides(self, batch: int) -> dict[str, int]:
        """The overload policy's strides of ``batch``, as the driver decided them."""
        return StrideFile(self.strides).strides_for(batch) if self.strides else {}

    def _snapshot_dir(self, shard: int) -> Path:
        return Path(self.snapshots) / f"shard-{shard}"

    def _snapshot(self, shard: int, batch: int, core: EngineCore) -> tuple[int, float, int]:
        """Take the shard's snapshot when due, so no task serializes a whole shard: when due, the
        shard's :class:`SnapshotWriter` of this worker snapshots the core to a file of the
        checkpoint directory (``shard-<s>/<batch>.<run>.bin``, :meth:`EngineCore.capture` format)
        -- by a forked child (``engine_snapshot_fork``, the default: the task waits for the fork
        only) or captured by the task and written by a thread; a later batch of the shard names
        the written file in ``snapshot`` and keeps only the logged batches after it.  That batch
        may run in another Python worker (Spark gives a task any idle one): a complete file of
        *this run of the query* (its run id in the name; written to a temporary file and renamed
        when whole, so a file under its final name is whole) of a batch after the named one and
        before this one is the shard's state after that batch -- the core is deterministic, and
        within one run a batch's state has one lineage -- so any worker names it (its size read
        from the file).  A file of an earlier run is never named (after a restart Spark may run
        its batch on other offsets).  Until one is named ``log`` goes on growing, so the state
        store always rebuilds the shard.  Files of batches before the snapshot the committed
        state names are deleted.
        Returns the batch of the snapshot the state store names now (-1: none), the seconds this
        task spent starting one (0.0 when none was due) and the size in bytes of the snapshot it
        named (0: none named by this batch)."""
        key = (self.engine, shard)
        since = int(self.snapshot.get()[0]) if self.snapshot.exists() else -1  # type: ignore[index]
        run, writer = _WRITERS.get(key, ("", None))
        if writer is None or run != self.run:
            writer = SnapshotWriter(
                keep=10**9,
                fork=bool(self.settings.engine_snapshot_fork),
                prefault=bool(self.settings.engine_snapshot_prefault),
            )
            _WRITERS[key] = (self.run, writer)
            remove_stale_temporaries(self._snapshot_dir(shard))  # of writers killed mid-write
        start_s, named = 0.0, 0
        done = self._whole_files(shard, since, batch)  # of this worker's writer or another's
        if done:
            b_snap, path, size = max(done, key=lambda w: int(w[0]))
            self.snapshot.update((b_snap, path.name, size))
            kept = [e for e in self.log.get() if int(e[0]) > b_snap] if self.log.exists() else []
            self.log.clear()
            if kept:
                self.log.put(kept)
            for old in self._snapshot_dir(shard).glob("*.bin"):  # older than the committed one
                if int(old.name.split(".")[0]) < since:
                    old.unlink(missing_ok=True)
            writer.written = [w for w in writer.written if w[0] >= b_snap]
            since, named = b_snap, size
        if batch - since >= max(1, int(self.settings.snapshot_every_batches)) and not writer.busy:
            t0 = time.perf_counter()
            writer.write(
                batch,
                self._snapshot_dir(shard) / f"{batch:012d}.{self.run}.bin",
                core.capture,
                core.evaluator,
            )
            start_s = time.perf_counter() - t0
        return since, start_s, named

    def _whole_files(self, shard: int, since: int, batch: int) -> list[tuple[int, Path, int]]:
        """``(batch, path, bytes)`` of the whole snapshot files of this run of the query, of
        batches after ``since`` and before ``batch``, whichever worker wrote them (a file is under
        its final name only once whole)."""
        out = []
        for path in self._snapshot_dir(shard).glob(f"*.{self.run}.bin"):
            b = int(path.name.split(".")[0])
            if since < b < batch:
                try:
                    out.append((b, path, path.stat().st_size))
                except FileNotFoundError:  # deleted meanwhile (a later snapshot was named)
                    continue
        return out

    def _restore(self, shard: int) -> EngineCore:
        """The core of the snapshot file ``snapshot`` names (checked: there, and of its size)."""
        from engine.rule_evaluator import rule_compiler

        b_snap, name, size = self.snapshot.get()  # type: ignore[misc]
        path = self._snapshot_dir(shard) / str(name)
        have = path.stat().st_size if path.exists() else None
        if have != int(size):
            raise CheckpointMismatch(
                f"shard {shard}: Spark's state store names its snapshot of batch {b_snap}, {path} "
                f"({size} bytes), but the file is {'missing' if have is None else f'{have} bytes'}. "
                "The checkpoint directory must be storage every executor shares and keeps whole; "
                "restore it from a backup, or start with a new checkpoint directory and a new "
                "--engine-id (the topics are read again)."
            )
        return EngineCore.from_bytes(path.read_bytes(), rule_compiler(self.settings))

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        freeze_worker()  # PySpark's collection after the task: not over the shard's whole state
        _worker_log()
        warmer = _spare_warmer()
        _load_kernels(self.settings, self.topics)
        t_in = time.perf_counter()
        label = int(key[0])
        shard = self.labels.index(label)
        batch = batch_of_task()
        recs: list[pa.Table] = []
        panes: list[pa.Table] = []
        made: list[str | None] = []
        span_tables: list[pa.Table] = []
        ranges: list[Ranges] = []
        for df in rows:
            df = df[[not is_tick(s) for s in df["span"]]]  # a tick's rows: nothing to evaluate
            recs += [ipc_table(bytes(b)) for b in df["records"] if b is not None]
            panes += [ipc_table(bytes(b)) for b in df["panes"] if b is not None]
            made += [None if m is None or m != m else str(m) for m in df["made"]]  # NaN: null
            span_tables += [ipc_table(bytes(b)) for b in df["span"]]
            ranges += [json.loads(bytes(b)) for b in df["ranges"]]
        span_t = pa.concat_tables(span_tables) if span_tables else SPAN_SCHEMA.empty_table()
        batch_ranges = merge_ranges(ranges)
        t_state = time.perf_counter()
        at = int(self.at.get()[0]) if self.at.exists() else -1  # type: ignore[index]
        live = _LIVE.pop((self.engine, shard), None)  # out while this batch runs
        core, how = self._catch_up(shard, at, live)
        t0 = time.perf_counter()
        strides = self._strides(batch)
        n = len(self.labels)
        spans = merge_spans([span_t])
        if self.panes:
            own = core.batch_params(self.topics)
            if not span_tables:  # a tick alone (engine.shards.ticks): an empty batch
                got, rows_in = "tick", OUTPUT_SCHEMA.empty_table()
            elif params_match(made, task_params(), own):
                got, rows_in = "panes", pa.concat_tables(panes)
            else:  # the routing had no parameters, or others: the batch read again (module docstring)
                got, rows_in = "read again", self._rows_again(batch_ranges, own, shard)
            out = run_shard_panes(
                core, batch, shard, n, rows_in, own, split_span(spans)[1], self._history(), strides
            )
        else:
            got = "records" if span_tables else "tick"
            records = pa.concat_tables(recs) if recs else self._no_records(shard)
            out = run_shard(core, batch, shard, n, records, spans, self.topics, strides)
        t_pub = time.perf_counter()
        published = None
        if self.publish_as is not None:  # the shard's Kafka output, from this task, exactly once
            published = publish_shard(
                self.settings, self.bootstrap, self.publish_as, shard, out, live=how == "live"
            )
        t_log = time.perf_counter()
        self.log.appendValue((batch, json.dumps(batch_ranges).encode(), ipc_bytes(span_t)))
        t_snap = time.perf_counter()
        snapshot_of, start_s, named = self._snapshot(shard, batch, core)
        self.at.update((batch,))
        _LIVE[(self.engine, shard)] = (self.run, core, batch)
        warmer.after_batch(core.evaluator)  # a growth's memory faulted in between this worker's tasks
        t_out = time.perf_counter()
        meta = meta_of(core, shard, batch, t_pub - t0, how, os.getpid())
        meta.published = published.how if published is not None else ""
        meta.snapshot_of, meta.snapshot_bytes, meta.ranges = snapshot_of, named, batch_ranges
        meta.input = got
        if self.panes and shard == 0:  # the next batch's parameters, for the driver to hand on
            meta.next_params = params_bytes(core.batch_params(self.topics))
        if self.charts:  # the key page's chart requests of this shard's keys, from its state now
            requests = RequestFile(self.charts).read()
            meta.charts = answer_owned(core, shard, len(self.labels), requests, self.settings.pane_ms)
        meta.extra = {  # where the shard's task spent its Python time (s); "snapshot" includes
            # "snapshot_start": the fork of the child writing a snapshot (or the capture)
            "input": t_state - t_in, "catch_up": t0 - t_state, "evaluate": t_pub - t0,
            "publish": t_log - t_pub,
            "log": t_snap - t_log, "snapshot": t_out - t_snap, "snapshot_start": start_s,
            "charts": time.perf_counter() - t_out,
        }  # fmt: skip
        yield pd.DataFrame({"shard": [label], "out": [encode_output(out, meta)]})

    def close(self) -> None:
        pass
