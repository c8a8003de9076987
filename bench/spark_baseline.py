"""The plain-Spark baseline: what a Spark user writes without Tidewatch.

One windowed aggregation per rule -- ``groupBy(window(ts, T, slide), symbol)`` + a HAVING filter
-- over the Kafka ``trades`` topic (Avro decoded in the JVM with ``from_avro``), in one
application, in one of two shapes:

* ``queries`` -- one streaming query per rule, all on the same Kafka source (each query reads
  and decodes the topic itself);
* ``union``   -- one query: the rules' windowed projections (rule id, window, symbol, value)
  unioned, then ONE ``groupBy(rule, window, symbol)`` with a per-rule HAVING (each branch of
  the union still scans and decodes Kafka: one scan per rule).

Beside them, ``onescan`` (:mod:`bench.onescan_baseline`): Kafka read once, the rules as a
broadcast table, one ``groupBy``; the same alert rows (``tests/bench/test_onescan_baseline.py``).

Throughput is measured as the time to drain a backlog (``Trigger.AvailableNow`` with
``maxOffsetsPerTrigger``), output to the ``noop`` sink (cheaper than any real sink: generous
to the baseline).  Used by ``bench/engine_bench.py``; alone::

    .venv/bin/python bench/spark_baseline.py --bootstrap 127.0.0.1:19092 --topic trades --events N \\
        --rules 10 --slide 60 --shape queries   # or union, onescan
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


def _records(spark: Any, bootstrap: str, topic: str, max_offsets: int) -> Any:
    """The topic's Kafka records as a streaming DataFrame (Spark's connector), from the start."""
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets))
        .load()
    )


def _events(spark: Any, bootstrap: str, topic: str, max_offsets: int, *, watermark: bool = True) -> Any:
    """The ``trades`` topic as a streaming DataFrame (``t`` = the event time, a TIMESTAMP), one
    Kafka scan and one ``from_avro`` decode; with ``watermark``, a 5 s watermark on ``t``."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from tidewatch.wire.avro import load_schema_json

    raw = _records(spark, bootstrap, topic, max_offsets)
    ev = raw.select(from_avro(F.expr("substring(value, 6)"), load_schema_json("trades")).alias("r")).select(
        "r.*"
    )
    # the schema's ts is timestamp-millis: from_avro gives a TIMESTAMP already
    ev = ev.withColumn("t", F.col("ts"))
    return ev.withWatermark("t", "5 seconds") if watermark else ev


def rule_frame(ev: Any, i: int, r: ThresholdRule, slide_s: int) -> Any:
    """Rule ``r`` (number ``i``) alone: ``groupBy(window(t, W, slide), symbol)`` + HAVING; the
    alert rows ``(rule, symbol, start, end, v)`` (the ``queries`` shape, one per rule)."""
    from pyspark.sql import functions as F

    agg = F.count(F.lit(1)).cast("double") if r.field is None else F.sum(F.col(r.field).cast("double"))
    return (
        ev.groupBy(F.window("t", f"{r.window_s} seconds", f"{slide_s} seconds").alias("w"), "symbol")
        .agg(agg.alias("v"))
        .where(F.col("v") > r.threshold)
        .select(
            F.lit(i).alias("rule"),
            "symbol",
            F.col("w.start").alias("start"),
            F.col("w.end").alias("end"),
            "v",
        )
    )


def union_frame(ev: Any, rules: list[ThresholdRule], slide_s: int, deadline: float | None = None) -> Any:
    """The ``union`` shape: every rule's windowed projection ``(rule, window, symbol, x)`` of
    ``ev`` unioned (each branch scans and decodes the source again), ONE
    ``groupBy(rule, window, symbol)`` and a per-rule HAVING; the alert rows ``(rule, symbol,
    start, end, v)``.  ``None`` when building the union passed ``deadline`` (``perf_counter``):
    at 1,000 rules the analysis of the union alone takes minutes in the driver."""
    from pyspark.sql import functions as F

    parts = []
    for i, r in enumerate(rules):
        w = F.window("t", f"{r.window_s} seconds", f"{slide_s} seconds")
        val = F.lit(1.0) if r.field is None else F.col(r.field).cast("double")
        parts.append(ev.select(F.lit(i).alias("rule"), w.alias("w"), "symbol", val.alias("x")))
    u = parts[0]
    for p in parts[1:]:
        if deadline is not None and time.perf_counter() > deadline:
            return None
        u = u.unionByName(p)
    thr = F.create_map(*[x for i, r in enumerate(rules) for x in (F.lit(i), F.lit(r.threshold))])
    return (
        u.groupBy("rule", "w", "symbol")
        .agg(F.sum("x").alias("v"))
        .where(F.col("v") > thr[F.col("rule")])
        .select("rule", "symbol", F.col("w.start").alias("start"), F.col("w.end").alias("end"), "v")
    )


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
    sink: str = "noop",
    query_prefix: str = "",
) -> dict[str, Any]:
    """Drain the topic with the baseline in ``shape`` (``queries``, ``union``: per rule, see the
    module docstring; ``onescan``: :mod:`bench.onescan_baseline`; ``bare``: Spark's Kafka read
    alone, the ceiling of any engine on Spark's connector); returns wall seconds and
    whether it finished.  ``sink="memory"`` keeps the alert rows in the in-memory tables
    ``<query_prefix><rule name | union | onescan>`` (for checking that the shapes agree)."""

    ckpt = Path(tempfile.mkdtemp(prefix="tw-baseline-"))
    queries = []
    t0 = time.perf_counter()
    deadline = t0 + timeout_s
    frames: list[tuple[str, Any]] = []
    if shape == "queries":
        for i, r in enumerate(rules):
            frames.append((r.name, rule_frame(_events(spark, bootstrap, topic, max_offsets), i, r, slide_s)))
    elif shape == "union":
        u = union_frame(_events(spark, bootstrap, topic, max_offsets), rules, slide_s, deadline)
        if u is None:
            return _not_built(
                time.perf_counter() - t0, f"the {len(rules)}-branch union was not built in {timeout_s:.0f} s"
            )
        frames.append(("union", u))
    elif shape == "bare":  # Spark's own ceiling: the Kafka read alone, nothing decoded or sent to Python
        frames.append(
            ("bare", _records(spark, bootstrap, topic, max_offsets).select("partition", "offset", "value"))
        )
    elif shape == "onescan":
        from bench.onescan_baseline import onescan_frame

        ev = _events(spark, bootstrap, topic, max_offsets, watermark=False)
        frames.append(("onescan", onescan_frame(ev, rules, slide_s)))
    else:
        raise ValueError(f"unknown shape {shape!r}")
    for name, frame in frames:
        q = (
            frame.writeStream.outputMode("update")
            .format(sink)
            .option("checkpointLocation", str(ckpt / name))
            .trigger(availableNow=True)
        )
        queries.append((q.queryName(f"{query_prefix}{name}") if sink == "memory" else q).start())
    finished = True
    for q in queries:
        left = deadline - time.perf_counter()
        if left <= 0 or not q.awaitTermination(max(left, 0.1)):
            finished = False
            break
    wall = time.perf_counter() - t0
    # rows each query has read (progress reports; a rule is done only when its query is)
    processed = min(sum(int(p.get("numInputRows", 0)) for p in q.recentProgress) for q in queries)
    scans = len(rules) if shape == "union" else 1  # each branch of the union scans the Kafka source
    processed //= scans
    for q in queries:
        if q.isActive:
            q.stop()
    errors = [str(q.exception()) for q in queries if q.exception() is not None]
    steady = [_steady(q.recentProgress, scans) for q in queries]
    return {
        "seconds": wall,
        "finished": finished and not errors,
        "errors": errors,
        "processed": processed,
        # the slowest query's rate from the end of its first micro-batch to the end of its last
        "steady_events_per_s": None if None in steady else min(steady),  # type: ignore[type-var]
        "batches": max(len(q.recentProgress) for q in queries),
        # each finished micro-batch's wall time (the first query's): with too few batches for a
        # steady rate, rows / these give the rate's other bound
        "batch_seconds": [
            round(float(p["durationMs"]["triggerExecution"]) / 1000.0, 2)
            for p in queries[0].recentProgress
            if int(p.get("numInputRows", 0)) > 0
        ],
    }


def _not_built(seconds: float, why: str) -> dict[str, Any]:
    """The result of a baseline whose query never started (same keys as :func:`run_baseline`)."""
    return {
        "seconds": seconds,
        "finished": False,
        "errors": [why],
        "processed": 0,
        "steady_events_per_s": None,
        "batches": 0,
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
    ap.add_argument("--shape", choices=["queries", "union", "onescan"], default="queries")
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
