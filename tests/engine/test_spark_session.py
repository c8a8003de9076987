"""engine.spark_session: the configuration every SparkSession of Tidewatch gets (no JVM started)."""

from __future__ import annotations

import sys
from pathlib import Path

from engine.spark_session import ROCKSDB_PROVIDER, spark_conf, spark_packages
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
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.app.name"] == "tidewatch-x"
