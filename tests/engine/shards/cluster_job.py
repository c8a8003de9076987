"""The driver of ``test_sharded_cluster.py``:
``python -m tests.engine.shards.cluster_job BOOTSTRAP PG_URL TMP_DIR SHARDS KILLS``.

Builds the engine's SparkSession from the settings in the environment (``spark://…`` and the
driver's network settings) and runs the sharded engine's scenario
(:func:`tests.engine.shards.scenario.run_sharded_scenario`: alert log = backtest, Kafka once each,
dead letters once each, restart from Spark's state store, PSoup's late rule) on the cluster's
executors once for each shard count of ``SHARDS`` (comma-separated, one after the other in one
SparkSession, each with its own engine, checkpoint and database), SIGKILLing an executor JVM of
this application ``KILLS`` times during the first one's events, each kill after the engine
delivered two more batches.

Prints one JSON line (prefix ``RESULT ``): the shards' process ids with their ancestors, the
executors killed, the batches and rebuilds of each run (``runs``, in the order of ``SHARDS``);
a failed check raises (exit status 1).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _executors(app_id: str) -> list[Any]:
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if any("CoarseGrainedExecutorBackend" in c for c in cmd) and app_id in cmd:
            out.append(p)
    return sorted(out, key=lambda p: p.pid)


def main(bootstrap: str, pg_url: str, tmp: Path, shard_counts: list[int], kills: int) -> None:
    import psutil

    from engine.spark_session import build_spark
    from tests.engine.shards.scenario import run_sharded_scenario
    from tidewatch.settings import get_settings

    spark = build_spark(get_settings(), "tidewatch-shards-cluster-test")
    app_id = spark.sparkContext.applicationId
    killed: list[dict[str, Any]] = []

    def chaos(app: Any) -> None:
        start = app.batches_done
        for k in range(kills):
            deadline = time.monotonic() + 120
            while app.batches_done < start + 2 * (k + 1) and time.monotonic() < deadline:
                time.sleep(0.2)
            live = _executors(app_id)
            if not live:
                continue
            victim = live[k % len(live)]
            try:
                ancestors = [a.pid for a in victim.parents()]
            except psutil.Error:
                ancestors = []
            os.kill(victim.pid, signal.SIGKILL)
            killed.append({"pid": victim.pid, "ancestors": ancestors})
            print(f"killed executor {victim.pid} after batch {app.batches_done}", flush=True)

    result: dict[str, Any] = {"runs": [], "killed": killed, "driver_pid": os.getpid()}
    pids: set[int] = set()
    try:
        for i, shards in enumerate(shard_counts):
            t0 = time.monotonic()
            info = run_sharded_scenario(
                spark,
                bootstrap,
                pg_url,
                tmp / f"run-{i}-{shards}",
                shards,
                chaos=chaos if kills and i == 0 else None,
                per_trigger=600,
                timeout_s=420,
            )
            pids |= info["pids"]
            result["runs"].append(
                {
                    "shards": shards,
                    "scenario_s": round(time.monotonic() - t0, 1),
                    "batches": info["batches"],
                    "rebuilds": info["rebuilds"],
                    "rebuilds_first_run": info["rebuilds_first_run"],
                    "rebuilt_from": info["rebuilt_from"],
                    "alerts": info["alerts"],
                }
            )
            print(f"scenario with {shards} shards passed: {result['runs'][-1]}", flush=True)
        ancestors = {}
        for pid in sorted(pids):
            try:
                ancestors[str(pid)] = [p.pid for p in psutil.Process(pid).parents()]
            except psutil.NoSuchProcess:
                ancestors[str(pid)] = []
        result.update(shard_pids=ancestors, executors_now=[p.pid for p in _executors(app_id)])
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(
        sys.argv[1],
        sys.argv[2],
        Path(sys.argv[3]),
        [int(n) for n in sys.argv[4].split(",")],
        int(sys.argv[5]),
    )
