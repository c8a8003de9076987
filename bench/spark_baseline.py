"""The plain-Spark baseline: what a Spark user writes without Tidewatch.

One windowed aggregation per rule -- ``groupBy(window(ts, T, slide), symbol)`` + a HAVING filter
-- over the Kafka ``trades`` topic (Avro decoded in the JVM with ``from_avro``), in one
application, in one of two shapes:

* ``queries`` -- one streaming query per rule, all on the same Kafka source (each query reads
  and decodes the topic itself);
* ``union``   -- one query: the rules' windowed projections (rule id, window, symbol, value)
  unioned, then ONE ``groupBy(rule, window, symbol)`` with a per-rule HAVING.

Throughput is measured as the time to drain a backlog (``Trigger.AvailableNow`` with
``maxOffsetsPerTrigger``), output to the ``noop`` sink (cheaper than any real sink: generous
to the baseline).  Used by ``bench/engine_bench.py``; alone::

    .venv/bin/python bench/spark_baseline.py --bootstrap 127.0.0.1:19092 --topic trades --events N \\
        --rules 10 --slide 60 --shape queries
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass(frozen=True)
class ThresholdRule:
    """``agg(field) OVER LAST window_s SECONDS > threshold`` per symbol (COUNT when field is None)."""

    name: str
    window_s: int
    field: str | None
    threshold: float

    @property
    def text(self) -> str:
        """The rule in Tidewatch's language (RULES.md)."""
        agg = "COUNT(*)" if self.field is None else f"SUM({self.field})"
        return f"SELECT symbol FROM trades GROUP BY symbol HAVING {agg} OVER LAST {self.window_s} SECONDS > {self.threshold:g}"


def make_rules(
    n: int, seed: int = 0, data: dict[str, Any] | None = None, ranks: tuple[int, int] = (5, 60)
) -> list[ThresholdRule]:
    """``n`` COUNT/SUM threshold rules with windows of 1-30 minutes (whole minutes).

    Without ``data`` the thresholds are fixed small numbers (most busy symbols alert).  With
    ``data`` (the trades the benchmark will send: ``symbol``, ``ts``, ``size`` columns) each
    rule's threshold is set so that about ``r`` symbols satisfy it once its window is full,
    ``r`` drawn from ``ranks``: the value a symbol reaches is estimated as its share of the
    data over the window (``total * min(window, span) / span``) and the threshold is the
    ``r``-th largest -- realistic selectivity (tens of 5,000 symbols alert, not thousands).
    """
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    est: dict[str | None, np.ndarray] = {}
    span_s = 1.0
    if data is not None:
        ts = np.asarray(data["ts"], np.int64)
        span_s = max((int(ts.max()) - int(ts.min())) / 1000.0, 1.0)
        frame = pd.DataFrame({"symbol": data["symbol"], "size": np.asarray(data["size"], np.float64)})
        g = frame.groupby("symbol", sort=False)["size"]
        est[None] = np.sort(g.size().to_numpy(np.float64))[::-1]
        est["size"] = np.sort(g.sum().to_numpy(np.float64))[::-1]
    out = []
    for i in range(n):
        w = int(rng.integers(1, 31)) * 60
        field = None if i % 2 == 0 else "size"
        if data is None:
            thr = float(rng.integers(3, 12)) if field is None else float(rng.integers(500, 3000))
        else:
            vals = est[field] * min(w, span_s) / span_s
            r = int(rng.integers(ranks[0], ranks[1] + 1))
            thr = float(np.floor(vals[min(r, len(vals) - 1)]))
        out.append(ThresholdRule(f"r{i}", w, field, thr))
    return out


def _events(spark: Any, bootstrap: str, topic: str, max_offsets: int) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from tidewatch.wire.avro import load_schema_json

    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets))
        .load()
    )
    ev = raw.select(from_avro(F.expr("substring(value, 6)"), load_schema_json("trades")).alias("r")).select(
        "r.*"
    )
    # the schema's ts is timestamp-millis: from_avro gives a TIMESTAMP already
    return ev.withColumn("t", F.col("ts")).withWatermark("t", "5 seconds")


def run_baseline(
    spark: Any,
    bootstrap: str,
    topic: str,
    rules: list[ThresholdRule],
    *,
    slide_s: int,
    shape: str,
    max_offsets: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Drain the topic with the baseline; returns wall seconds and whether it finished."""
    from pyspark.sql import functions as F

    ckpt = Path(tempfile.mkdtemp(prefix="tw-baseline-"))
    queries = []
    t0 = time.perf_counter()
    if shape == "queries":
        for r in rules:
            ev = _events(spark, bootstrap, topic, max_offsets)
            agg = F.count(F.lit(1)) if r.field is None else F.sum(r.field)
            q = (
                ev.groupBy(F.window("t", f"{r.window_s} seconds", f"{slide_s} seconds"), "symbol")
                .agg(agg.alias("v"))
                .where(F.col("v") > r.threshold)
                .writeStream.outputMode("update")
                .format("noop")
                .option("checkpointLocation", str(ckpt / r.name))
                .trigger(availableNow=True)
                .start()
            )
            queries.append(q)
    elif shape == "union":
        ev = _events(spark, bootstrap, topic, max_offsets)
        parts = []
        for i, r in enumerate(rules):
            w = F.window("t", f"{r.window_s} seconds", f"{slide_s} seconds")
            val = F.lit(1.0) if r.field is None else F.col(r.field).cast("double")
            parts.append(ev.select(F.lit(i).alias("rule"), w.alias("w"), "symbol", val.alias("x")))
        u = parts[0]
        for p in parts[1:]:
            u = u.unionByName(p)
        thr = F.create_map(*[x for i, r in enumerate(rules) for x in (F.lit(i), F.lit(r.threshold))])
        q = (
            u.groupBy("rule", "w", "symbol")
            .agg(F.sum("x").alias("v"))
            .where(F.col("v") > thr[F.col("rule")])
            .writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(ckpt / "union"))
            .trigger(availableNow=True)
            .start()
        )
        queries.append(q)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    deadline = t0 + timeout_s
    finished = True
    for q in queries:
        left = deadline - time.perf_counter()
        if left <= 0 or not q.awaitTermination(max(left, 0.1)):
            finished = False
            break
    wall = time.perf_counter() - t0
    # rows each query has read (progress reports; a rule is done only when its query is)
    processed = min(sum(int(p.get("numInputRows", 0)) for p in q.recentProgress) for q in queries)
    if shape == "union":  # each branch of the union scans the Kafka source: rows are counted once per rule
        processed //= len(rules)
    for q in queries:
        if q.isActive:
            q.stop()
    errors = [str(q.exception()) for q in queries if q.exception() is not None]
    steady = [_steady(q.recentProgress, len(rules) if shape == "union" else 1) for q in queries]
    return {
        "seconds": wall,
        "finished": finished and not errors,
        "errors": errors,
        "processed": processed,
        # the slowest query's rate from the end of its first micro-batch to the end of its last
        "steady_events_per_s": None if None in steady else min(steady),  # type: ignore[type-var]
        "batches": max(len(q.recentProgress) for q in queries),
    }


def _steady(progress: list[dict[str, Any]], scans: int) -> float | None:
    """Rows / second from the end of the first micro-batch to the end of the last (progress
    reports; ``scans``: how many times each row is counted, once per union branch)."""
    from datetime import datetime

    done = [p for p in progress if int(p.get("numInputRows", 0)) > 0]
    if len(done) < 3:
        return None

    def end(p: dict[str, Any]) -> float:
        start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        return start + float(p["durationMs"]["triggerExecution"]) / 1000.0

    rows = sum(int(p["numInputRows"]) for p in done[1:]) / scans
    span = end(done[-1]) - end(done[0])
    return rows / span if span > 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--events", type=int, required=True, help="events in the topic (for the rate)")
    ap.add_argument("--rules", type=int, default=10)
    ap.add_argument("--slide", type=int, default=60)
    ap.add_argument("--shape", choices=["queries", "union"], default="queries")
    ap.add_argument("--max-offsets", type=int, default=10_000)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    from engine.spark_session import build_spark
    from tidewatch.settings import get_settings

    spark = build_spark(get_settings(), "tidewatch-baseline")
    try:
        res = run_baseline(
            spark, a.bootstrap, a.topic, make_rules(a.rules), slide_s=a.slide, shape=a.shape,
            max_offsets=a.max_offsets, timeout_s=a.timeout,
        )  # fmt: skip
    finally:
        spark.stop()
    rate = (a.events if res["finished"] else res["processed"]) / res["seconds"]
    print(
        f"baseline {a.shape}, {a.rules} rules, slide {a.slide}s: {res['seconds']:.1f} s, {rate:,.0f} events/s, "
        f"finished={res['finished']}"
    )
    print("command:", " ".join(sys.argv))


if __name__ == "__main__":
    main()
