"""The cluster of ``tidewatch up --workers N`` as data (tidewatch.stack.spark_cluster): no JVM
starts here -- the plan written to the run dir, the daemons' command lines and environment, the
engine's settings on the cluster, the master's ``/json`` read, and the supervisord programs."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tidewatch.settings import Settings
from tidewatch.stack import embedded as stack
from tidewatch.stack import spark_cluster


@pytest.fixture()
def s(tmp_path: Path) -> Settings:
    return Settings(run_dir=tmp_path / "run", spark_master_port=17077, spark_worker_memory="768m")


def test_plan_writes_the_ports_and_a_private_secret(s: Settings) -> None:
    c = spark_cluster.plan(s, 2)
    assert c.master_port == 17077 and c.master_url == "spark://127.0.0.1:17077"
    assert c.webui_port > 0 and len(set(c.worker_webui_ports)) == 2
    assert spark_cluster.load(s) == c
    conf = spark_cluster.conf_path(s)
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    text = conf.read_text()
    assert "spark.authenticate true" in text and "spark.master.rest.enabled false" in text
    secret = spark_cluster._secret(s)
    assert secret and len(secret) == 48
    assert spark_cluster.plan(s, 1).workers == 1 and spark_cluster._secret(s) != secret  # a new one
    spark_cluster.forget(s)
    assert spark_cluster.load(s) is None and not conf.exists()
    with pytest.raises(ValueError):
        spark_cluster.plan(s, 0)


def test_daemon_command_lines_and_environment(s: Settings) -> None:
    c = spark_cluster.plan(s, 2)
    master = spark_cluster.argv("spark-master", s, c)
    assert master[0].endswith("pyspark/bin/spark-class") and Path(master[0]).is_file()
    assert master[1:] == [
        "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "17077",
        "--webui-port", str(c.webui_port), "--properties-file", str(spark_cluster.conf_path(s)),
    ]  # fmt: skip
    worker = spark_cluster.argv("spark-worker-2", s, c)
    assert worker[1:3] == ["org.apache.spark.deploy.worker.Worker", c.master_url]
    assert worker[worker.index("--cores") + 1] == "1" and worker[worker.index("--memory") + 1] == "768m"
    assert worker[worker.index("--webui-port") + 1] == str(c.worker_webui_ports[1])
    assert worker[worker.index("--work-dir") + 1] == str(s.run_dir / "spark" / "worker-2" / "work")
    with pytest.raises(KeyError):
        spark_cluster.argv("spark-worker-3", s, c)
    env = spark_cluster.env("spark-worker-1", s)
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1" and Path(env["SPARK_HOME"], "jars").is_dir()
    assert env["SPARK_LOCAL_DIRS"] == str(s.run_dir / "spark" / "worker-1" / "tmp")
    assert "SPARK_LOCAL_DIRS" not in spark_cluster.env("spark-master", s)


def test_engine_env_points_the_engine_at_the_master(s: Settings) -> None:
    assert spark_cluster.engine_env(s, None) == {}
    c = spark_cluster.plan(s, 2)
    env = spark_cluster.engine_env(s, c)
    assert env["TIDEWATCH_SPARK_MASTER"] == "spark://127.0.0.1:17077"
    assert env["TIDEWATCH_SPARK_DRIVER_HOST"] == env["TIDEWATCH_SPARK_DRIVER_BIND_ADDRESS"] == "127.0.0.1"
    extra = json.loads(env["TIDEWATCH_SPARK_EXTRA_CONF"])
    assert extra["spark.executor.memory"] == "768m"
    assert extra["spark.authenticate.secret"] == spark_cluster._secret(s)
    # what the user set wins: their extra conf, their driver host
    mine = s.model_copy(
        update={"spark_extra_conf": {"spark.executor.memory": "512m"}, "spark_driver_host": "10.0.0.5"}
    )
    env = spark_cluster.engine_env(mine, c)
    assert json.loads(env["TIDEWATCH_SPARK_EXTRA_CONF"])["spark.executor.memory"] == "512m"
    assert "TIDEWATCH_SPARK_DRIVER_HOST" not in env and "TIDEWATCH_SPARK_DRIVER_BIND_ADDRESS" not in env
    # and the engine's command gets them; the other apps do not
    _, engine = stack.app_command("engine", s)
    assert engine["TIDEWATCH_SPARK_MASTER"] == c.master_url
    _, relay = stack.app_command("relay", s)
    assert relay.get("TIDEWATCH_SPARK_MASTER") != c.master_url


def test_the_daemons_are_programs_between_relay_and_engine(s: Settings) -> None:
    assert [a.name for a in stack.all_apps(s)] == [a.name for a in stack.APPS]  # no cluster: as before
    spark_cluster.plan(s, 2)
    programs = stack.programs(s, stack.all_apps(s))
    assert [(p.name, p.priority) for p in programs] == [
        ("relay", 10), ("spark-master", 11), ("spark-worker-1", 12), ("spark-worker-2", 12),
        ("engine", 20), ("dashboard", 30), ("feed", 40),
    ]  # fmt: skip
    assert programs[1].argv[-2:] == ["tidewatch.stack.app_exec", "spark-master"]
    argv, env = stack.app_command("spark-worker-1", s)
    assert argv[1] == "org.apache.spark.deploy.worker.Worker"
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_the_masters_view_of_a_worker(s: Settings) -> None:
    c = spark_cluster.plan(s, 2)
    w1, w2 = (f"http://127.0.0.1:{p}" for p in c.worker_webui_ports)
    status = {
        "status": "ALIVE",
        "workers": [
            {"webuiaddress": w2, "state": "DEAD"},
            {"webuiaddress": w1, "state": "ALIVE"},
            {"webuiaddress": w2, "state": "ALIVE"},  # registered again after a restart
        ],
    }
    assert len(spark_cluster.alive_workers(status)) == 2
    assert spark_cluster.worker_state(status, c, "spark-worker-1") == "ALIVE"
    assert spark_cluster.worker_state(status, c, "spark-worker-2") == "ALIVE"
    status["workers"] = status["workers"][:1]
    assert spark_cluster.worker_state(status, c, "spark-worker-2") == "DEAD"
    assert spark_cluster.worker_state(status, c, "spark-worker-1") is None
    assert spark_cluster.worker_state(status, c, "relay") is None
    # nothing answers on the (unused) web UI port
    assert spark_cluster.health("spark-master", s) == "not answering"
    assert "does not answer" in (spark_cluster.summary(s) or "")
    with pytest.raises(spark_cluster.ClusterError):
        spark_cluster.wait_for_workers(c, timeout=1.0)
