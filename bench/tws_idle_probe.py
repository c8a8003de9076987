"""Probe for the sharded engine's charts on an idle stream (engine/shards/ticks.py): what does an
idle ``transformWithStateInPandas`` query cost with ``timeMode="ProcessingTime"`` -- Spark's own
way to run micro-batches without new data -- against ``timeMode="None"``?

A file source over a directory holding one small Parquet file (read by the first batch, nothing
new after), ``groupBy(k)`` into a stateful processor keeping one value per key (RocksDB state
store) that, in processing-time mode, registers a timer ``--timer-ms`` ahead at every call, so
that every no-data batch fires it; ``foreachBatch`` counts the rows; trigger ``--trigger`` s.
After ``--settle`` seconds it reads the CPU time of this process and all its children (Spark's
JVM, its Python workers) over ``--seconds`` of idling and prints the cores used and the batches
Spark ran meanwhile.

    .venv/bin/python bench/tws_idle_probe.py --mode None
    .venv/bin/python bench/tws_idle_probe.py --mode ProcessingTime
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
import psutil
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle


class Idle(StatefulProcessor):
    """One value per key; in processing-time mode a timer ``timer_ms`` ahead at every call."""

    def __init__(self, mode: str, timer_ms: int) -> None:
        self.mode, self.timer_ms = mode, timer_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.n = handle.getValueState("n", "n LONG")

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        n = sum(len(r) for r in rows)
        self.n.update((n,))
        if self.mode == "ProcessingTime":
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + self.timer_ms)
        yield pd.DataFrame({"k": [int(key[0])], "n": [n]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + self.timer_ms)
        yield pd.DataFrame({"k": [int(key[0])], "n": [-1]})

    def close(self) -> None:
        pass


def _cpu_s() -> float:
    """CPU seconds of this process and its children so far (psutil; children that ended are
    counted by their parent's ``children_*`` times)."""
    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["None", "ProcessingTime"], default="None")
    ap.add_argument("--trigger", type=float, default=0.5, help="trigger interval (s)")
    ap.add_argument("--timer-ms", type=int, default=400)
    ap.add_argument("--settle", type=float, default=40.0, help="seconds before measuring")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds measured")
    a = ap.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]
    )
    import tws_idle_probe as imported  # type: ignore[import-not-found]  # the workers import it

    spark: Any = (
        SparkSession.builder.master("local[2]")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.shuffle.partitions", "1")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tmp = tempfile.mkdtemp(prefix="tws-idle-")
    try:
        src = os.path.join(tmp, "in")
        os.makedirs(src)
        pd.DataFrame({"k": [1, 2, 3], "v": [1, 2, 3]}).to_parquet(os.path.join(src, "a.parquet"))
        batches: list[int] = []
        q = (
            spark.readStream.schema("k LONG, v LONG")
            .parquet(src)
            .groupBy("k")
            .transformWithStateInPandas(imported.Idle(a.mode, a.timer_ms), "k LONG, n LONG", "Append", a.mode)
            .writeStream.foreachBatch(
                lambda b, i: batches.append(int(i) + 0 * b.count())
            )  # every partition read
            .trigger(processingTime=f"{a.trigger} seconds")
            .option("checkpointLocation", os.path.join(tmp, "ckpt"))
            .start()
        )
        time.sleep(a.settle)
        c0, n0 = _cpu_s(), len(batches)
        time.sleep(a.seconds)
        c1, n1 = _cpu_s(), len(batches)
        q.stop()
        print(
            f"timeMode={a.mode}, trigger {a.trigger} s: idle query used {(c1 - c0) / a.seconds:.2f} of a core "
            f"over {a.seconds:.0f} s; {n1 - n0} micro-batches ran meanwhile"
        )
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
