"""The driver's fixed cost of a micro-batch's executor read: ``mapInArrow``'s function made per
batch against one function per Spark context, side by side in one SparkSession.

``spark_preaggregate(df, params).toArrow()`` makes, pickles and registers the ``Preaggregator``
for every call (PySpark's ``pandas_udf`` + Py4J); ``collect_preaggregated(df, params)`` (the
engine's read, :mod:`engine.executors.collect`) makes it once and sends each call's parameters as
a task-local property.  The probe: ``--records`` Kafka-shaped trades (the engine's own Avro
encoding, spread over ``--tasks`` partitions of a cached DataFrame), pre-aggregated by both ways
alternately, ``--repeat`` times each after ``--warm`` calls of each; per way the median wall
time of a call and the driver process's CPU time per call (all its threads: PySpark's Py4J
client included), and their ratio.  Same JVM, same Python workers, same data and parameters;
the outputs are checked equal.

    .venv/bin/python bench/udf_reuse_probe.py --records 25000 --repeat 40
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from engine.executors.collect import collect_preaggregated  # noqa: E402
from engine.executors.preagg import KeySpec, SetSpec, batch_params, spark_preaggregate  # noqa: E402
from engine.executors.warmup import kafka_records_of  # noqa: E402
from engine.spark_session import build_spark  # noqa: E402
from tidewatch.settings import get_settings  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=25_000, help="trades per call (a live batch's)")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--warm", type=int, default=5)
    a = ap.parse_args()

    spark = build_spark(get_settings().model_copy(update={"spark_master": "local[2]"}), "udf-reuse-probe")
    spark.sparkContext.setLogLevel("ERROR")
    rng = np.random.default_rng(1)
    now = int(time.time() * 1000)
    n = a.records
    events = {
        "symbol": [f"S{i}" for i in rng.integers(0, 5000, n)],
        "price": rng.uniform(1, 100, n).round(2).tolist(),
        "size": rng.integers(1, 500, n).tolist(),
        "side": rng.choice(["BID", "ASK"], n).tolist(),
        "exchange": rng.choice(["NASDAQ", "NYSE"], n).tolist(),
        "ts": (now - 5000 + np.sort(rng.integers(0, 5000, n))).tolist(),
    }
    tbl = kafka_records_of("trades", "trades", events, 0)
    df = spark.createDataFrame(tbl.to_pandas()).repartition(a.tasks).cache()
    df.count()
    params = batch_params(
        pane_ms=1000,
        topics={"trades": "trades"},
        max_future_ms=60_000,
        panes=(KeySpec("trades", "symbol", (SetSpec("all", None, sums=("size",), minmax=("price",)),)),),
        late_until=now - 60_000,
        watermark=now - 30_000,
    )
    ways = {
        "made per call": lambda: spark_preaggregate(df, params).toArrow(),
        "one per context": lambda: collect_preaggregated(df, params),
    }
    rows = {k: 0 for k in ways}
    for name, call in ways.items():
        for _ in range(a.warm):
            rows[name] = call().num_rows
    assert rows["made per call"] == rows["one per context"], rows
    wall: dict[str, list[float]] = {k: [] for k in ways}
    cpu: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(a.repeat):
        for name, call in ways.items():
            c0, t0 = time.process_time(), time.perf_counter()
            call()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    print(
        f"{n:,} records, {a.tasks} tasks, {rows['made per call']:,} output rows, {a.repeat} calls each (alternating)"
    )
    for name in ways:
        print(
            f"  {name:16s} wall {1000 * statistics.median(wall[name]):7.1f} ms  "
            f"driver CPU {1000 * statistics.median(cpu[name]):6.1f} ms per call (median)"
        )
    w = statistics.median(wall["made per call"]) / statistics.median(wall["one per context"])
    c = statistics.median(cpu["made per call"]) / statistics.median(cpu["one per context"])
    print(f"  made per call / one per context: wall {w:.2f}x, driver CPU {c:.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
