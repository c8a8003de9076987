"""engine.spark_session: the configuration every SparkSession of Tidewatch gets (no JVM started)."""

from __future__ import annotations

import sys
from pathlib import Path

from engine.spark_session import (
    ARROW_NO_BYTE_LIMIT,
    CHANGELOG_CHECKPOINTING,
    ROCKSDB_PROVIDER,
    is_local_master,
    network_conf,
    spark_conf,
    spark_packages,
)
from tidewatch.settings import get_settings


def _settings(cache: Path):
    return get_settings().model_copy(update={"cache_dir": cache, "spark_master": "local[2]"})


def test_uses_the_cached_connector_jars_when_complete(tmp_path: Path) -> None:
    jars = tmp_path / "spark-jars"
    jars.mkdir()
    for name in ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-avro_2.13-4.0.0.jar"):
        (jars / name).write_bytes(b"")
    (jars / ".complete").write_text("coords\n")
    conf = spark_conf(_settings(tmp_path), "t")
    assert conf["spark.jars"].split(",") == sorted(str(p) for p in jars.glob("*.jar"))
    assert "spark.jars.packages" not in conf


def test_falls_back_to_ivy_packages_with_the_cache_in_the_project(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    conf = spark_conf(s, "t")
    assert conf["spark.jars.packages"] == ",".join(spark_packages(s))
    assert conf["spark.jars.ivy"] == str(tmp_path / "ivy")
    assert any("spark-sql-kafka-0-10_2.13" in p for p in spark_packages(s))
    assert any("spark-avro_2.13" in p for p in spark_packages(s))


def test_python_workers_and_state_store(tmp_path: Path) -> None:
    conf = spark_conf(_settings(tmp_path), "tidewatch-x")
    assert conf["spark.pyspark.python"] == sys.executable
    assert conf["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB_PROVIDER
    assert conf[CHANGELOG_CHECKPOINTING] == "true"  # a commit writes the batch's changes only
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.app.name"] == "tidewatch-x"


def test_arrow_batches_to_python_have_no_byte_limit(tmp_path: Path) -> None:
    """Exactly ``Int.MaxValue``: the one value for which Spark skips its per-row size check (any
    other value, however large, keeps it); a user's extra conf still overrides it."""
    conf = spark_conf(_settings(tmp_path), "t")
    assert conf["spark.sql.execution.arrow.maxBytesPerBatch"] == ARROW_NO_BYTE_LIMIT == str(2**31 - 1)
    assert "spark.sql.execution.arrow.maxRecordsPerBatch" not in conf  # Spark's 10,000 rows bound them
    s = _settings(tmp_path).model_copy(
        update={"spark_extra_conf": {"spark.sql.execution.arrow.maxBytesPerBatch": "32m"}}
    )
    assert spark_conf(s, "t")["spark.sql.execution.arrow.maxBytesPerBatch"] == "32m"


def test_a_local_master_keeps_the_driver_on_the_loopback(tmp_path: Path) -> None:
    conf = spark_conf(_settings(tmp_path), "t")
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert "spark.driver.port" not in conf and "spark.blockManager.port" not in conf
    assert conf["spark.pyspark.python"] == conf["spark.pyspark.driver.python"] == sys.executable


def test_a_cluster_master_with_its_network_settings(tmp_path: Path) -> None:
    """``spark://host:7077`` with the driver's address, ports, the workers' Python and extra conf."""
    jars = tmp_path / "spark-jars"
    jars.mkdir()
    (jars / "spark-sql-kafka-0-10_2.13-4.2.0.jar").write_bytes(b"")
    (jars / ".complete").write_text("coords\n")
    s = _settings(tmp_path).model_copy(
        update={
            "spark_master": "spark://spark-master.example:7077",
            "spark_driver_host": "10.1.2.3",
            "spark_driver_bind_address": "0.0.0.0",
            "spark_driver_port": 40000,
            "spark_block_manager_port": 40001,
            "spark_python": "/opt/tidewatch/.venv/bin/python",
            "spark_extra_conf": {"spark.executor.memory": "2g", "spark.cores.max": "4"},
        }
    )
    conf = spark_conf(s, "tidewatch-engine")
    assert conf["spark.master"] == "spark://spark-master.example:7077"
    assert conf["spark.driver.host"] == "10.1.2.3"
    assert conf["spark.driver.bindAddress"] == "0.0.0.0"
    assert conf["spark.driver.port"] == "40000"
    assert conf["spark.blockManager.port"] == "40001"
    assert conf["spark.pyspark.python"] == "/opt/tidewatch/.venv/bin/python"
    assert conf["spark.pyspark.driver.python"] == sys.executable  # the driver is this process
    # the connector jars are served by the driver to the executors
    assert conf["spark.jars"] == str(jars / "spark-sql-kafka-0-10_2.13-4.2.0.jar")
    assert conf["spark.executor.memory"] == "2g" and conf["spark.cores.max"] == "4"


def test_a_cluster_master_without_network_settings_uses_sparks_defaults(tmp_path: Path) -> None:
    """Unset, nothing pins the driver to 127.0.0.1 (which executors on other hosts cannot reach):
    Spark advertises this machine's address and binds on it; the workers' Python is this venv's."""
    s = _settings(tmp_path).model_copy(update={"spark_master": "spark://10.0.0.2:7077"})
    conf = spark_conf(s, "t")
    for key in (
        "spark.driver.host",
        "spark.driver.bindAddress",
        "spark.driver.port",
        "spark.blockManager.port",
    ):
        assert key not in conf, key
    assert conf["spark.pyspark.python"] == sys.executable
    assert "spark.jars.packages" in conf  # no cache here: Ivy, which distributes them too


def test_settings_from_the_environment(monkeypatch) -> None:
    from tidewatch.settings import Settings

    monkeypatch.setenv("TIDEWATCH_SPARK_DRIVER_HOST", "10.9.8.7")
    monkeypatch.setenv("TIDEWATCH_SPARK_DRIVER_PORT", "41000")
    monkeypatch.setenv("TIDEWATCH_SPARK_PYTHON", "/srv/venv/bin/python")
    monkeypatch.setenv("TIDEWATCH_SPARK_EXTRA_CONF", '{"spark.executor.cores": "1"}')
    s = Settings(spark_master="spark://h:7077")
    conf = network_conf(s)
    assert conf == {"spark.driver.host": "10.9.8.7", "spark.driver.port": "41000"}
    assert s.spark_python == "/srv/venv/bin/python"
    assert s.spark_extra_conf == {"spark.executor.cores": "1"}


def test_local_masters() -> None:
    assert all(is_local_master(m) for m in ("local", "local[2]", "local[*]", "local-cluster[2,1,1024]"))
    assert not any(is_local_master(m) for m in ("spark://h:7077", "yarn", "k8s://https://h:6443"))


def test_python_workers_get_numpys_huge_page_choice(tmp_path: Path) -> None:
    """Spark's Python workers keep NumPy's own huge-page choice by default and start without the
    advice when the settings turn it off (engine.runtime.hugepages), through ``spark.executorEnv``."""
    assert "spark.executorEnv.NUMPY_MADVISE_HUGEPAGE" not in spark_conf(_settings(tmp_path), "t")
    off = _settings(tmp_path).model_copy(update={"engine_numpy_hugepages": False})
    assert spark_conf(off, "t")["spark.executorEnv.NUMPY_MADVISE_HUGEPAGE"] == "0"
