"""Probe for issue #23 (sharded evaluation): Spark's ``transformWithStateInPandas`` keyed by shard
on this machine -- does it run here, what does one micro-batch cost with (almost) no work, what
does a task know of its batch, does a Python worker keep module state across batches.

A ``rate`` source (``--rows-per-s``), ``shard = value % --shards``, ``groupBy(shard)`` into a
stateful processor that keeps a row count and a 16-byte value per shard (RocksDB state store) and
emits one row per shard and batch: the count, the worker's pid, whether a module-level cache of
that worker already held the shard (``cached``), the task's partition and the batch id the task
reads from its local property ``streaming.sql.batchId``.  Prints each batch's rows and, at the
end, each batch's input rows and durations (``triggerExecution``, ``addBatch``, the state
operator's ``commitTimeMs``) from Spark's progress reports, then the medians after the first three
batches of every duration and of the state operator's timings (RocksDB's commit parts among them).

To see what the stateful operator adds to a micro-batch, run the same stream without it:
``--stateless`` (the same shuffle by shard into ``applyInPandas``) or ``--plain`` (``mapInPandas``,
no shuffle); ``--conf KEY=VALUE`` sets a Spark configuration entry (e.g. RocksDB's changelog
checkpointing); ``--warm SECONDS`` runs the same query that long first, on its own checkpoint,
and prints the measured query's median ``addBatch`` of its first ten micro-batches (a warm JVM's
start against a cold one).

    .venv/bin/python bench/tws_probe.py --seconds 40 --rows-per-s 20000 --shards 2
    .venv/bin/python bench/tws_probe.py --seconds 25 --rows-per-s 200 --shards 1 --stateless
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

#: shard -> times this worker process saw it (module state: survives tasks if the worker does)
CACHE: dict[int, int] = {}
OUT = StructType(
    [
        StructField(n, t)
        for n, t in [
            ("shard", LongType()), ("n", LongType()), ("pid", LongType()), ("cached", LongType()),
            ("part", LongType()), ("batch", StringType()),
        ]
    ]
)  # fmt: skip


class Shard(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.snap = handle.getValueState("snap", StructType([StructField("b", BinaryType())]))
        self.count = handle.getValueState("n", StructType([StructField("n", LongType())]))

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        from pyspark import TaskContext

        shard = int(key[0])
        n = sum(len(df) for df in rows)
        prev = self.count.get()[0] if self.count.exists() else 0
        self.count.update((prev + n,))
        self.snap.update((os.urandom(16),))
        seen = CACHE.get(shard, 0)
        CACHE[shard] = seen + 1
        tc = TaskContext.get()
        yield pd.DataFrame(
            {
                "shard": [shard], "n": [prev + n], "pid": [os.getpid()], "cached": [seen],
                "part": [tc.partitionId() if tc else -1],
                "batch": [tc.getLocalProperty("streaming.sql.batchId") if tc else None],
            }
        )  # fmt: skip

    def close(self) -> None:
        pass


def _summary(shard: int, n: int) -> pd.DataFrame:
    """The output row of the variants without state (``--plain``, ``--stateless``)."""
    return pd.DataFrame(
        {"shard": [shard], "n": [n], "pid": [os.getpid()], "cached": [0], "part": [-1], "batch": [None]}
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--rows-per-s", type=int, default=20_000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark conf entry")
    ap.add_argument(
        "--stateless", action="store_true", help="the same shuffle by shard, no state (applyInPandas)"
    )
    ap.add_argument("--plain", action="store_true", help="no shuffle, no state (mapInPandas)")
    ap.add_argument(
        "--warm",
        type=float,
        default=0,
        metavar="SECONDS",
        help="run the same query this long first (its own checkpoint), then the measured one",
    )
    a = ap.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the state server's Python runner too
    # the processor must be importable by the workers (not pickled with __main__'s globals)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]
    )
    from tws_probe import Shard as ImportedShard  # type: ignore[import-not-found]

    spark: Any = (
        SparkSession.builder.master("local[2]")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.shuffle.partitions", str(a.shards))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
    )
    for kv in a.conf:
        k, _, v = kv.partition("=")
        spark = spark.config(k, v)
    spark = spark.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    ck = tempfile.mkdtemp(prefix="tws-probe-")
    warm_ck = tempfile.mkdtemp(prefix="tws-probe-warm-")
    try:
        src = spark.readStream.format("rate").option("rowsPerSecond", a.rows_per_s).load()
        df = src.selectExpr(f"CAST(value % {a.shards} AS LONG) AS shard", "value")
        if a.plain:
            res = df.mapInPandas(lambda it: iter([_summary(0, sum(len(p) for p in it))]), OUT)
        elif a.stateless:
            res = df.groupBy("shard").applyInPandas(lambda k, pdf: _summary(int(k[0]), len(pdf)), OUT)
        else:
            res = df.groupBy("shard").transformWithStateInPandas(ImportedShard(), OUT, "Update", "None")

        def sink(bdf: Any, bid: int) -> None:
            print("batch", bid, [r.asDict() for r in bdf.collect()], flush=True)

        if a.warm > 0:  # the same plan run first: Spark's JVM and the stages warm
            w = (
                res.writeStream.foreachBatch(lambda bdf, bid: bdf.collect())
                .option("checkpointLocation", warm_ck)
                .trigger(processingTime="0.5 seconds")
                .start()
            )
            time.sleep(a.warm)
            w.stop()
            print("warm-up batches:", [p["durationMs"].get("addBatch", 0) for p in w.recentProgress])
        q = (
            res.writeStream.foreachBatch(sink)
            .option("checkpointLocation", ck)
            .trigger(processingTime="0.5 seconds")
            .start()
        )
        time.sleep(a.seconds)
        q.stop()
        first = sorted(p["durationMs"].get("addBatch", 0) for p in q.recentProgress[:10])
        if first:
            print(f"median addBatch of the first 10 batches: {first[len(first) // 2]} ms")
        print("batch  input rows  triggerExecution ms  addBatch ms  commit ms")
        trig = []
        for p in q.recentProgress:
            d = p["durationMs"]
            commit = (p.get("stateOperators") or [{}])[0].get("commitTimeMs", 0)
            trig.append(d.get("triggerExecution", 0))
            print(
                f"{p['batchId']:>5}  {p['numInputRows']:>10}  {d.get('triggerExecution', 0):>19}  "
                f"{d.get('addBatch', 0):>11}  {commit:>9}"
            )
        trig = sorted(trig[3:])
        if trig:
            print(
                f"median triggerExecution after 3 batches: {trig[len(trig) // 2]} ms over {len(trig)} batches"
            )
        parts: dict[str, list[float]] = {}
        for p in q.recentProgress[3:]:
            for k, v in p["durationMs"].items():
                parts.setdefault(k, []).append(float(v))
            for op in p.get("stateOperators") or []:
                for k, v in {**op, **(op.get("customMetrics") or {})}.items():
                    if isinstance(v, (int, float)) and ("Ms" in k or "Latency" in k or "ms" in k.lower()):
                        parts.setdefault(k, []).append(float(v))
        print("medians after 3 batches:", {k: sorted(v)[len(v) // 2] for k, v in parts.items()})
    finally:
        spark.stop()
        shutil.rmtree(ck, ignore_errors=True)
        shutil.rmtree(warm_ck, ignore_errors=True)


if __name__ == "__main__":
    main()
