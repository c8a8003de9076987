"""The engine's SparkSession on a real standalone cluster: a master and two workers of one core
each, started from pyspark's own ``spark-class`` (SPARK_HOME = pyspark's package directory),
stopped by their process ids at the end.

The driver (``tests/engine/cluster_job.py``, its own process: one SparkContext per process) is
built by :func:`engine.spark_session.build_spark` with ``spark_master = spark://127.0.0.1:P`` and
the driver's network settings (host, bind address, driver and block manager ports).  Executors
are processes the workers launched, not the driver: the rows of a ``SELECT`` and of the
engine's read of Kafka (Spark's Kafka source, ``select(RECORD_COLUMNS).toArrow()``, no
``mapInArrow``) were computed in executor JVMs whose parents are the workers; the connector jars
reached them (``spark.jars``, served by the driver), and their Python workers run the project's
interpreter (``spark.pyspark.python``).  Then the same driver runs the engine's integration
scenario (``test_engine_integration.run_scenario``) on the cluster, in the engine's default mode
(``engine_preaggregate = executors``): alert log = backtest, and the pane rows were made by
Python workers whose ancestors are the executor JVMs the workers launched (issue #19, "Proof").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Producer

from tests.services import free_ports
from tidewatch.settings import PROJECT_ROOT

# in the default run again since Nov 27 (its Nov 25 failure -- alerts of the first events missing --
# was the partition-visibility race fixed by a698486: docs/measurements/test-runs.md); the marker
# selects it alone (`make test-cluster`)
pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.slow]

N_RECORDS = 200


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@contextmanager
def spark_daemon(args: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``$SPARK_HOME/bin/spark-class ARGS`` (it ``exec``s the JVM, so its PID is the daemon's),
    stopped by its PID (SIGTERM, then SIGKILL), and any executor it launched that outlived it."""
    proc = subprocess.Popen(
        [str(spark_home() / "bin" / "spark-class"), *args],
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        _, alive = psutil.wait_procs(children, timeout=15)
        for child in alive:  # an executor the worker did not take down with it
            child.kill()


def master_status(webui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def executor_pids(workers: list[subprocess.Popen[bytes]]) -> set[int]:
    """Processes the workers launched as executors (``CoarseGrainedExecutorBackend``)."""
    out = set()
    for w in workers:
        try:
            children = psutil.Process(w.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for child in children:  # one child gone meanwhile (a Python worker) skips only itself
            try:
                if any("CoarseGrainedExecutorBackend" in part for part in child.cmdline()):
                    out.add(child.pid)
            except psutil.Error:
                continue
    return out


@contextmanager
def two_worker_cluster(
    tmp_path: Path, worker_memory: str
) -> Iterator[tuple[subprocess.Popen[bytes], list[subprocess.Popen[bytes]], str, dict[str, str]]]:
    """A standalone master and two one-core workers on 127.0.0.1 (pyspark's ``spark-class``),
    logs in ``tmp_path``, up when the master reports both workers alive; stopped by PID at the
    end.  Yields the master, the workers, the master's URL and the daemons' environment."""
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp_path),
    }
    port, webui, *worker_ui = free_ports(4)  # distinct: a worker's UI never on the master's port
    master_url = f"spark://127.0.0.1:{port}"
    with ExitStack() as stack:
        master = stack.enter_context(
            spark_daemon(
                ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", str(webui)],
                tmp_path / "master.log", env,
            )
        )  # fmt: skip
        workers = [
            stack.enter_context(
                spark_daemon(
                    ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                     "--cores", "1", "--memory", worker_memory, "--webui-port", str(worker_ui[i]),
                     "--work-dir", str(tmp_path / f"work-{i}")],
                    tmp_path / f"worker-{i}.log", env,
                )
            )
            for i in range(2)
        ]  # fmt: skip
        deadline = time.monotonic() + 120
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert master.poll() is None, (tmp_path / "master.log").read_text()[-3000:]
            try:
                status = master_status(webui)
                if status.get("status") == "ALIVE" and status.get("aliveworkers") == 2:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"the cluster did not come up with two workers: {status}")
        yield master, workers, master_url, env


def produce_records(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    from tidewatch.kafka.topics import TopicSpec, create_topics

    create_topics(AdminClient({"bootstrap.servers": bootstrap}), [TopicSpec(topic, 2)])
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(N_RECORDS):
        p.produce(topic, key=f"k{i % 7}".encode(), value=f"v{i}".encode())
    p.flush(30)


def test_executors_are_processes_of_the_workers_and_the_engine_runs_there(
    kafka_bootstrap: str, pg_url: str, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    produce_records(kafka_bootstrap, topic)
    with two_worker_cluster(tmp_path, worker_memory="1g") as (master, workers, master_url, _):
        t_cluster = time.monotonic()

        driver_port, bm_port = free_ports(2)
        job_env = {
            **os.environ,
            "TIDEWATCH_SPARK_MASTER": master_url,
            "TIDEWATCH_SPARK_DRIVER_HOST": "127.0.0.1",
            "TIDEWATCH_SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1",
            "TIDEWATCH_SPARK_DRIVER_PORT": str(driver_port),
            "TIDEWATCH_SPARK_BLOCK_MANAGER_PORT": str(bm_port),
            "TIDEWATCH_SPARK_DRIVER_MEMORY": "1g",
            "TIDEWATCH_SPARK_EXTRA_CONF": json.dumps(
                {
                    "spark.executor.memory": "512m",
                    # schedule only once both executors are registered
                    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                }
            ),
        }
        job_log = tmp_path / "job.log"
        job = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.engine.cluster_job",
                topic,
                kafka_bootstrap,
                pg_url,
                str(tmp_path / "engine"),
            ],
            cwd=PROJECT_ROOT,
            env=job_env,
            stdout=open(job_log, "ab"),
            stderr=subprocess.STDOUT,
        )
        executors: set[int] = set()
        deadline = time.monotonic() + 600
        while job.poll() is None and time.monotonic() < deadline:
            executors |= executor_pids(workers)
            time.sleep(0.2)
        if job.poll() is None:
            job.kill()
            job.wait()
        out = job_log.read_text()
        assert job.returncode == 0, out[-5000:]
        t_job = time.monotonic()
        result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])

        # the driver honoured the network settings
        assert result["master"] == master_url
        assert result["conf"]["spark.driver.host"] == "127.0.0.1"
        assert result["conf"]["spark.driver.port"] == str(driver_port)
        # driver + 2 executors; the driver's, started first, on the port it was given
        assert len(result["block_managers"]) == 3, result["block_managers"]
        assert f"127.0.0.1:{bm_port}" in result["block_managers"], (bm_port, result["block_managers"])
        # rows were computed by two executor JVMs the workers launched, not by the driver
        driver = result["driver_jvm_pid"]
        procs = {int(pid): p for pid, p in result["processes"].items()}
        launched = {pid for pid, p in procs.items() if p["ppid"] in {w.pid for w in workers}}
        assert launched == set(procs), procs
        assert {p["main"] for p in procs.values()} == {
            "org.apache.spark.executor.CoarseGrainedExecutorBackend"
        }
        assert result["select_rows"] == 8
        assert len(result["select_pids"]) == 2, result["select_pids"]
        assert driver not in procs and job.pid not in procs
        executors |= set(procs)
        # the engine's Kafka read ran on the executors with the connector jars the driver served
        assert result["kafka_rows"] == N_RECORDS
        assert result["kafka_columns"][:6] == ["topic", "partition", "offset", "timestamp", "key", "value"]
        assert result["kafka_pids"] and set(result["kafka_pids"]) <= launched
        # Python on the executors is the project's interpreter (spark.pyspark.python)
        assert result["python"] == [sys.executable]
        assert job.pid not in result["python_pids"]
        # and the engine's scenario passed on the cluster (it raises otherwise), its records
        # decoded and pre-aggregated by Python workers of the executor JVMs the workers launched
        assert result["engine_scenario_s"] > 0
        panes = {int(pid): ancestors for pid, ancestors in result["pane_pids"].items()}
        assert panes and job.pid not in panes, panes
        assert all(set(ancestors) & launched for ancestors in panes.values()), (panes, launched)

    # stopped by PID: no daemon and no executor left
    gone = [master.pid, *(w.pid for w in workers), *executors]
    _, alive = psutil.wait_procs([p for p in map(_process, gone) if p is not None], timeout=15)
    assert not alive, alive
    print(
        f"cluster up in {t_cluster - t0:.1f} s, driver job {t_job - t_cluster:.1f} s (of which the engine's "
        f"scenario {result['engine_scenario_s']} s); executors {sorted(executors)}, driver JVM {driver}"
    )


def _process(pid: int) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
    return None if p.status() == psutil.STATUS_ZOMBIE else p
