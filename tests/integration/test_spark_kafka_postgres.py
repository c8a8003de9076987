"""Avro trades -> real Kafka -> Spark Structured Streaming (real Kafka connector) -> PostgreSQL.

Trades are framed Avro records (:mod:`tidewatch.wire.avro`: magic byte, schema id, fastavro body of
``tidewatch/wire/schemas/trades.avsc``) produced to the testcontainers Kafka.  A streaming query
reads them through ``spark-sql-kafka-0-10``, decodes the body with spark-avro's
``from_avro`` and, in ``foreachBatch``, writes one row per micro-batch into the
testcontainers PostgreSQL (upsert on the batch id, so a replayed batch changes nothing).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.integration

SYMBOLS = ["AAPL", "MSFT", "NVDA", "TSLA", "IBM"]
CREATE = """
create table if not exists spark_batches (
    query text not null,
    batch_id bigint not null,
    n_trades bigint not null,
    n_symbols bigint not null,
    volume bigint not null,
    bad_frames bigint not null,
    primary key (query, batch_id)
)
"""
UPSERT = """
insert into spark_batches (query, batch_id, n_trades, n_symbols, volume, bad_frames)
values (:query, :batch_id, :n_trades, :n_symbols, :volume, :bad_frames)
on conflict (query, batch_id) do update set
    n_trades = excluded.n_trades, n_symbols = excluded.n_symbols,
    volume = excluded.volume, bad_frames = excluded.bad_frames
"""


def _trades(n: int, start_ms: int) -> list[dict[str, object]]:
    return [
        {
            "symbol": SYMBOLS[i % len(SYMBOLS)],
            "ts": start_ms + i,
            "price": 100.0 + (i % 7),
            "size": 1 + i % 10,
            "side": "BID" if i % 2 else "ASK",
            "exchange": "XNYS",
        }
        for i in range(n)
    ]


def _produce(bootstrap: str, topic: str, trades: list[dict[str, object]]) -> None:
    from confluent_kafka import Producer

    from tidewatch.wire.avro import encode

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for t in trades:
        producer.produce(topic, key=str(t["symbol"]).encode(), value=encode("trades", t))
    assert producer.flush(30) == 0


@pytest.fixture()
def trades_topic(kafka_bootstrap: str) -> Iterator[str]:
    from confluent_kafka.admin import AdminClient

    from tidewatch.kafka.topics import create_topics, stream_topic_spec

    name = f"trades-it-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    create_topics(admin, [stream_topic_spec(name, 2)])
    yield name
    admin.delete_topics([name])


def _rows(pg_url: str, query: str) -> list[tuple[int, int, int, int, int]]:
    import sqlalchemy as sa

    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "select batch_id, n_trades, n_symbols, volume, bad_frames from spark_batches"
                    " where query = :q order by batch_id"
                ),
                {"q": query},
            ).all()
    finally:
        engine.dispose()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def test_avro_trades_flow_from_kafka_through_spark_into_postgres(
    spark, kafka_bootstrap: str, pg_url: str, trades_topic: str, tmp_path
) -> None:
    import sqlalchemy as sa
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from tidewatch.wire.avro import load_schema_json, schema_id

    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(CREATE))
    query_name = f"q{uuid.uuid4().hex[:8]}"
    sid = schema_id("trades")

    def write_batch(df: DataFrame, batch_id: int) -> None:
        agg = df.agg(
            F.count(F.col("t.symbol")).alias("n"),
            F.countDistinct("t.symbol").alias("symbols"),
            F.coalesce(F.sum("t.size"), F.lit(0)).alias("volume"),
            F.sum(F.when(F.col("bad"), 1).otherwise(0)).alias("bad"),
        ).first()
        assert agg is not None
        with engine.begin() as conn:
            conn.execute(
                sa.text(UPSERT),
                {
                    "query": query_name,
                    "batch_id": batch_id,
                    "n_trades": agg["n"],
                    "n_symbols": agg["symbols"],
                    "volume": agg["volume"],
                    "bad_frames": agg["bad"] or 0,
                },
            )

    def start(trigger: dict[str, object]):
        raw = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", trades_topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 40)
            .load()
        )
        good_frame = (F.substring("value", 1, 1) == F.lit(b"\x00")) & (
            F.conv(F.hex(F.substring("value", 2, 4)), 16, 10).cast("int") == F.lit(sid)
        )
        decoded = raw.select(
            F.when(good_frame, from_avro(F.expr("substring(value, 6)"), load_schema_json("trades"))).alias(
                "t"
            ),
            (~good_frame).alias("bad"),
        )
        return (
            decoded.writeStream.queryName(query_name)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .foreachBatch(write_batch)
            .trigger(**trigger)
            .start()
        )

    # 1) 100 trades already in the topic; availableNow drains them in micro-batches of <= 40
    first = _trades(100, start_ms=1_700_000_000_000)
    _produce(kafka_bootstrap, trades_topic, first)
    q = start({"availableNow": True})
    q.awaitTermination(180)
    assert q.exception() is None
    rows = _rows(pg_url, query_name)
    assert [r[0] for r in rows] == list(range(len(rows)))  # one row per micro-batch, in order
    assert len(rows) >= 3 and all(0 < r[1] <= 40 for r in rows)
    assert sum(r[1] for r in rows) == 100
    assert sum(r[3] for r in rows) == sum(int(t["size"]) for t in first)  # type: ignore[call-overload]
    assert all(r[4] == 0 for r in rows)

    # 2) restarted from its checkpoint as a live query: only the new trades, each exactly once
    q = start({"processingTime": "1 second"})
    try:
        second = _trades(50, start_ms=1_700_000_100_000)
        _produce(kafka_bootstrap, trades_topic, second)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum(r[1] for r in _rows(pg_url, query_name)) < 150:
            assert q.exception() is None
            time.sleep(0.5)
    finally:
        q.stop()
    rows_after = _rows(pg_url, query_name)
    assert rows_after[: len(rows)] == rows
    new_rows = [r for r in rows_after[len(rows) :] if r[1] > 0]
    assert sum(r[1] for r in new_rows) == 50
    assert max(r[2] for r in rows_after) <= len(SYMBOLS)
    engine.dispose()
