"""Ticks: a micro-batch run on purpose, so an idle sharded engine answers the key page's charts.

With shards the state is in the executors' Python workers and a shard answers chart requests
only in its own task, after a batch (:mod:`engine.shards.charts`).  Spark runs a micro-batch
only when a source has new data, so an idle stream (a closed market, a quiet network) would leave
the requests unanswered.  Spark's own way to run batches without data -- ``timeMode =
"ProcessingTime"``, which makes ``TransformWithStateExec.shouldRunAnotherBatch`` true -- runs one
at *every* trigger, and an idle query then keeps most of a core busy (``bench/tws_idle_probe.py``;
docs/measurements/engine.md, "Ticks for the sharded mode's idle charts").  A tick runs one batch
when a request waits, none otherwise:

* the query reads a second source, Spark's file source over ``<checkpoint>/tidewatch/ticks``
  (:meth:`TickDir.stream`), unioned with the routing stage's output: each file holds one row per
  shard label, with no records, span or ranges -- so every shard runs the batch, evaluates nothing
  and answers the pending requests of its keys;
* the driver writes a tick (:meth:`TickDir.write`) only when requests wait and no batch came for
  longer than its idle wait (:meth:`engine.shards.charts.ShardCharts.poll_idle`);
* Spark's file source deletes each tick file once its batch is committed (``cleanSource``).

A tick adds nothing to the shard's batch log but an empty entry (no offset ranges to read again),
so a rebuild runs it again as the same empty batch.  Hidden file names (a leading ``.``) are not
read by Spark's file source: a tick is written under one and renamed when whole.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["TICK_SCHEMA", "TickDir", "is_tick"]

#: a tick file's rows (JSON lines): the shard label the row goes to
TICK_SCHEMA = "shard INT"


def is_tick(span: Any) -> bool:
    """Whether a routed row is a tick's (it has no span: every routing task's row has one)."""
    return span is None or span != span  # pandas gives NaN for a null in an object column


#: Spark's logger of ``cleanSource``: it tries again at later commits to delete a file it deleted
#: and warns each time ("Failed to remove ... / skip removing file"; Spark 4's
#: ``FileStreamSource.commit`` cleans the files of the batch its offset names, also when a batch
#: did not move it)
_REMOVER_LOGGERS = tuple(
    f"org.apache.spark.sql.execution.streaming.{pkg}FileStreamSource$SourceFileRemover"
    for pkg in ("", "runtime.")
)


def _quiet_remover(spark: Any) -> None:
    """Spark's file remover logs errors only (:data:`_REMOVER_LOGGERS`); a tick file it cannot
    delete is still found: :meth:`TickDir.pending`."""
    jvm = spark.sparkContext._jvm
    level = jvm.org.apache.logging.log4j.Level.ERROR
    for name in _REMOVER_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)


class TickDir:
    """The directory of tick files (module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def write(self, labels: list[int]) -> Path:
        """Write one tick: a file with one row per shard label, whole when Spark can see it."""
        self.path.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}.{os.getpid()}.json"
        tmp = self.path / f".{name}.tmp"  # hidden: Spark's file source skips it
        tmp.write_text("".join(json.dumps({"shard": int(s)}) + "\n" for s in labels))
        final = self.path / name
        os.replace(tmp, final)
        return final

    def pending(self) -> list[Path]:
        """The tick files Spark has not deleted yet (not committed, or not read yet)."""
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.iterdir() if not p.name.startswith("."))

    def stream(self, spark: Any) -> Any:
        """The ticks as a streaming DataFrame of the routing stage's rows
        (:data:`engine.shards.route.ROUTED_DDL`): the shard label, every other column null."""
        from pyspark.sql import functions as F

        self.path.mkdir(parents=True, exist_ok=True)
        _quiet_remover(spark)
        raw = (
            spark.readStream.schema(TICK_SCHEMA)
            .option("cleanSource", "delete")
            .option("maxFilesPerTrigger", 100)
            .json(str(self.path.resolve()))
        )
        return raw.select(
            F.col("shard").cast("int").alias("shard"),
            F.lit(None).cast("binary").alias("records"),
            F.lit(None).cast("binary").alias("span"),
            F.lit(None).cast("binary").alias("ranges"),
            F.lit(None).cast("binary").alias("panes"),
            F.lit(None).cast("string").alias("made"),
        )
