"""``tidewatch up --workers 2``: the engine on a Spark standalone cluster that the stack runs.

Runs the ``tidewatch`` command (subprocesses, as a user would) on a temporary run dir and free
ports, like ``test_supervised_stack.py``, without the dashboard: PostgreSQL, Kafka, supervisord
with a Spark master and two one-core workers (``spark-class``, from the pyspark wheel), the relay,
the engine and the demo feed (slowed down: 200 trades/s, two minutes of history).  Checks the
master's own view (its web UI's ``/json``: two ALIVE workers, the engine's application with both
cores), that the executors are processes of the workers, that every daemon and executor listens
on 127.0.0.1 only, that the demo's alerts reach PostgreSQL through the cluster, that ``status``
shows the daemons, that supervisord brings back a killed worker, and that ``down`` leaves no
process alive.  Needs what ``scripts/setup.sh`` installs (java, PostgreSQL, the Kafka and Spark
connector jars).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import sqlalchemy as sa

from tests.services import free_port
from tests.tidewatch.stack.test_supervised_stack import _alive, _status_row, _tidewatch, _tree_pids
from tidewatch.settings import Settings, get_settings
from tidewatch.stack import postgres_server as postgres
from tidewatch.stack import processes as process
from tidewatch.stack import spark_cluster, supervision

pytestmark = pytest.mark.integration

ENGINE_APP = "tidewatch-engine"


def _wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, ValueError):
            last = None
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def _executors(worker_pids: set[int]) -> dict[int, int]:
    """Executor JVMs (``CoarseGrainedExecutorBackend``) whose parent is a worker: pid -> worker pid."""
    out = {}
    for pid in worker_pids:
        try:
            children = psutil.Process(pid).children()
        except psutil.Error:
            continue
        for child in children:
            try:  # a worker keeps a zombie `bash` child of its start-up: no command line
                if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in child.cmdline():
                    out[child.pid] = pid
            except psutil.Error:
                pass
    return out


def _listening(pid: int) -> set[tuple[str, int]]:
    return {
        (c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)
        for c in psutil.Process(pid).net_connections()
        if c.status == psutil.CONN_LISTEN
    }


def test_up_with_workers_runs_the_engine_on_a_standalone_cluster(run_root: Path):
    base = get_settings()
    kp = free_port()
    env = {
        **os.environ,
        "TIDEWATCH_RUN_DIR": str(run_root / "run"),
        "TIDEWATCH_KAFKA_PORT": str(kp),
        "TIDEWATCH_KAFKA_BOOTSTRAP": f"127.0.0.1:{kp}",
        "TIDEWATCH_KAFKA_CONTROLLER_PORT": str(free_port()),
        "TIDEWATCH_PG_PORT": str(free_port()),
        "TIDEWATCH_SPARK_MASTER_PORT": str(free_port()),  # configured; the web UI's: a free one
        "TIDEWATCH_DEMO_TRADE_RATE": "200",
        "TIDEWATCH_DEMO_HISTORY_MINUTES": "2",
        "COLUMNS": "250",  # rich's tables unfolded
    }
    s = Settings(
        run_dir=run_root / "run",
        cache_dir=base.cache_dir,
        kafka_port=kp,
        kafka_bootstrap=f"127.0.0.1:{kp}",
        kafka_controller_port=int(env["TIDEWATCH_KAFKA_CONTROLLER_PORT"]),
        pg_port=int(env["TIDEWATCH_PG_PORT"]),
    )
    if postgres.find_bin_dir(s) is None:
        pytest.fail("PostgreSQL binaries missing: run scripts/setup.sh")
    seen: set[int] = set()
    try:
        t0 = time.monotonic()
        res = _tidewatch(env, "up", "--workers", "2", "--skip", "dashboard", timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
        t_up = time.monotonic() - t0
        cluster = spark_cluster.load(s)
        assert cluster is not None and cluster.workers == 2
        assert cluster.master_port == int(env["TIDEWATCH_SPARK_MASTER_PORT"])
        assert f"Spark cluster {cluster.master_url}: 2 workers ALIVE" in res.stderr
        assert f"Spark engine on {cluster.master_url}" in res.stderr
        infos = supervision.program_infos(s)
        assert {n: i["statename"] for n, i in infos.items()} == {
            "relay": "RUNNING",
            "spark-master": "RUNNING",
            "spark-worker-1": "RUNNING",
            "spark-worker-2": "RUNNING",
            "engine": "RUNNING",
            "dashboard": "STOPPED",
            "feed": "RUNNING",
        }

        # the master's view: two ALIVE one-core workers, and the engine's application holding both
        status = spark_cluster.master_status(cluster)
        assert status["status"] == "ALIVE" and status["url"] == cluster.master_url
        alive = spark_cluster.alive_workers(status)
        assert len(alive) == 2 and all(w["host"] == "127.0.0.1" and w["cores"] == 1 for w in alive)

        def engine_app() -> dict[str, Any] | None:
            apps = spark_cluster.master_status(cluster)["activeapps"]
            return next((a for a in apps if a["name"] == ENGINE_APP and a["cores"] == 2), None)

        app = _wait("the engine's application with both cores at the master", engine_app, 180)
        assert app["state"] == "RUNNING", app

        # its executors are the workers' children, one per worker
        workers = {infos[f"spark-worker-{i}"]["pid"] for i in (1, 2)}
        executors = _wait(
            "an executor on each worker", lambda: (e := _executors(workers)) and len(e) == 2 and e, 120
        )
        assert set(executors.values()) == workers
        # every daemon and executor listens on 127.0.0.1 only; the master on its configured port,
        # and no REST submission server
        daemons = [infos["spark-master"]["pid"], *workers, *executors]
        addresses = {a for pid in daemons for a in _listening(pid)}
        assert {ip for ip, _ in addresses} == {"127.0.0.1"}, addresses
        assert ("127.0.0.1", cluster.master_port) in _listening(infos["spark-master"]["pid"])
        assert 6066 not in {port for _, port in addresses}

        # the demo feed's episodes make the seeded rules fire: alerts in PostgreSQL
        engine = sa.create_engine(s.sqlalchemy_url)

        def alerts() -> int:
            with engine.connect() as conn:
                return int(conn.execute(sa.text("SELECT count(*) FROM alerts")).scalar_one())

        try:
            n = _wait("an alert in PostgreSQL", alerts, 300)
        finally:
            engine.dispose()
        t_alert = time.monotonic() - t0
        assert n > 0

        # status lists the master and the workers, healthy by the master's view, and the cluster
        res = _tidewatch(env, "status")
        assert res.returncode == 0, res.stdout + res.stderr
        for name in ("spark-master", "spark-worker-1", "spark-worker-2"):
            row = _status_row(res.stdout, name)
            assert row[1:3] == ["RUNNING", str(infos[name]["pid"])] and "ok" in row, row
        assert f"Spark cluster {cluster.master_url} (ALIVE): 2 of 2 workers ALIVE" in res.stdout
        assert f"applications: {ENGINE_APP} (RUNNING)" in res.stdout
        seen |= _tree_pids(s)

        # a worker SIGKILLed: supervisord starts it again and it registers with the master again
        old = infos["spark-worker-2"]["pid"]
        os.kill(old, signal.SIGKILL)
        new = _wait(
            "worker 2 RUNNING again",
            lambda: (
                (i := supervision.program_infos(s)["spark-worker-2"])["statename"] == "RUNNING"
                and i["pid"] != old
                and i["pid"]
            ),
            60,
        )
        _wait(
            "two ALIVE workers again",
            lambda: (
                spark_cluster.worker_state(spark_cluster.master_status(cluster), cluster, "spark-worker-2")
                == "ALIVE"
                and len(spark_cluster.alive_workers(spark_cluster.master_status(cluster))) == 2
            ),
            120,
        )
        assert not _alive(old) and _alive(new)
        print(
            f"up in {t_up:.0f} s, first alert {t_alert:.0f} s after the start; worker 2: pid {old} -> {new}"
        )
        seen |= _tree_pids(s)
    finally:
        seen |= _tree_pids(s)
        res = _tidewatch(env, "down")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (
        "stopped: feed, engine, spark-worker-2, spark-worker-1, spark-master, relay, supervisord, kafka, postgres"
        in res.stdout
    )
    assert len(seen) > 8
    assert [pid for pid in seen if _alive(pid)] == []
    assert process.all_records(s.run_dir) == [] and not supervision.socket_path(s).exists()
    assert spark_cluster.load(s) is None and not spark_cluster.conf_path(s).exists()
    assert not process.port_open("127.0.0.1", cluster.master_port)
    assert not process.port_open("127.0.0.1", cluster.webui_port)
