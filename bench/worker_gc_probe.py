"""What a task of the executors' pre-aggregation costs in Spark's Python workers, with and without
the heap frozen as the task starts (``engine.runtime.gc_tuning.freeze_worker``).

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused Python worker; with
the engine's modules and kernels loaded, that walk is paid per task whatever the task did.  This
probe runs ``spark_preaggregate`` (``mapInArrow(Preaggregator)``) over a cached Kafka-shaped
DataFrame of ``--records`` trades in ``--tasks`` partitions -- by default the live run's shape:
25,000 records a micro-batch (0.5 s of 50,000 trades/s) over the topic's 2 partitions -- ``--jobs``
times, on the engine's Spark session, and reports the CPU of the Python workers per task, of the
JVM per job, and the wall time per job.  Each side runs in its own interpreter and Spark session
(a frozen heap stays frozen in a reused worker); the side ``thawed`` disables the freeze in its
workers (the code before it).  Sides alternate ``--repeat`` times::

    .venv/bin/python bench/worker_gc_probe.py --repeat 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sides import alternate  # noqa: E402


def _thawed(params: Any) -> Any:
    """The Preaggregator with the freeze disabled in the worker (the code before it)."""

    def run(batches: Any) -> Any:
        import engine.executors.preagg as preagg

        preagg.freeze_worker = lambda: None  # type: ignore[attr-defined]  # this worker only
        yield from preagg.Preaggregator(params)(batches)

    return run


def side(a: argparse.Namespace) -> None:
    """One side in this interpreter: JSON of its figures."""
    import psutil

    from bench.engine_bench import make_events
    from engine.executors.preagg import (
        KAFKA_COLUMNS,
        OUTPUT_DDL,
        KeySpec,
        Preaggregator,
        SetSpec,
        batch_params,
    )
    from engine.executors.warmup import kafka_records_of
    from engine.spark_session import build_spark
    from tidewatch.settings import get_settings

    s = get_settings()
    ev = make_events("trades", a.records, 5000, 50_000, int(time.time() * 1000), seed=1)
    tbl = kafka_records_of(s.topic_trades, "trades", ev, 0)
    # the live bench's mix: COUNT and SUM(size) thresholds, AVG / MIN / MAX of price, by symbol
    spec = KeySpec("trades", "symbol", (SetSpec("all", None, sums=("price", "size"), minmax=("price",)),))
    params = batch_params(
        pane_ms=s.pane_ms, topics={"trades": s.topic_trades}, max_future_ms=s.max_future_ms, panes=(spec,)
    )
    spark = build_spark(s, "worker-gc-probe")
    df = spark.createDataFrame(tbl.to_pandas()).repartition(a.tasks).cache()
    df.count()
    fn = _thawed(params) if a.side == "thawed" else Preaggregator(params)
    job = df.select(*KAFKA_COLUMNS).mapInArrow(fn, OUTPUT_DDL)
    me = psutil.Process()

    def cpu(match: str) -> float:
        """CPU-s of the child processes whose command line has ``match`` (the JVM's names
        pyspark's jars: the Python workers are matched as ``-m pyspark.daemon``)."""
        tot = 0.0
        for ch in me.children(recursive=True):
            try:
                cmd = ch.cmdline()
                if match == "java" and ch.name() == "java" or match != "java" and match in cmd:
                    t = ch.cpu_times()
                    tot += t.user + t.system
            except psutil.Error:
                continue
        return tot

    for _ in range(3):  # the workers started and their kernels loaded
        job.toArrow()
    w0, j0, t0 = cpu("pyspark.daemon"), cpu("java"), time.perf_counter()
    for _ in range(a.jobs):
        job.toArrow()
    w1, j1, t1 = cpu("pyspark.daemon"), cpu("java"), time.perf_counter()
    spark.stop()
    print(
        json.dumps(
            {
                "worker_ms_per_task": (w1 - w0) / (a.jobs * a.tasks) * 1000,
                "jvm_ms_per_job": (j1 - j0) / a.jobs * 1000,
                "wall_ms_per_job": (t1 - t0) / a.jobs * 1000,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=25_000, help="records per job (a micro-batch)")
    ap.add_argument("--tasks", type=int, default=2, help="tasks per job (the topic's partitions)")
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--side", choices=["thawed", "frozen"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        return side(a)
    args = [f"--records={a.records}", f"--tasks={a.tasks}", f"--jobs={a.jobs}"]
    got = alternate(
        __file__, args, ("thawed", "frozen"), a.repeat,
        lambda d: f"Python workers {d['worker_ms_per_task']:.1f} ms CPU per task, JVM {d['jvm_ms_per_job']:.0f} ms "
        f"CPU per job, {d['wall_ms_per_job']:.0f} ms wall per job",
    )  # fmt: skip
    for name, runs in got.items():
        med = {k: statistics.median(d[k] for d in runs) for k in runs[0]}
        print(
            f"{name}: Python workers {med['worker_ms_per_task']:.1f} ms CPU per task, JVM "
            f"{med['jvm_ms_per_job']:.0f} ms per job, wall {med['wall_ms_per_job']:.0f} ms per job (medians)"
        )


if __name__ == "__main__":
    main()
