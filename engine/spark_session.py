"""The one way Tidewatch builds a SparkSession (engine and tests).

What it sets, and why:

* the Kafka source/sink ``spark-sql-kafka-0-10_2.13`` and ``spark-avro_2.13`` -- the pyspark
  wheel ships neither.  When ``.cache/spark-jars`` holds them (resolved with Maven by
  ``python -m tidewatch.jars spark``), they are passed with ``spark.jars``: no
  network, no Ivy, and the exact versions known to run on pyspark 4.3 (Maven Central has no
  4.3.0 connector; see :mod:`tidewatch.jars`).  Otherwise the same coordinates go
  to ``spark.jars.packages`` with the Ivy cache in ``.cache/ivy``, and if Ivy cannot resolve
  them the same coordinates are resolved with Maven into the cache and the session is built
  again with ``spark.jars``.  Ivy fails on ``spark-token-provider-kafka-0-10_2.13:4.2.0`` (not on
  Central), and the Maven fallback then starts the session much later than the cache would
  (docs/measurements/engine.md) -- which is why the cache comes first;
* ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` = this interpreter, so Python workers import the
  venv's pyarrow/fastavro instead of the system ``python3`` (without it pandas UDFs and Python
  data sources hang for two minutes and fail);
* the RocksDB state store provider (needed by ``transformWithState``; keeps state off-heap);
* a small shuffle-partition count and quiet logs, for local mode on a few cores.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from tidewatch import jars as kafka_dist
from tidewatch.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def spark_packages(settings: Settings) -> list[str]:
    """Maven coordinates of the connectors, for ``spark.jars.packages``."""
    return [
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{settings.spark_kafka_connector_version}",
        f"org.apache.spark:spark-avro_2.13:{settings.spark_avro_version}",
    ]


def connector_conf(settings: Settings) -> dict[str, str]:
    """``spark.jars`` from the project cache when it is filled, else ``spark.jars.packages`` via Ivy."""
    jars = kafka_dist.spark_jars(settings)
    if jars:
        return {"spark.jars": ",".join(jars)}
    ivy = settings.cache_dir / "ivy"
    ivy.mkdir(parents=True, exist_ok=True)
    return {"spark.jars.packages": ",".join(spark_packages(settings)), "spark.jars.ivy": str(ivy)}


def spark_conf(settings: Settings, app_name: str) -> dict[str, str]:
    """Every configuration entry :func:`build_spark` sets (pure; handy in tests)."""
    conf = {
        "spark.app.name": app_name,
        "spark.master": settings.spark_master,
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.driver.maxResultSize": "0",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    conf.update(connector_conf(settings))
    return conf


def build_spark(settings: Settings, app_name: str = "tidewatch") -> SparkSession:
    """A SparkSession with the Kafka and Avro connectors, on ``settings.spark_master``.

    ``getOrCreate`` semantics: inside one process the first call wins; call ``.stop()`` on the
    result to build a different one.
    """
    from pyspark.sql import SparkSession

    s = settings
    # Spark's launcher and its Python workers read these from the environment, not from conf.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    conf = spark_conf(s, app_name)
    try:
        spark = _create(SparkSession, conf)
    except Exception as exc:
        if "spark.jars.packages" not in conf:
            raise
        # Ivy could not resolve the packages (no network to Central, or an incomplete
        # artifact there): resolve the same coordinates with Maven into the cache and retry.
        try:
            kafka_dist.ensure_spark_jars(s)
        except RuntimeError as mvn_exc:
            raise RuntimeError(
                f"Spark could not resolve {conf['spark.jars.packages']} through Ivy ({exc}) "
                f"nor through Maven ({mvn_exc}); run scripts/setup.sh"
            ) from exc
        conf.pop("spark.jars.packages")
        conf.pop("spark.jars.ivy", None)
        conf.update(connector_conf(s))
        spark = _create(SparkSession, conf)
    spark.sparkContext.setLogLevel(s.spark_log_level)
    return spark


def _create(session_cls: type[SparkSession], conf: dict[str, str]) -> SparkSession:
    builder = session_cls.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
