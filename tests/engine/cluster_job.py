"""The driver of ``test_spark_cluster.py``:
``python -m tests.engine.cluster_job TOPIC BOOTSTRAP PG_URL TMP_DIR [PREAGGREGATE]`` (default
``executors``, the engine's default).

Builds the engine's SparkSession (:func:`engine.spark_session.build_spark`) from the settings in
the environment (``TIDEWATCH_SPARK_MASTER=spark://…`` and the driver's network settings) and runs
on the cluster's executors:

* a ``SELECT`` over a tiny DataFrame that reports the process id of the JVM each row was computed
  in (``reflect('java.lang.ProcessHandle', 'current')``), each task held 300 ms so both
  one-core executors get some;
* the engine's read of Kafka without ``mapInArrow`` -- Spark's Kafka source,
  ``select(RECORD_COLUMNS).toArrow()`` -- over ``TOPIC``, with the reading JVM's process id per
  record: the connector jars reached the executors;
* a Python function on the executors that reports the interpreter running it
  (``spark.pyspark.python``);
* then the engine itself on this session: the scenario of ``test_engine_integration.py``
  (:func:`tests.engine.test_engine_integration.run_scenario`: alert log = backtest, Kafka once
  each, dead letters, PSoup's late rule), its Kafka reads, decoding and (key, pane)
  pre-aggregation on the cluster's executors (``mapInArrow`` tasks in their Python workers, whose
  process ids and ancestors it reports).

Prints one JSON line (prefix ``RESULT ``) with what it saw, for the test to judge; a failed
check of the engine's scenario raises (exit status 1, traceback in the output).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(topic: str, bootstrap: str, pg_url: str, tmp: Path, preaggregate: str = "executors") -> None:
    import psutil

    from engine.sources.readers import RECORD_COLUMNS
    from engine.spark_session import build_spark
    from tests.engine.test_engine_integration import run_scenario
    from tidewatch.settings import get_settings

    settings = get_settings()
    spark = build_spark(settings, "tidewatch-cluster-test")
    sc = spark.sparkContext
    try:
        pid_of_row = "reflect('java.lang.ProcessHandle', 'current')"
        rows = (
            spark.range(0, 8, numPartitions=8)
            .selectExpr("id", f"{pid_of_row} AS pid", "reflect('java.lang.Thread', 'sleep', 300L) AS slept")
            .collect()
        )
        kafka = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr(*RECORD_COLUMNS, f"{pid_of_row} AS pid")
            .toArrow()
        )
        python = (
            sc.parallelize(range(4), 4).mapPartitions(lambda _: [(sys.executable, os.getpid())]).collect()
        )
        jsc = sc._jsc.sc()  # type: ignore[union-attr]
        # read while the executors are alive: each row's JVM, its parent and what it runs
        processes = {}
        for pid in {int(r["pid"]) for r in rows} | {int(p) for p in kafka.column("pid").to_pylist()}:
            proc = psutil.Process(pid)
            processes[str(pid)] = {"ppid": proc.ppid(), "main": _main_class(proc.cmdline())}
        result = {
            "driver_jvm_pid": int(sc._jvm.java.lang.ProcessHandle.current().pid()),  # type: ignore[union-attr]
            "master": sc.master,
            "conf": {
                k: v
                for k, v in sc.getConf().getAll()
                if k.startswith(("spark.driver.", "spark.blockManager."))
            },
            # host:port of every block manager: the driver's and each executor's
            "block_managers": sorted(str(jsc.getExecutorMemoryStatus().keys().mkString(",")).split(",")),
            "processes": processes,
            "select_pids": sorted({int(r["pid"]) for r in rows}),
            "select_rows": len(rows),
            "kafka_rows": kafka.num_rows,
            "kafka_columns": kafka.column_names,
            "kafka_pids": sorted({int(p) for p in kafka.column("pid").to_pylist()}),
            "python": sorted({exe for exe, _ in python}),
            "python_pids": sorted({pid for _, pid in python}),
        }
        print("PROBE " + json.dumps(result), flush=True)
        t0 = time.monotonic()
        # engine_preaggregate = executors (the default: decode and panes in mapInArrow tasks)
        pane_pids = run_scenario(spark, bootstrap, pg_url, tmp, preaggregate)
        result["engine_scenario_s"] = round(time.monotonic() - t0, 1)
        # the processes the pane rows came from, and their ancestors' process ids (read while
        # the executors, whose Python workers they are, are alive)
        result["pane_pids"] = {str(pid): _ancestors(pid) for pid in sorted(pane_pids)}
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


def _ancestors(pid: int) -> list[int]:
    """Process ids of ``pid``'s parent, its parent's parent, ... (empty when it is gone)."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).parents()]
    except psutil.NoSuchProcess:
        return []


def _main_class(cmdline: list[str]) -> str | None:
    """The main class of a ``java`` command line (the first argument naming an ``org.`` class)."""
    return next((a for a in cmdline if a.startswith("org.apache.spark.")), None)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), *sys.argv[5:6])
