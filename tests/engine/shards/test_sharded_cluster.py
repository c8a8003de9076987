"""The sharded engine on a real standalone cluster and on ``local-cluster`` (issue #23, "Proof"),
the driver in its own process (``tests/engine/shards/cluster_job.py``), with N = 2, 1 and 4
shards one after the other: the scenario's checks hold each time (alert log = backtest for the
scenario's rules, every RULES.md example and a random mix; Kafka once each, dead letters once
each, a restart rebuilds the shards from Spark's state store and their snapshot files, PSoup's
late rule).  On the standalone master (two workers of one core each, pyspark's own
``spark-class``) an executor JVM is SIGKILLed three times during the two-shard run: Spark
reschedules the shard tasks on the relaunched executors, the shards come back from the state
store, nothing is lost and nothing doubled.  The shards ran in Python workers of executor JVMs
the workers launched, never in the driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.engine.test_spark_cluster import executor_pids, spark_home, two_worker_cluster
from tests.services import free_port
from tidewatch.settings import PROJECT_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.timeout(1800)
def test_sharded_engine_on_a_cluster_survives_killed_executors(
    kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    with two_worker_cluster(tmp_path, worker_memory="2g") as (_, workers, master_url, _env):
        job_env = {
            **os.environ,
            "TIDEWATCH_SPARK_MASTER": master_url,
            "TIDEWATCH_SPARK_DRIVER_HOST": "127.0.0.1",
            "TIDEWATCH_SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1",
            "TIDEWATCH_SPARK_DRIVER_PORT": str(free_port()),
            "TIDEWATCH_SPARK_BLOCK_MANAGER_PORT": str(free_port()),
            "TIDEWATCH_SPARK_DRIVER_MEMORY": "1g",
            "TIDEWATCH_SPARK_EXTRA_CONF": json.dumps(
                {"spark.executor.memory": "1g", "spark.scheduler.minRegisteredResourcesRatio": "1.0"}
            ),
        }
        job_log = tmp_path / "job.log"
        job = subprocess.Popen(
            [sys.executable, "-m", "tests.engine.shards.cluster_job", kafka_bootstrap, pg_url,
             str(tmp_path / "engine"), "2,1,4", "3"],
            cwd=PROJECT_ROOT, env=job_env, stdout=open(job_log, "ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        launched: set[int] = set()
        deadline = time.monotonic() + 1500
        while job.poll() is None and time.monotonic() < deadline:
            launched |= executor_pids(workers)
            time.sleep(0.2)
        if job.poll() is None:
            job.kill()
            job.wait()
        out = job_log.read_text()
        assert job.returncode == 0, out[-6000:]
        result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])

    # three executors, each launched by a worker, were killed mid-stream; the workers launched
    # new ones (the executors alive at the end are none of the killed)
    worker_pids = {w.pid for w in workers}
    killed = {k["pid"] for k in result["killed"]}
    assert len(killed) == 3, result
    assert all(set(k["ancestors"]) & worker_pids for k in result["killed"]), (result["killed"], worker_pids)
    assert result["executors_now"] and not set(result["executors_now"]) & killed, result
    # the shards ran in Python workers of executor JVMs the workers launched, not in the driver
    shard_pids = {int(p): a for p, a in result["shard_pids"].items()}
    assert shard_pids and result["driver_pid"] not in shard_pids
    assert all(set(a) & worker_pids for a in shard_pids.values() if a), (shard_pids, worker_pids)
    assert launched, "no executor seen under the workers"
    print(f"sharded scenarios on the cluster: {result['runs']}; executors killed {sorted(killed)}")
    _every_run_rebuilt_from_snapshots(result, [2, 1, 4])


def _every_run_rebuilt_from_snapshots(result: dict[str, Any], counts: list[int]) -> None:
    """Each shard count ran, and its restart rebuilt every shard from a snapshot file."""
    assert [r["shards"] for r in result["runs"]] == counts, result
    for r in result["runs"]:
        assert sorted(r["rebuilds"]) == [str(s) for s in range(r["shards"])], r
        assert sorted(r["rebuilt_from"]) == sorted(r["rebuilds"]), r
        assert all(b >= 0 for b in r["rebuilt_from"].values()), r


@pytest.mark.timeout(1800)
def test_sharded_engine_on_local_cluster(kafka_bootstrap: str, pg_url: str, tmp_path: Path) -> None:
    """N = 1, 2, 4 shards on ``local-cluster[2,1,1024]`` (two executor JVMs of one core, Spark's
    own multi-process mode): the scenario's checks hold, each shard a task of its own partition."""
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "TIDEWATCH_SPARK_MASTER": "local-cluster[2,1,1024]",
        "TIDEWATCH_SPARK_DRIVER_MEMORY": "1g",
    }
    job_log = tmp_path / "job.log"
    job = subprocess.run(
        [sys.executable, "-m", "tests.engine.shards.cluster_job", kafka_bootstrap, pg_url,
         str(tmp_path / "engine"), "1,2,4", "0"],
        cwd=PROJECT_ROOT, env=env, stdout=open(job_log, "ab"), stderr=subprocess.STDOUT, timeout=1500,
    )  # fmt: skip
    out = job_log.read_text()
    assert job.returncode == 0, out[-6000:]
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    _every_run_rebuilt_from_snapshots(result, [1, 2, 4])
    assert result["shard_pids"] and result["driver_pid"] not in {int(p) for p in result["shard_pids"]}
