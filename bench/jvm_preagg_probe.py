"""Probe (issue #4): how fast Spark delivers a batch of trades to the Python driver, by path.

Batch reads (``spark.read``) of the same Kafka ``trades`` topic on one warm SparkSession
(:func:`engine.spark_session.build_spark`, ``local[2]``), each variant run ``--repeat`` times
after ``--warmup`` untimed rounds, the variants interleaved per repetition:

* ``k``  -- the ceiling of any JVM path: the Kafka read alone in the JVM, nothing to Python
  (one row out: ``count`` and ``sum(length(value))``);
* ``a``  -- today's engine path: the raw records (``engine.sources.readers.RECORD_COLUMNS``) ``toArrow()``;
  the driver's decode (:func:`engine.decode.decode_records`) + pre-aggregation
  (:func:`engine.evaluation.panes.aggregate`) of the same table is timed after it (``a+driver``);
* ``b``  -- ``from_avro`` in the JVM (spark-avro, after checking the 5-byte frame) + the
  engine's validity checks + ``groupBy(symbol, pane = ceil(ts/1000)*1000)`` with COUNT,
  SUM(size), the exact SUM(price) as ``sum(cast(price * 2^60 as decimal(38,0)))``, MIN/MAX(price)
  and FIRST/LAST(price) in arrival order (``min_by`` / ``max_by`` over ``(ts, partition, offset)``);
  ``toArrow()`` of the pane rows;
* ``bw`` -- ``b`` with the exact SUM(price) as two BIGINT sums of the words of
  ``rint(price * 2^60) = hi * 2^32 + lo`` (exact for ``|price| < 2^31``), combined on the driver;
* ``bl`` -- ``bw`` without FIRST/LAST (what ``min_by`` / ``max_by`` cost);
* ``bn`` -- ``bw`` written the naive way: ``from_avro`` evaluated once per field reference
  (see :func:`jvm_panes`); ``b``, ``bw`` and ``bl`` decode once;
* ``c``  -- ``mapInArrow`` in the executors running the driver's code (``decode_records`` +
  ``panes.aggregate`` of each task's whole input) and returning pane rows plus dead letters;
  ``toArrow()`` of those.

records/s = Kafka records read / wall seconds of the action (from building the DataFrame to
the Arrow table in the driver).  Checks (printed): the pane rows of ``b``, ``bw``, ``bl`` and
``c`` equal the driver's (``a+driver``) in COUNT, SUM(size), MIN, MAX, FIRST, LAST; the exact
sums of ``b`` and ``bw`` against ``round(price * 2^60)`` summed as Python integers; and
Spark's ``cast(double * 2^60 as decimal(38,0))`` against the exact integer, per distinct price.

Needs Kafka (``tidewatch up --services-only``); the topic is made and filled with the engine
bench's producer when it holds fewer than ``--events`` records::

    flock /tmp/tidewatch-heavy.lock .venv/bin/python bench/jvm_preagg_probe.py --events 2000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import make_trades, produce, run_settings  # noqa: E402
from engine.dead_letter import DeadLetters  # noqa: E402
from engine.decode import decode_records  # noqa: E402
from engine.evaluation.panes import ColumnSet, PaneSpec, aggregate  # noqa: E402
from engine.sources.readers import RECORD_COLUMNS  # noqa: E402

SCALE = 2**60
WORD = 2**32
SPEC = PaneSpec(
    "symbol", (ColumnSet("all", sums=("size", "price"), minmax=("price",), firstlast=("price",)),)
)
VARIANTS = ("k", "a", "b", "bw", "bl", "bn", "c")
PANE_SCHEMA = pa.schema(
    [
        ("symbol", pa.string()),
        ("pane", pa.int64()),
        ("n", pa.int64()),
        ("sum_size", pa.float64()),
        ("sum_price", pa.float64()),
        ("min_price", pa.float64()),
        ("max_price", pa.float64()),
        ("first_price", pa.float64()),
        ("last_price", pa.float64()),
        # dead letters ride in the same output: reason set, pane columns null
        ("dl_reason", pa.string()),
        ("dl_partition", pa.int32()),
        ("dl_offset", pa.int64()),
        ("dl_value", pa.binary()),
    ]
)


def topic_records(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` (sum over partitions of high - low watermark; 0 if missing)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "jvm-preagg-probe"})
    try:
        meta = c.list_topics(topic, timeout=30).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        n = 0
        for p in meta.partitions:
            for attempt in range(60):  # a topic just created has no leader for a moment
                try:
                    lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                    break
                except KafkaException:
                    if attempt == 59:
                        raise
                    time.sleep(0.5)
            n += hi - lo
        return n
    finally:
        c.close()


def ensure_trades(base: Any, bootstrap: str, run: str, n: int, symbols: int) -> tuple[Any, int]:
    """Settings with the probe's topics (created like the engine bench's) and the trades topic
    holding at least ``n`` records (produced with the engine bench's producer when fewer)."""
    from engine.sinks.publish import ensure_topics

    settings = run_settings(base, "probe", run)
    shutil.rmtree(settings.checkpoint_dir, ignore_errors=True)  # a probe has no engine checkpoint
    ensure_topics(bootstrap, settings)
    have = topic_records(bootstrap, settings.topic_trades)
    if have < n:
        t = produce(bootstrap, settings.topic_trades, make_trades(n - have, symbols, 50_000.0))
        print(f"produced {n - have:,} trades into {settings.topic_trades} in {t:.1f} s", flush=True)
        have = topic_records(bootstrap, settings.topic_trades)
    return settings, have


def kafka_df(spark: Any, bootstrap: str, topic: str, options: dict[str, str] | None = None) -> Any:
    """The whole topic, read like the engine reads it (read_committed), plus ``options``."""
    return (
        spark.read.format("kafka")
        .options(**(options or {}))
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )


# ---------------------------------------------------------------- (b): the JVM pre-aggregates
def jvm_panes(raw: Any, max_future_ms: int, words: bool, firstlast: bool, once: bool = True) -> Any:
    """``from_avro`` + the engine's validity checks + groupBy(symbol, pane) in the JVM.

    ``once``: the decoded record is produced by a generator (``inline(array(struct(...)))``), a
    barrier the optimizer does not collapse; without it (``select(from_avro(..) as r)`` then
    ``r.*``, as ``bench/spark_baseline.py`` writes it) the plan evaluates ``from_avro`` once per
    reference to a field of ``r`` -- five times per record here (four in the filter, one in the
    projection, seen in ``explain()``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from tidewatch.wire.avro import header, load_schema_json, schema_id

    frame_ok = F.expr("substring(value, 1, 5)") == F.lit(header(schema_id("trades")))
    rec = from_avro(F.expr("substring(value, 6)"), load_schema_json("trades"), {"mode": "PERMISSIVE"})
    cols = [F.col("partition"), F.col("offset"), F.unix_millis("timestamp").alias("kts")]
    decoded = F.when(frame_ok, rec).alias("r")
    if once:
        ev = raw.select(F.inline(F.array(F.struct(*cols, decoded))))
    else:
        ev = raw.select(*cols, decoded)
    ev = ev.select("partition", "offset", "kts", "r.*")
    ms = F.unix_millis("ts")
    valid = (
        F.col("symbol").isNotNull()  # undecodable (bad frame or body) -> null record
        & (F.col("symbol") != "")
        & (F.col("size") >= 0)
        & ~F.isnan("price")
        & (F.abs("price") != F.lit(float("inf")))
        & (ms <= F.col("kts") + max_future_ms)
    )
    ev = ev.where(valid).select(
        "symbol",
        "price",
        "size",
        "partition",
        "offset",
        ms.alias("ms"),
        (ms + F.pmod(-ms, F.lit(1000))).alias("pane"),
    )
    aggs = [F.count(F.lit(1)).alias("n"), F.sum("size").alias("sum_size")]
    if words:
        x = F.rint(F.col("price") * float(SCALE))
        hi = F.floor(x / float(WORD))
        aggs += [
            F.sum(hi.cast("bigint")).alias("fx_hi"),
            F.sum((x - hi * float(WORD)).cast("bigint")).alias("fx_lo"),
        ]
    else:
        aggs.append(F.sum(F.expr(f"cast(price * {SCALE}D as decimal(38,0))")).alias("fx"))
    aggs += [F.min("price").alias("min_price"), F.max("price").alias("max_price")]
    if firstlast:
        order = F.struct("ms", "partition", "offset")
        aggs += [F.min_by("price", order).alias("first_price"), F.max_by("price", order).alias("last_price")]
    return ev.groupBy("symbol", "pane").agg(*aggs)


# ---------------------------------------------------------------- (c): NumPy in the executors
def executor_preagg(max_future_ms: int, pane_ms: int) -> Any:
    """The ``mapInArrow`` function: the driver's decode + pre-aggregation of a task's records."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tbl = pa.Table.from_batches(list(batches))
        if tbl.num_rows == 0:
            return
        dead = DeadLetters()
        d = decode_records("trades", tbl, late_until=None, max_future_ms=max_future_ms, dead=dead)
        rows = aggregate(d.columns, SPEC, pane_ms)
        agg = rows.sets["all"]
        n, k = len(rows), len(dead)
        nulls = pa.nulls(n)
        cols: list[Any] = [
            pa.array(rows.keys.tolist(), pa.string()),
            pa.array(rows.pane),
            pa.array(agg.count),
            pa.array(agg.sums["size"]),
            pa.array(agg.sums["price"]),
            pa.array(agg.mins["price"]),
            pa.array(agg.maxs["price"]),
            pa.array(agg.first["price"]),
            pa.array(agg.last["price"]),
        ]
        cols += [nulls.cast(f.type) for f in list(PANE_SCHEMA)[9:]]
        yield pa.RecordBatch.from_arrays(cols, schema=PANE_SCHEMA)
        if k:
            dl = [pa.nulls(k).cast(f.type) for f in list(PANE_SCHEMA)[:9]] + [
                pa.array(dead.reason, pa.string()),
                pa.array(dead.source_partition, pa.int32()),
                pa.array(dead.source_offset, pa.int64()),
                pa.array(dead.value, pa.binary()),
            ]
            yield pa.RecordBatch.from_arrays(dl, schema=PANE_SCHEMA)

    return run


def executor_panes(raw: Any, max_future_ms: int, pane_ms: int) -> Any:
    ddl = (
        "symbol string, pane bigint, n bigint, sum_size double, sum_price double, min_price double, "
        "max_price double, first_price double, last_price double, dl_reason string, dl_partition int, "
        "dl_offset bigint, dl_value binary"
    )
    return raw.select(*RECORD_COLUMNS).mapInArrow(executor_preagg(max_future_ms, pane_ms), ddl)


# ---------------------------------------------------------------- checks
def driver_panes(tbl: pa.Table, max_future_ms: int, pane_ms: int) -> tuple[dict[str, np.ndarray], Any]:
    """The engine's driver-side decode + pre-aggregation; pane columns and the decoded events."""
    d = decode_records("trades", tbl, late_until=None, max_future_ms=max_future_ms, dead=DeadLetters())
    rows = aggregate(d.columns, SPEC, pane_ms)
    agg = rows.sets["all"]
    cols = {
        "symbol": rows.keys.astype(str),
        "pane": rows.pane,
        "n": agg.count,
        "sum_size": agg.sums["size"],
        "min_price": agg.mins["price"],
        "max_price": agg.maxs["price"],
        "first_price": agg.first["price"],
        "last_price": agg.last["price"],
    }
    return cols, d


def exact_sums(d: Any, pane_ms: int) -> dict[tuple[str, int], int]:
    """``sum(round(price * 2^60))`` per (symbol, pane) in Python integers (the reference)."""
    import pandas as pd

    from engine.evaluation.panes import pane_of

    x = np.rint(np.asarray(d.columns["price"], np.float64) * float(SCALE))
    hi = np.floor(x / WORD)
    frame = pd.DataFrame(
        {
            "symbol": d.columns["symbol"],
            "pane": pane_of(d.ts, pane_ms),
            "hi": hi.astype(np.int64),
            "lo": (x - hi * WORD).astype(np.int64),
        }
    )
    g = frame.groupby(["symbol", "pane"], sort=False)[["hi", "lo"]].sum()
    return {
        (s, int(p)): int(h) * WORD + int(lo)
        for (s, p), h, lo in zip(g.index, g["hi"].to_numpy(), g["lo"].to_numpy(), strict=True)
    }


def sorted_cols(tbl: pa.Table | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if isinstance(tbl, pa.Table):
        if "dl_reason" in tbl.column_names:
            import pyarrow.compute as pc

            tbl = tbl.filter(pc.is_null(tbl.column("dl_reason")))
        cols = {c: tbl.column(c).to_numpy(zero_copy_only=False) for c in tbl.column_names}
    else:
        cols = dict(tbl)
    order = np.lexsort((cols["pane"], cols["symbol"].astype(str)))
    return {c: v[order] for c, v in cols.items()}


def compare(name: str, got: pa.Table, ref: dict[str, np.ndarray], exact: dict[tuple[str, int], int]) -> str:
    """One line: does ``got`` equal the driver's pane rows (and the exact sums)?"""
    g, r = sorted_cols(got), sorted_cols(ref)
    if len(g["pane"]) != len(r["pane"]):
        return f"{name}: {len(g['pane']):,} pane rows vs {len(r['pane']):,} on the driver: DIFFERENT"
    bad = []
    for c in ("symbol", "pane", "n", "sum_size", "min_price", "max_price", "first_price", "last_price"):
        if c in g and not np.array_equal(np.asarray(g[c]).astype(r[c].dtype), r[c]):
            bad.append(c)
    line = f"{name}: {len(g['pane']):,} pane rows, " + (
        f"DIFFERENT in {bad}" if bad else "equal to the driver's"
    )
    keys = list(zip(g["symbol"].astype(str).tolist(), g["pane"].tolist(), strict=True))
    if "fx" in g:
        vals = [int(v) for v in g["fx"]]
    elif "fx_hi" in g:
        vals = [int(h) * WORD + int(lo) for h, lo in zip(g["fx_hi"], g["fx_lo"], strict=True)]
    else:
        return line
    wrong = sum(exact[k] != v for k, v in zip(keys, vals, strict=True))
    return line + f"; exact SUM(price): {wrong:,} of {len(vals):,} rows differ from sum(round(price*2^60))"


def check_decimal_cast(spark: Any, prices: np.ndarray) -> str:
    """Spark's ``cast(price * 2^60 as decimal(38,0))`` against the exact integer, per distinct price."""
    from pyspark.sql import functions as F

    uniq = np.unique(prices)
    df = spark.createDataFrame(pa.table({"price": uniq}).to_pandas())
    got = df.select(
        "price",
        F.expr(f"cast(price * {SCALE}D as decimal(38,0))").alias("dec"),
    ).toArrow()
    p = got.column("price").to_numpy()
    dec = [int(v) for v in got.column("dec").to_pylist()]
    exact = [int(v * SCALE) for v in p.tolist()]  # float -> int is exact in Python
    wrong = [(float(a), e, d) for a, e, d in zip(p, exact, dec, strict=True) if e != d]
    ex = (
        f" e.g. price {wrong[0][0]!r}: exact {wrong[0][1]}, Spark {wrong[0][2]} (diff {wrong[0][2] - wrong[0][1]})"
        if wrong
        else ""
    )
    return (
        f"cast(price * 2^60 as decimal(38,0)) over {len(p):,} distinct prices: {len(wrong):,} differ from the "
        f"exact integer{ex}"
    )


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=None, help="Kafka (default: settings.kafka_bootstrap)")
    ap.add_argument("--events", type=int, default=2_000_000, help="records the topic must hold")
    ap.add_argument("--symbols", type=int, default=5000)
    ap.add_argument("--run", default="jvmagg", help="topic suffix (probe-trades-<run>): reused across runs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds of every variant first")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Kafka source option, e.g. kafka.max.partition.fetch.bytes=33554432 (repeatable)",
    )
    a = ap.parse_args()

    from engine.spark_session import build_spark
    from tidewatch.settings import get_settings

    base = get_settings()
    bootstrap = a.bootstrap or base.kafka_bootstrap
    settings, n = ensure_trades(base, bootstrap, a.run, a.events, a.symbols)
    topic, fut, g = settings.topic_trades, settings.max_future_ms, settings.pane_ms
    variants = [v for v in a.variants.split(",") if v]
    print(
        f"topic {topic}: {n:,} records; variants {variants}; {a.repeat} runs each after {a.warmup} warm-up rounds",
        flush=True,
    )
    spark = build_spark(settings, "jvm-preagg-probe")
    print(f"Spark {spark.version}, master {spark.sparkContext.master}", flush=True)

    def build(v: str) -> Any:
        raw = kafka_df(spark, bootstrap, topic, dict(o.split("=", 1) for o in a.option))
        if v == "a":
            return raw.select(*RECORD_COLUMNS)
        if v == "k":
            from pyspark.sql import functions as F

            return raw.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("bytes"))
        if v == "c":
            return executor_panes(raw, fut, g)
        return jvm_panes(raw, fut, words=v != "b", firstlast=v != "bl", once=v != "bn")

    times: dict[str, list[float]] = {v: [] for v in variants}
    driver_s: list[float] = []
    outputs: dict[str, pa.Table] = {}
    loads = []
    try:
        for rep in range(a.warmup + a.repeat):  # warm-up rounds first (JIT, Python workers, Numba)
            for v in variants:
                t0 = time.perf_counter()
                tbl = build(v).toArrow()
                dt = time.perf_counter() - t0
                extra = ""
                if v == "a":
                    t1 = time.perf_counter()
                    driver_panes(tbl, fut, g)
                    dd = time.perf_counter() - t1
                    extra = f", driver decode + panes.aggregate {dd:.2f} s"
                    if rep >= a.warmup:
                        driver_s.append(dd)
                    outputs["a"] = tbl
                else:
                    outputs[v] = tbl
                print(f"  run {rep}{' (warm-up)' if rep < a.warmup else ''} {v}: {tbl.num_rows:,} rows in {dt:.2f} s = "
                      f"{n / dt:,.0f} records/s{extra}", flush=True)  # fmt: skip
                if rep >= a.warmup:
                    times[v].append(dt)
                    loads.append(os.getloadavg()[0])
            if rep == 0 and "a" in outputs:
                # correctness, once: every JVM / executor variant against the driver's pane rows
                ref, decoded = driver_panes(outputs["a"], fut, g)
                exact = exact_sums(decoded, g)
                for v in variants:
                    if v not in ("a", "k"):
                        print("  check", compare(v, outputs[v], ref, exact), flush=True)
                print("  check", check_decimal_cast(spark, decoded.columns["price"]), flush=True)
                del decoded
    finally:
        spark.stop()
    print(f"\n{n:,} Kafka records, local[2], load average during the timed runs "
          f"{min(loads):.1f}-{max(loads):.1f}" if loads else "")  # fmt: skip
    names = {
        "k": "k  Kafka read in the JVM only (ceiling)",
        "a": "a  raw records toArrow (today)",
        "b": "b  from_avro + groupBy, decimal(38,0) exact sum",
        "bw": "bw from_avro + groupBy, exact sum as 2 bigint words",
        "bl": "bl bw without FIRST/LAST (min_by/max_by)",
        "bn": "bn bw with from_avro evaluated per field reference",
        "c": "c  mapInArrow decode + panes.aggregate",
    }
    print(f"{'variant':<52} {'runs (s)':<22} {'records/s (best / median)':>28}")
    for v in variants:
        ts = times[v]
        print(f"{names[v]:<52} {' '.join(f'{t:.2f}' for t in ts):<22} "
              f"{n / min(ts):>13,.0f} / {n / float(np.median(ts)):,.0f}")  # fmt: skip
    if driver_s:
        ta = times["a"]
        tot = [x + y for x, y in zip(ta, driver_s, strict=True)]
        print(f"{'a+ a, then the driver decode + panes.aggregate':<52} {' '.join(f'{t:.2f}' for t in tot):<22} "
              f"{n / min(tot):>13,.0f} / {n / float(np.median(tot)):,.0f}")  # fmt: skip
    print("command:", " ".join(sys.argv))


if __name__ == "__main__":
    main()
