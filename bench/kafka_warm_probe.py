"""Probe for issue #19's first live seconds: does reading another Kafka topic through the executors'
pre-aggregation first make a *stream's* first micro-batches faster?

Produces ``--batches`` x 25,000 trades into a fresh topic (the stream's) and, with
``--warm-rounds W`` > 0, W x 25,000 into a second one; builds an engine core with ``--rules``
rules of the live benchmark's mix for the pane specs; starts Spark as the engine does and runs the
engine's warm-up (one synthetic record per task slot); then W reads of the second topic through
``spark_preaggregate`` (25,000 records each, timed: batch reads, or with ``--warm-stream`` the
micro-batches of an ``availableNow`` stream over it); then a stream over the first topic
(``maxOffsetsPerTrigger`` 25,000, ``availableNow``) whose ``foreachBatch`` runs
``spark_preaggregate(df).toArrow()``.  Prints each warm-up read and each stream batch: the time
to the driver's Arrow table and Spark's ``addBatch`` / ``triggerExecution``.

    .venv/bin/tidewatch up --services-only
    .venv/bin/python bench/kafka_warm_probe.py --warm-rounds 0
    .venv/bin/python bench/kafka_warm_probe.py --warm-rounds 4
    .venv/bin/python bench/kafka_warm_probe.py --warm-rounds 4 --warm-stream
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import make_events, make_mixed_rules, produce, run_settings
from engine.core import EngineCore
from engine.executors.preagg import spark_preaggregate
from engine.executors.warmup import warm_up
from engine.messages import SubscriptionChange
from engine.rule_evaluator import make_evaluator, rule_compiler
from engine.sinks.publish import ensure_topics
from engine.sources.retention import log_end_offsets
from engine.spark_session import build_spark
from tidewatch.settings import Settings

N = 25_000


def _read(spark: Any, bootstrap: str, topic: str, lo: dict[int, int], hi: dict[int, int]) -> Any:
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {str(p): o for p, o in lo.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): o for p, o in hi.items()}}))
        .option("kafka.isolation.level", "read_committed")
        .load()
    )


def _stream(
    spark: Any, bootstrap: str, topic: str, params: Any
) -> list[tuple[int, int, float, dict[str, Any]]]:
    """The whole topic as a stream (``availableNow``, :data:`N` records per micro-batch) through
    ``spark_preaggregate(df).toArrow()`` in ``foreachBatch``: per batch (id, pane rows, ms to the
    driver, Spark's ``durationMs``)."""
    took: list[tuple[int, int, float]] = []

    def on_batch(df: Any, batch_id: int) -> None:
        t1 = time.perf_counter()
        n = spark_preaggregate(df, params).toArrow().num_rows
        took.append((batch_id, n, (time.perf_counter() - t1) * 1000))

    ck = tempfile.mkdtemp(prefix="tw-kwp-")
    q = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(N))
        .option("kafka.isolation.level", "read_committed")
        .load()
        .writeStream.foreachBatch(on_batch)
        .trigger(availableNow=True)
        .option("checkpointLocation", ck)
        .start()
    )
    q.awaitTermination()
    durs = [p["durationMs"] for p in q.recentProgress]
    shutil.rmtree(ck, ignore_errors=True)
    return [(b, n, ms, d) for (b, n, ms), d in zip(took, durs, strict=False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:19092", help="Kafka (default: tidewatch up's)")
    ap.add_argument("--warm-rounds", type=int, default=0, help="reads of 25,000 records before the stream")
    ap.add_argument(
        "--warm-stream",
        action="store_true",
        help="the warm-up reads as a stream (availableNow, 25,000 records per micro-batch) instead of batch reads",
    )
    ap.add_argument("--batches", type=int, default=16, help="stream micro-batches of 25,000 records")
    ap.add_argument("--rules", type=int, default=1000, help="rules of the live benchmark's mix (pane specs)")
    a = ap.parse_args()
    run = f"{int(time.time())}"
    base = Settings()
    live, warm = run_settings(base, "kwp-live", run), run_settings(base, "kwp-warm", run)
    for s in (live, warm):
        ensure_topics(a.bootstrap, s)
    now = int(time.time() * 1000)
    cols = make_events("trades", N * a.batches, 5000, 50_000.0, now, seed=3)
    produce(a.bootstrap, live.topic_trades, cols)
    if a.warm_rounds:
        produce(
            a.bootstrap,
            warm.topic_trades,
            make_events("trades", N * a.warm_rounds, 5000, 50_000.0, now, seed=4),
        )
    core = EngineCore(
        pane_ms=1000,
        allowed_lateness_ms=500,
        max_future_ms=10**12,
        evaluator_factory=lambda: make_evaluator(live),
        compile_rule=rule_compiler(live),
    )
    texts = make_mixed_rules(a.rules, "trades", cols, N * a.batches / 50_000)
    core.process(0, {}, [SubscriptionChange(f"m{i}", "upsert", f"m{i}", x) for i, x in enumerate(texts)])
    spark = build_spark(live)
    params = core.batch_params({"trades": live.topic_trades, "packets": live.topic_packets})
    t0 = time.perf_counter()
    print(f"engine warm-up (one synthetic record per task slot): {warm_up(spark, params):.1f} s", flush=True)
    wp = core.batch_params({"trades": warm.topic_trades, "packets": warm.topic_packets})
    if a.warm_rounds and a.warm_stream:
        for bid, _n, ms, d in _stream(spark, a.bootstrap, warm.topic_trades, wp):
            print(f"  warm-up stream batch {bid}: {ms:.0f} ms (addBatch {d.get('addBatch')} ms)", flush=True)
    elif a.warm_rounds:
        parts = [(warm.topic_trades, p) for p in range(warm.topic_partitions)]
        ends = {p: e for (_t, p), e in log_end_offsets(a.bootstrap, warm, parts).items()}
        for r in range(a.warm_rounds):
            lo = {p: e * r // a.warm_rounds for p, e in ends.items()}
            hi = {p: e * (r + 1) // a.warm_rounds for p, e in ends.items()}
            t1 = time.perf_counter()
            spark_preaggregate(_read(spark, a.bootstrap, warm.topic_trades, lo, hi), wp).toArrow()
            print(f"  warm-up read {r}: {(time.perf_counter() - t1) * 1000:.0f} ms", flush=True)
    print(f"warm-up in all: {time.perf_counter() - t0:.1f} s", flush=True)
    for bid, n, ms, d in _stream(spark, a.bootstrap, live.topic_trades, params):
        print(
            f"stream batch {bid}: {n:,} pane rows, to the driver {ms:.0f} ms, addBatch {d.get('addBatch')} ms, "
            f"trigger {d.get('triggerExecution')} ms"
        )
    spark.stop()


if __name__ == "__main__":
    main()
