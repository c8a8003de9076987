"""A shard as Spark state: the stateful processor of ``transformWithStateInPandas`` (issue #23).

Spark groups the routed rows by shard (:mod:`engine.shards.route`) and calls
:meth:`ShardProcessor.handleInputRows` once per shard and micro-batch, in an executor's Python
worker, with the shard's state in Spark's state store (RocksDB, checkpointed with the query):

* ``snap`` (value state): the shard's whole :class:`engine.core.EngineCore` at batch ``batch``,
  in the snapshot format (:meth:`EngineCore.to_bytes`: versioned, no pickle), written every
  ``snapshot_every_batches`` batches;
* ``log`` (list state): each batch since ``snap``, as the shard received it (its routed records
  and the batch's span, Arrow IPC), appended every batch;
* ``at`` (value state): the last batch the state holds.

The state store is versioned by batch: a retried task, a task moved to another executor, or a
restarted query reads the state as of the batch before the one it runs.  What rebuilds the shard
is therefore in it: ``snap`` restored, then the batches of ``log`` run again (no output), which
gives the same state, as the core is deterministic.

A live core is kept between batches in the worker process (a Python worker serves many tasks,
Spark's ``spark.python.worker.reuse``) -- for speed only: it is used for batch ``b`` only if it is
exactly the state after the last batch the state store holds (``at``), and it is taken out of
the cache while a batch runs, so a task that fails half-way leaves nothing to reuse.  Otherwise
the shard is rebuilt from the state store.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from engine.core import EngineCore
from engine.errors import CheckpointMismatch
from engine.shards.route import ipc_bytes, ipc_table, merge_spans
from engine.shards.step import encode_output, meta_of, run_shard

log = logging.getLogger("tidewatch.engine")

#: the processor's output: one row per shard and batch
OUTPUT_DDL = "shard INT, out BINARY"
#: (engine, shard) -> (the query run it serves, the shard's live core, the last batch it holds);
#: module state of the Python worker (see the module docstring).  One entry per engine and shard:
#: a new run of the query replaces its old run's.
_LIVE: dict[tuple[str, int], tuple[str, EngineCore, int]] = {}


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
        self, settings: Any, engine: str, run: str, labels: list[int], topics: dict[str, str]
    ) -> None:
        self.settings, self.engine, self.run = settings, engine, run
        self.labels, self.topics = list(labels), dict(topics)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.at = handle.getValueState("at", "batch LONG")
        self.snap = handle.getValueState("snap", "batch LONG, data BINARY")
        self.log = handle.getListState("log", "batch LONG, records BINARY, span BINARY")

    def _fresh(self) -> EngineCore:
        from engine.app import default_core

        return default_core(self.settings)

    def _rebuild(self, shard: int, at: int) -> EngineCore:
        """The shard's core at batch ``at`` from the state store (module docstring)."""
        from engine.rule_evaluator import rule_compiler

        t0 = time.perf_counter()
        if self.snap.exists():
            _, data = self.snap.get()  # type: ignore[misc]
            core = EngineCore.from_bytes(bytes(data), rule_compiler(self.settings))
        else:
            core = self._fresh()
        entries = sorted(self.log.get(), key=lambda e: int(e[0])) if self.log.exists() else []
        n = len(self.labels)
        for b, rec, span in entries:
            if int(b) > core.last_batch:
                spans = merge_spans([ipc_table(bytes(span))])
                run_shard(core, int(b), shard, n, ipc_table(bytes(rec)), spans, self.topics)
        if at >= 0 and core.last_batch != at:
            raise CheckpointMismatch(
                f"shard {shard}: Spark's state store holds batch {at}, but its snapshot and batch "
                f"log rebuild batch {core.last_batch}: the state store is damaged. Start the engine "
                "with a new checkpoint directory and a new --engine-id."
            )
        log.info(
            "shard %d rebuilt at batch %d from Spark's state store (%d batches replayed) in %.2f s",
            shard, at, len(entries), time.perf_counter() - t0,
        )  # fmt: skip
        return core

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        label = int(key[0])
        shard = self.labels.index(label)
        batch = batch_of_task()
        recs: list[pa.Table] = []
        span_tables: list[pa.Table] = []
        for df in rows:
            recs += [ipc_table(bytes(b)) for b in df["records"]]
            span_tables += [ipc_table(bytes(b)) for b in df["span"]]
        records = pa.concat_tables(recs)
        span_t = pa.concat_tables(span_tables)
        at = int(self.at.get()[0]) if self.at.exists() else -1  # type: ignore[index]
        live = _LIVE.pop((self.engine, shard), None)  # out while this batch runs
        rebuilt = live is None or live[0] != self.run or live[2] != at
        core = self._rebuild(shard, at) if rebuilt else live[1]  # type: ignore[index]
        t0 = time.perf_counter()
        out = run_shard(core, batch, shard, len(self.labels), records, merge_spans([span_t]), self.topics)
        seconds = time.perf_counter() - t0
        self.log.appendValue((batch, ipc_bytes(records), ipc_bytes(span_t)))
        since = int(self.snap.get()[0]) if self.snap.exists() else -1  # type: ignore[index]
        if batch - since >= max(1, int(self.settings.snapshot_every_batches)):
            self.snap.update((batch, core.to_bytes()))
            self.log.clear()
        self.at.update((batch,))
        _LIVE[(self.engine, shard)] = (self.run, core, batch)
        meta = meta_of(core, shard, batch, seconds, rebuilt, os.getpid())
        yield pd.DataFrame({"shard": [label], "out": [encode_output(out, meta)]})

    def close(self) -> None:
        pass
