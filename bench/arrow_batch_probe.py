"""Spark's rows to a Python worker through ``mapInArrow``: the Arrow batches' byte limit checked
per row against no byte limit, side by side in one SparkSession.

Spark writes the rows of a ``mapInArrow`` (and of the other Arrow-fed Python operators) into an
Arrow batch until ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (default 10,000) or, unless
``spark.sql.execution.arrow.maxBytesPerBatch`` is ``Int.MaxValue``, until the batch's size in bytes
reaches that limit (default 64 MB).  The size is asked of the Arrow writer after EVERY row
(``BatchedPythonArrowInput.writeSizedBatch``), which walks the batch's vectors.  Tidewatch's records
are small (a Kafka record's value, its partition, offset and timestamp: ≈ 100 bytes), so the row
limit always closes a batch long before the byte limit: the check costs time and bounds nothing.
:func:`engine.spark_session.spark_conf` sets the byte limit to ``Int.MaxValue``.

The probe: ``--rows`` rows shaped like the Kafka source's (``value`` binary, ``partition``,
``offset``, ``timestamp``, ``topic``), cached, sent through a ``mapInArrow`` that counts them; the
two settings alternate, ``--repeat`` times each, after one warm-up run of each; the medians and
their ratio are printed.  Same JVM, same Python workers, same data; the session is the engine's
(:func:`engine.spark_session.build_spark`), the byte limit the only thing that changes.

    .venv/bin/python bench/arrow_batch_probe.py --rows 4000000 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.spark_session import ARROW_NO_BYTE_LIMIT, build_spark  # noqa: E402
from tidewatch.settings import get_settings  # noqa: E402

KEY = "spark.sql.execution.arrow.maxBytesPerBatch"
SPARK_DEFAULT = "64m"


def _count(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    n = 0
    for b in batches:
        n += b.num_rows
    yield pa.RecordBatch.from_pydict({"n": [n]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--value-bytes", type=int, default=60, help="size of each row's value")
    a = ap.parse_args()

    spark = build_spark(get_settings().model_copy(update={"spark_master": "local[2]"}), "arrow-batch-probe")
    spark.sparkContext.setLogLevel("ERROR")
    df = (
        spark.range(0, a.rows, numPartitions=2)
        .selectExpr(
            f"CAST(repeat('x', {a.value_bytes}) AS BINARY) AS value",
            "CAST(id % 4 AS INT) AS partition",
            "id AS offset",
            "CAST(id AS TIMESTAMP) AS timestamp",
            "'trades' AS topic",
        )
        .cache()
    )
    df.count()
    settings = {
        "Spark's default (64 MB, checked per row)": SPARK_DEFAULT,
        "no byte limit": ARROW_NO_BYTE_LIMIT,
    }
    times: dict[str, list[float]] = {name: [] for name in settings}
    for i in range(a.repeat + 1):
        for name, value in settings.items():
            spark.conf.set(KEY, value)
            t = time.perf_counter()
            got = df.mapInArrow(_count, "n long").groupBy().sum("n").collect()[0][0]
            dt = time.perf_counter() - t
            if got != a.rows:
                raise SystemExit(f"{name}: {got} rows came back, not {a.rows}")
            if i > 0:  # the first round warms the JVM and the workers
                times[name].append(dt)
            print(f"round {i}: {name}: {dt:.2f} s", flush=True)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    (old, new) = med.values()
    print(
        f"{a.rows:,} rows through mapInArrow, median of {a.repeat}: "
        + ", ".join(f"{name} {m:.2f} s ({a.rows / m:,.0f} rows/s)" for name, m in med.items())
        + f"; ratio {old / new:.2f}x"
    )
    spark.stop()


if __name__ == "__main__":
    main()
