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
* ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` = ``settings.spark_python``, by default this
  interpreter, so Python workers import the venv's pyarrow/fastavro instead of the system
  ``python3`` (without it pandas UDFs and Python data sources hang for two minutes and fail).
  The driver sends this path with every Python function; on a cluster it must exist on every
  worker host;
* the driver's network (:func:`network_conf`): on a ``local[...]`` master the driver binds to and
  advertises 127.0.0.1, as before; on a cluster master (``spark://…``) executors on other hosts
  must reach it, so the driver host, bind address and the driver / block manager ports are
  settings, and unset they are Spark's defaults (docs/engine.md, "Running on a cluster").  The
  connector jars go to the executors with ``spark.jars`` (the driver serves them);
* the RocksDB state store provider (needed by ``transformWithState``; keeps state off-heap);
* a small shuffle-partition count and quiet logs, for local mode on a few cores;
* no byte limit on the Arrow batches sent to Python workers (:data:`ARROW_NO_BYTE_LIMIT`): with
  one, Spark asks the Arrow writer its size after every row, and for our small rows the row limit
  (``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000) closes every batch first anyway;
* last, ``settings.spark_extra_conf`` (e.g. ``spark.executor.memory``, ``spark.cores.max``).
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

from engine.runtime.hugepages import ENV as HUGEPAGE_ENV
from tidewatch import jars as kafka_dist
from tidewatch.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: ``spark.sql.execution.arrow.maxBytesPerBatch`` = ``Int.MaxValue``: the one value for which
#: Spark's ``BatchedPythonArrowInput.writeSizedBatch`` skips ``ArrowWriter.sizeInBytes()`` after
#: each row.  With the default (64 MB) that walk of the batch's vectors was 8.5 % of the Spark
#: tasks' samples in a live run (Java Flight Recorder), and ``bench/arrow_batch_probe.py`` moves
#: Kafka-shaped rows through ``mapInArrow`` 1.73–2.56× faster without it (figures in
#: docs/measurements/engine.md, "Spark's Arrow batches without a byte limit").  The batches stay
#: bounded by ``maxRecordsPerBatch`` rows (10,000 records of ≈ 100 bytes: ≈ 1 MB).  Even with
#: records at Kafka's size limit the byte limit bounded little: the worker's
#: :class:`~engine.executors.preagg.Preaggregator` holds up to ``BatchParams.chunk_rows`` records
#: (2,000,000) before it aggregates them, 200 such batches.
ARROW_NO_BYTE_LIMIT = "2147483647"


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


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``, ``local-cluster[…]``: every process on
    this machine."""
    return master.strip().startswith("local")


def local_task_slots(master: str) -> int | None:
    """The task slots of Spark's one executor in local mode: ``local`` 1, ``local[N]`` and
    ``local[N,F]`` N, ``local[*]`` this machine's cores; None for any other master
    (``local-cluster[…]``, a cluster), whose executors are separate processes."""
    m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", master.strip())
    if m is None:
        return None
    if m.group(1) is None:
        return 1
    return os.cpu_count() or 1 if m.group(1) == "*" else int(m.group(1))


def python_executable(settings: Settings) -> str:
    """The Python of the executors' Python workers: ``settings.spark_python``, else this one."""
    return settings.spark_python or sys.executable


def network_conf(settings: Settings) -> dict[str, str]:
    """The driver's address and ports.  A local master: 127.0.0.1 unless set (nothing listens on
    other interfaces).  A cluster master: what the settings give; unset entries are Spark's
    defaults (this machine's address, bound on it; free ports)."""
    s = settings
    local = is_local_master(s.spark_master)
    host = s.spark_driver_host or ("127.0.0.1" if local else None)
    bind = s.spark_driver_bind_address or ("127.0.0.1" if local and not s.spark_driver_host else None)
    conf: dict[str, str] = {}
    if bind:
        conf["spark.driver.bindAddress"] = bind
    if host:
        conf["spark.driver.host"] = host
    if s.spark_driver_port is not None:
        conf["spark.driver.port"] = str(s.spark_driver_port)
    if s.spark_block_manager_port is not None:
        conf["spark.blockManager.port"] = str(s.spark_block_manager_port)
    return conf


#: the RocksDB state store's changelog checkpointing (see :func:`spark_conf`)
CHANGELOG_CHECKPOINTING = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"

#: Spark's checkpoint file manager for the streaming query's logs (see :func:`spark_conf`)
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def spark_conf(settings: Settings, app_name: str) -> dict[str, str]:
    """Every configuration entry :func:`build_spark` sets (pure; handy in tests)."""
    python = python_executable(settings)
    conf = {
        "spark.app.name": app_name,
        "spark.master": settings.spark_master,
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": sys.executable,
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        # the sharded mode's state store (its only user) commits a batch by writing the batch's
        # changes to a changelog file rather than zipping and copying RocksDB's files; a snapshot
        # of them is made in the background (Spark's "changelog checkpointing"; a checkpoint made
        # without it is read as before): a cheaper commit (figures in docs/measurements/engine.md,
        # "The sharded mode's fixed cost per micro-batch")
        CHANGELOG_CHECKPOINTING: "true",
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.driver.maxResultSize": "0",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxBytesPerBatch": ARROW_NO_BYTE_LIMIT,
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        # Spark's offset and commit logs written through Hadoop's FileSystem API (write to a
        # temporary file, rename: atomic on a local disk and on HDFS, where the checkpoint lives)
        # instead of FileContext's: cheaper on the path of every batch (figures in
        # docs/measurements/engine.md, "Snapshots by a forked child again")
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
    }
    if not settings.engine_numpy_hugepages:
        # the Python workers' NumPy without its huge-page advice: engine.runtime.hugepages
        conf[f"spark.executorEnv.{HUGEPAGE_ENV}"] = "0"
    conf.update(network_conf(settings))
    conf.update(connector_conf(settings))
    conf.update(settings.spark_extra_conf)
    return conf


def build_spark(settings: Settings, app_name: str = "tidewatch") -> SparkSession:
    """A SparkSession with the Kafka and Avro connectors, on ``settings.spark_master``.

    ``getOrCreate`` semantics: inside one process the first call wins; call ``.stop()`` on the
    result to build a different one.
    """
    from pyspark.sql import SparkSession

    s = settings
    conf = spark_conf(s, app_name)
    # pyspark sends the workers' Python (SparkContext.pythonExec) from the environment, not from
    # conf; spark-submit reads spark.pyspark.python
    os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
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
