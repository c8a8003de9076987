"""Kafka records as the engine reads them: Arrow tables of :data:`RECORD_COLUMNS`.

:data:`RECORD_COLUMNS` is the shape ``toArrow()`` of Spark's Kafka source gives the engine
(:meth:`engine.app.EngineApp.on_batch`), the only way the engine ingests a stream; the restart
replay (:func:`read_ranges`) builds the same tables from confluent-kafka messages
(:func:`records_table`) when it re-reads a logged batch's offset ranges.  Its consumer reads
``read_committed`` as the ``engine`` principal and commits nothing
(:func:`engine_consumer_config`): where to read lives in the engine's checkpoint, whose
per-batch offset logs are :func:`offset_ranges` of each batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.messages import SubscriptionChange, parse_subscription_change
from tidewatch.kafka.client import client_config, spark_options

if TYPE_CHECKING:
    from tidewatch.settings import Settings

RECORD_COLUMNS = ["topic", "partition", "offset", "timestamp", "key", "value"]

log = logging.getLogger("tidewatch.engine")


def split_topics(tbl: pa.Table, names: dict[str, str]) -> dict[str, pa.Table]:
    """Records of each topic (``names``: role -> topic), roles trades, packets, subscriptions."""
    out = {}
    for role, topic in names.items():
        if not tbl.num_rows:
            out[role] = tbl
            continue
        mask = pc.equal(tbl.column("topic"), topic)
        hits = pc.sum(mask).as_py() or 0
        # the usual batch is one topic's records: no copy of them, and none for the others
        out[role] = tbl if hits == tbl.num_rows else tbl.slice(0, 0) if hits == 0 else tbl.filter(mask)
    return out


def subscription_changes(tbl: pa.Table) -> list[SubscriptionChange]:
    """Parsed subscription changes of a batch, in (partition, offset) order; bad ones logged."""
    if tbl.num_rows == 0:
        return []
    order = np.lexsort(
        (
            tbl.column("offset").to_numpy(zero_copy_only=False),
            tbl.column("partition").to_numpy(zero_copy_only=False),
        )
    )
    keys = tbl.column("key").to_pylist()
    vals = tbl.column("value").to_pylist()
    out = []
    for i in order:
        try:
            out.append(parse_subscription_change(keys[i], vals[i]))
        except (ValueError, KeyError) as exc:
            log.warning("subscription record %d ignored: %s", int(i), exc)
    return out


def offset_ranges(tbl: pa.Table) -> dict[str, dict[str, list[int]]]:
    """``{topic: {partition: [first, last]}}`` of a batch of Kafka records (one Arrow group-by)."""
    out: dict[str, dict[str, list[int]]] = {}
    if tbl.num_rows == 0:
        return out
    g = tbl.select(["topic", "partition", "offset"]).group_by(["topic", "partition"])
    agg = g.aggregate([("offset", "min"), ("offset", "max")]).to_pydict()
    for t, p, lo, hi in zip(
        agg["topic"], agg["partition"], agg["offset_min"], agg["offset_max"], strict=True
    ):
        out.setdefault(str(t), {})[str(int(p))] = [int(lo), int(hi)]
    return out


def read_ranges(
    bootstrap: str, ranges: dict[str, dict[str, list[int]]], timeout_s: float = 60.0, *, settings: Settings
) -> pa.Table:
    """The Kafka records ``{topic: {partition: [first, last]}}`` (inclusive) as an Arrow table
    (read as the ``engine`` principal of ``settings``)."""
    from confluent_kafka import TopicPartition

    kept: list[Any] = []
    todo = {(t, int(p)): (a, b) for t, ps in ranges.items() for p, (a, b) in ps.items()}
    if todo:
        c = engine_consumer(bootstrap, settings, "tidewatch-engine-replay")
        try:
            c.assign([TopicPartition(t, p, a) for (t, p), (a, _) in todo.items()])
            left = dict(todo)
            deadline = time.monotonic() + timeout_s
            while left and time.monotonic() < deadline:
                for m in c.consume(10_000, 1.0):
                    if m.error():
                        continue
                    tp = (m.topic(), m.partition())
                    if tp not in left:
                        continue
                    a, b = left[tp]
                    off = int(m.offset() or 0)
                    if a <= off <= b:
                        kept.append(m)
                    if off >= b:
                        del left[tp]
                        c.pause([TopicPartition(*tp)])
            if left:
                raise RuntimeError(f"replay could not read offsets {left} within {timeout_s} s")
        finally:
            c.close()
    return records_table(kept)


def engine_consumer_config(bootstrap: str, settings: Settings, group_id: str, **extra: Any) -> dict[str, Any]:
    """librdkafka settings of a ``read_committed`` consumer as the ``engine`` principal
    (SASL/SCRAM in the scram mode) that commits nothing: where to read lives in the engine's
    checkpoint, not in Kafka."""
    return {
        "bootstrap.servers": bootstrap,
        **client_config(settings, "engine"),
        "group.id": group_id,
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        **extra,
    }


def engine_consumer(bootstrap: str, settings: Settings, group_id: str, **extra: Any) -> Any:
    """A confluent-kafka ``Consumer`` of :func:`engine_consumer_config`."""
    from confluent_kafka import Consumer

    return Consumer(engine_consumer_config(bootstrap, settings, group_id, **extra))


def records_table(msgs: list[Any]) -> pa.Table:
    """confluent-kafka messages (no errors among them) as an Arrow table of
    :data:`RECORD_COLUMNS` -- the shape ``toArrow()`` of Spark's Kafka source gives the engine
    (``timestamp`` in epoch ms)."""
    return pa.table(
        {
            "topic": pa.array([m.topic() for m in msgs], pa.string()),
            "partition": pa.array([m.partition() for m in msgs], pa.int32()),
            "offset": pa.array([m.offset() for m in msgs], pa.int64()),
            "timestamp": pa.array([m.timestamp()[1] for m in msgs], pa.int64()),
            "key": pa.array([m.key() for m in msgs], pa.binary()),
            "value": pa.array([m.value() for m in msgs], pa.binary()),
        }
    )


def spark_kafka_options(bootstrap: str, settings: Settings) -> dict[str, str]:
    """Spark's Kafka source options every read of the engine uses: the bootstrap servers,
    committed records only (``read_committed``: the feeds and the engine write in transactions),
    the ``engine`` principal's security settings (SASL/SCRAM, TLS:
    :func:`tidewatch.kafka.client.spark_options`)."""
    return {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.isolation.level": "read_committed",
        **spark_options(settings, "engine"),
    }


def kafka_stream(
    spark: Any,
    bootstrap: str,
    settings: Settings,
    topics: Iterable[str],
    *,
    fail_on_data_loss: bool,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
) -> Any:
    """The streaming DataFrame of ``topics`` through Spark's Kafka source, as the engine's
    queries read them (:func:`spark_kafka_options`).  ``starting_offsets`` is used only by a new
    checkpoint; ``fail_on_data_loss``: whether offsets deleted by retention stop the query (the
    sharded engine) or are left to the caller to find (the driver's engine dead-letters each gap
    as ``lost``: engine.sources.retention) -- never skipped silently either way."""
    reader = (
        spark.readStream.format("kafka")
        .options(**spark_kafka_options(bootstrap, settings))
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
        .option("failOnDataLoss", "true" if fail_on_data_loss else "false")
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()
