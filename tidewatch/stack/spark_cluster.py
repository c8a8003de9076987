"""The Spark standalone cluster of ``tidewatch up --workers N``: one master and N workers on 127.0.0.1.

Both are the pyspark wheel's own daemons, run the documented way
(``$SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``,
``SPARK_HOME`` = the installed pyspark package: the same Spark as the engine's driver); they
are supervisord programs of the stack (:mod:`tidewatch.stack.supervision`; ``spark-class``
``exec``\\ s the JVM, so supervisord's PID is the daemon's), restarted when they die and stopped by
``tidewatch down``.  What ``up`` decided -- how many workers, the ports -- is
``<run_dir>/spark-cluster.json`` (:class:`Cluster`), so a restart of a daemon or of the engine by
supervisord gets the same ports and master URL as the first start.

* **Network**: every daemon binds to 127.0.0.1 (``--host``, and ``SPARK_LOCAL_IP``, which also
  binds the web UIs); the master's RPC and web UI ports are ``spark_master_port`` /
  ``spark_master_webui_port`` or free ports, each worker's web UI a free port, its RPC port
  Spark's (a free one).
* **Access**: ``spark.authenticate`` with a random secret (``<run_dir>/spark/spark.conf``, mode
  0600, read by the daemons with ``--properties-file`` and by the engine from its environment),
  so another local user cannot run an application on the cluster -- Spark's shared-secret mode
  of standalone clusters.
* **Resources**: each worker offers ``spark_worker_cores`` cores and ``spark_worker_memory``; the
  engine (the driver, client mode) asks for executors of that memory, so each worker runs one.
* **Files**: worker ``i``'s work dir (executor logs, fetched jars) is
  ``<run_dir>/spark/worker-i/work``, its scratch dir (``SPARK_LOCAL_DIRS``: shuffle and blocks)
  ``<run_dir>/spark/worker-i/tmp``; the daemons' logs are supervisord's program logs,
  ``<run_dir>/logs/spark-*.log``.
* **Executors** are the workers' child processes: they run the project's interpreter for Python
  (``spark.pyspark.python`` / ``PYSPARK_PYTHON``, set by :mod:`engine.spark_session`) and get the
  Kafka connector jars from the driver (``spark.jars``); docs/engine.md, "Running on a cluster".

Readiness is the master's own view: its web UI's ``/json`` (``status``, ``workers`` with their
``state``, ``activeapps``), which :func:`wait_for_workers` and ``tidewatch status`` read.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tidewatch.errors import TidewatchError
from tidewatch.settings import Settings

MASTER = "spark-master"
WORKER_PREFIX = "spark-worker-"


class ClusterError(TidewatchError, RuntimeError):
    """The cluster did not come up as asked (the message says what the master reported)."""


@dataclass(frozen=True)
class Cluster:
    """What ``tidewatch up --workers N`` chose: N and the ports (``<run_dir>/spark-cluster.json``)."""

    workers: int
    master_port: int
    webui_port: int
    worker_webui_ports: tuple[int, ...]

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}/json/"

    def names(self) -> list[str]:
        """The supervisord programs: the master, then the workers (``spark-worker-1`` …)."""
        return [MASTER, *(worker_name(i) for i in range(1, self.workers + 1))]


def worker_name(i: int) -> str:
    return f"{WORKER_PREFIX}{i}"


def worker_index(name: str) -> int | None:
    """``i`` of ``spark-worker-i``; None for any other name."""
    rest = name.removeprefix(WORKER_PREFIX)
    return int(rest) if rest != name and rest.isdigit() else None


# --- the cluster's files -------------------------------------------------------------------


def state_path(s: Settings) -> Path:
    return s.run_dir / "spark-cluster.json"


def spark_dir(s: Settings) -> Path:
    return s.run_dir / "spark"


def conf_path(s: Settings) -> Path:
    """The daemons' Spark properties (the shared secret among them): mode 0600."""
    return spark_dir(s) / "spark.conf"


def load(s: Settings) -> Cluster | None:
    """The cluster ``up`` last started in this run dir, or None (none, or ``down`` since)."""
    try:
        d = json.loads(state_path(s).read_text())
        return Cluster(
            workers=int(d["workers"]),
            master_port=int(d["master_port"]),
            webui_port=int(d["webui_port"]),
            worker_webui_ports=tuple(int(p) for p in d["worker_webui_ports"]),
        )
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plan(s: Settings, workers: int) -> Cluster:
    """A cluster of ``workers`` workers: the configured master ports, else free ones; written
    to the run dir with a new secret (:func:`conf_path`)."""
    if workers < 1:
        raise ValueError("a cluster needs at least one worker")
    cluster = Cluster(
        workers=workers,
        master_port=s.spark_master_port or free_port(),
        webui_port=s.spark_master_webui_port or free_port(),
        worker_webui_ports=tuple(free_port() for _ in range(workers)),
    )
    spark_dir(s).mkdir(parents=True, exist_ok=True)
    conf = conf_path(s)
    conf.unlink(missing_ok=True)
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(
            "# written by `tidewatch up --workers N` (tidewatch/stack/spark_cluster.py)\n"
            "spark.authenticate true\n"
            f"spark.authenticate.secret {secrets.token_hex(24)}\n"
            # work dirs of applications that ended: removed after spark.worker.cleanup.appDataTtl
            "spark.worker.cleanup.enabled true\n"
            # no REST submission server (port 6066): applications come in through the RPC port only
            "spark.master.rest.enabled false\n"
        )
    tmp = state_path(s).with_suffix(".tmp")
    tmp.write_text(json.dumps({**asdict(cluster), "worker_webui_ports": list(cluster.worker_webui_ports)}))
    tmp.replace(state_path(s))
    return cluster


def forget(s: Settings) -> None:
    """Remove the cluster's state and secret (after ``down``): the engine runs local again."""
    state_path(s).unlink(missing_ok=True)
    conf_path(s).unlink(missing_ok=True)


def _secret(s: Settings) -> str | None:
    try:
        for line in conf_path(s).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "spark.authenticate.secret":
                return value.strip()
    except OSError:
        pass
    return None


# --- the daemons ---------------------------------------------------------------------------


def spark_home() -> Path:
    """The installed pyspark package: a Spark distribution with ``bin/spark-class`` and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def argv(name: str, s: Settings, cluster: Cluster) -> list[str]:
    """The ``spark-class`` command line of program ``name`` (the master or a worker)."""
    spark_class = str(spark_home() / "bin" / "spark-class")
    props = ["--properties-file", str(conf_path(s))]
    if name == MASTER:
        return [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(cluster.master_port), "--webui-port", str(cluster.webui_port), *props,
        ]  # fmt: skip
    i = worker_index(name)
    if i is None or not 1 <= i <= cluster.workers:
        raise KeyError(name)
    return [
        spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host", "127.0.0.1",
        "--cores", str(s.spark_worker_cores), "--memory", s.spark_worker_memory,
        "--webui-port", str(cluster.worker_webui_ports[i - 1]),
        "--work-dir", str(spark_dir(s) / f"worker-{i}" / "work"), *props,
    ]  # fmt: skip


def env(name: str, s: Settings) -> dict[str, str]:
    """The environment additions of program ``name``: ``SPARK_HOME``, the loopback address, the
    scratch dir, the executors' Python."""
    home = spark_home()
    out = {
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(s.run_dir / "logs"),
        "PYSPARK_PYTHON": s.spark_python or sys.executable,
    }
    i = worker_index(name)
    if i is not None:
        tmp = spark_dir(s) / f"worker-{i}" / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        out["SPARK_LOCAL_DIRS"] = str(tmp)
    return out


def engine_env(s: Settings, cluster: Cluster | None) -> dict[str, str]:
    """The engine's settings on ``cluster`` (nothing without one): ``spark_master`` = the master's
    URL, the driver on 127.0.0.1 unless its host / bind address are set, executors of
    ``spark_worker_memory`` and the cluster's secret; the user's ``spark_extra_conf`` set last."""
    if cluster is None:
        return {}
    extra = {"spark.executor.memory": s.spark_worker_memory}
    secret = _secret(s)
    if secret:
        extra |= {"spark.authenticate": "true", "spark.authenticate.secret": secret}
    out = {
        "SPARK_LOCAL_IP": "127.0.0.1",  # the driver JVM's own address, as the daemons'
        "TIDEWATCH_SPARK_MASTER": cluster.master_url,
        "TIDEWATCH_SPARK_EXTRA_CONF": json.dumps(extra | dict(s.spark_extra_conf)),
    }
    if s.spark_driver_host is None:
        out["TIDEWATCH_SPARK_DRIVER_HOST"] = "127.0.0.1"
        if s.spark_driver_bind_address is None:
            out["TIDEWATCH_SPARK_DRIVER_BIND_ADDRESS"] = "127.0.0.1"
    return out


# --- the master's view ---------------------------------------------------------------------


def master_status(cluster: Cluster, timeout: float = 3.0) -> dict[str, Any]:
    """The master's ``/json``: ``status`` (ALIVE), ``workers`` (``state``, ``webuiaddress``, ``cores``,
    ``memory``), ``aliveworkers``, ``activeapps`` (``name``, ``state``, ``cores``).  OSError when
    it does not answer."""
    with urllib.request.urlopen(cluster.status_url, timeout=timeout) as resp:  # noqa: S310 - loopback
        return dict(json.loads(resp.read()))


def alive_workers(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]


def worker_state(status: dict[str, Any], cluster: Cluster, name: str) -> str | None:
    """The master's state of worker ``name`` (ALIVE, DEAD, ...; its newest registration), found by
    its web UI port; None when it never registered."""
    i = worker_index(name)
    if i is None or not 1 <= i <= cluster.workers:
        return None
    suffix = f":{cluster.worker_webui_ports[i - 1]}"
    states = [
        w.get("state") for w in status.get("workers", []) if str(w.get("webuiaddress", "")).endswith(suffix)
    ]
    return "ALIVE" if "ALIVE" in states else (str(states[-1]) if states else None)


def wait_for_workers(cluster: Cluster, *, timeout: float = 120.0) -> dict[str, Any]:
    """Wait until the master is ALIVE with ``cluster.workers`` ALIVE workers; its ``/json``.
    :class:`ClusterError` with what it last reported after ``timeout``."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            status = master_status(cluster)
        except (OSError, ValueError):
            status = {}
        if status.get("status") == "ALIVE" and len(alive_workers(status)) >= cluster.workers:
            return status
        time.sleep(0.5)
    raise ClusterError(
        f"the Spark master did not report {cluster.workers} ALIVE workers within {timeout:.0f}s "
        f"(status {status.get('status', 'not answering')}, ALIVE workers {len(alive_workers(status))})"
    )


def health(name: str, s: Settings) -> str:
    """The health cell of ``tidewatch status`` for program ``name``, from the master's view: "ok"
    when it is ALIVE (the master) or has the worker ALIVE."""
    c = load(s)
    if c is None:
        return "-"
    try:
        status = master_status(c)
    except (OSError, ValueError):
        return "not answering" if name == MASTER else "master not answering"
    if name == MASTER:
        return "ok" if status.get("status") == "ALIVE" else str(status.get("status"))
    state = worker_state(status, c, name)
    return "ok" if state == "ALIVE" else f"at the master: {state or 'not registered'}"


def summary(s: Settings) -> str | None:
    """One line on the run dir's cluster from its master (URL, ALIVE workers, applications);
    None without a cluster."""
    c = load(s)
    if c is None:
        return None
    try:
        status = master_status(c)
    except (OSError, ValueError):
        return f"Spark cluster {c.master_url}: the master does not answer"
    apps = ", ".join(f"{a.get('name')} ({a.get('state')})" for a in status.get("activeapps", [])) or "none"
    return (
        f"Spark cluster {c.master_url} ({status.get('status')}): {len(alive_workers(status))} "
        f"of {c.workers} workers ALIVE; applications: {apps}; web UI http://127.0.0.1:{c.webui_port}"
    )
