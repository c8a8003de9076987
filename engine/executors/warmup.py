"""Starting Spark's Python workers before the first micro-batch.

The executors' pre-aggregation (:class:`engine.executors.preagg.Preaggregator`, run by
``mapInArrow``) runs in Spark's Python workers.  The first task a worker runs pays for starting
it: importing NumPy, Arrow and Numba, and loading the engine's Numba kernels (decode, panes) from
their cache -- about two seconds per worker on this machine.  Paid by the first micro-batch of a
live feed, that is two seconds of latency for its alerts, and a backlog the next batches drain.
:func:`warm_up` pays it at engine start instead: one small batch job whose tasks (one per task
slot) pre-aggregate one valid record of each stream with the engine's parameters, the same code
path as a micro-batch.  Its output is dropped; nothing is read from Kafka or written anywhere.
Workers are reused by Spark (``spark.python.worker.reuse``) until they have been idle for a
while, so a feed that starts minutes later may pay part of it again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from engine.executors.collect import collect_preaggregated
from engine.executors.preagg import BatchParams
from tidewatch.wire.avro import encode_batch

#: one valid record of each stream (its ``ts`` set at warm-up)
SAMPLES: dict[str, dict[str, Any]] = {
    "trades": {"symbol": "WARMUP", "price": 1.0, "size": 1, "side": "BID", "exchange": "NASDAQ"},
    "packets": {
        "src_ip": "192.0.2.1",
        "dst_ip": "192.0.2.2",
        "src_port": 40000,
        "dst_port": 443,
        "protocol": "TCP",
        "length": 60,
        "tcp_flags": "S",
    },
}


def kafka_records_of(topic: str, stream: str, events: Mapping[str, Any], offset: int) -> pa.Table:
    """Kafka rows (:data:`~engine.executors.preagg.KAFKA_COLUMNS`) of ``events`` (columns of
    ``stream``, Avro-encoded as the ingest writes them) on ``topic``'s partition 0 from
    ``offset`` on, each Kafka timestamp at its event's time."""
    n = len(events["ts"])
    stamps = [datetime.fromtimestamp(int(t) / 1000, UTC) for t in events["ts"]]
    return pa.table(
        {
            "topic": pa.array([topic] * n, pa.string()),
            "partition": pa.array(np.zeros(n, np.int32)),
            "offset": pa.array(np.arange(offset, offset + n, dtype=np.int64)),
            "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC")),
            "key": pa.array([b"warm-up"] * n, pa.binary()),
            "value": pa.array(encode_batch(stream, events).messages() if n else [], pa.binary()),
        }
    )


def warm_up_records(params: BatchParams, tasks: int, now_ms: int) -> pa.Table:
    """``tasks`` copies of one record of each event stream of ``params`` (Kafka rows,
    :func:`kafka_records_of`), with event time ``now_ms``."""
    return pa.concat_tables(
        [
            kafka_records_of(
                topic, stream, {f: [v] * tasks for f, v in {**SAMPLES[stream], "ts": now_ms}.items()}, 0
            )
            for stream, topic in params.topics
            if stream in SAMPLES
        ]
    )


def warm_up(spark: Any, params: BatchParams) -> float:
    """Run the executors' pre-aggregation once in every task slot (see the module docstring);
    the seconds it took."""
    t0 = time.perf_counter()
    slots = max(1, int(spark.sparkContext.defaultParallelism))
    tbl = warm_up_records(params, slots, int(time.time() * 1000))
    df = spark.createDataFrame(tbl.to_pandas()).repartition(slots)
    collect_preaggregated(df, params)
    return time.perf_counter() - t0
