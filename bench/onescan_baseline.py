"""The one-scan plain-Spark baseline: the rules as a broadcast table, one ``groupBy``.

What a Spark expert writes for N threshold rules (issue #19, "Figures"), beside the per-rule
shapes of :mod:`bench.spark_baseline` (which scan and decode Kafka once per rule):

* Kafka is read and Avro-decoded ONCE (Spark's connector, ``from_avro``);
* the rules are a small static table, broadcast and cross-joined to the events: one row per
  (event, aggregation, window the event falls in) -- the windows of a sliding window of length
  W and slide S that contain ``t`` are those ending at ``(floor(t / S) - k) * S + W`` for
  ``k = 0 .. W/S - 1`` (the windows Spark's ``window(t, W, S)`` gives);
* ONE streaming ``groupBy(aggregation, symbol, window end)`` with ``sum``, then the HAVING of
  every rule, in update mode.  Rules with the same aggregation (COUNT or SUM(size)) and window
  share one group (``share``, the default; the rules of ``make_rules`` have at most 60 distinct
  ones): the sum is computed once and exploded to its rules after the aggregation, where rows
  are few.  ``share=False`` groups by rule, ``groupBy(rule, symbol, window)`` literally.

Alerts: the rows ``(rule, symbol, start, end, v)`` with ``v`` = COUNT or SUM over
``[start, end)`` above the rule's threshold -- the same rows as the per-rule baseline's (checked
by ``tests/bench/test_onescan_baseline.py``).  State is evicted by a watermark on the window end
(``max(window end) - (longest window + 5 s)`` = the start of the newest slide - 5 s): at most
one slide later than the per-rule baseline's (``max(t) - 5 s`` against the window end), so the
two give the same rows unless an event is more than 5 s late.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.spark_baseline import ThresholdRule


def aggregation_specs(
    rules: list[ThresholdRule], share: bool = True
) -> tuple[list[tuple[int, str | None]], list[list[tuple[int, float]]]]:
    """The distinct ``(window_s, field)`` aggregations of ``rules`` and, for each, the
    ``(rule number, threshold)`` of the rules that use it (one aggregation per rule when not
    ``share``)."""
    specs: list[tuple[int, str | None]] = []
    members: list[list[tuple[int, float]]] = []
    index: dict[tuple[int, str | None], int] = {}
    for i, r in enumerate(rules):
        key = (r.window_s, r.field)
        if share and key in index:
            members[index[key]].append((i, r.threshold))
            continue
        index[key] = len(specs)
        specs.append(key)
        members.append([(i, r.threshold)])
    return specs, members


def onescan_frame(ev: Any, rules: list[ThresholdRule], slide_s: int, *, share: bool = True) -> Any:
    """The alert rows ``(rule, symbol, start, end, v)`` of ``rules`` over ``ev`` (a streaming or
    static DataFrame with ``t`` TIMESTAMP, ``symbol``, ``size``; no watermark of its own), with
    windows sliding by ``slide_s`` (every rule's window must be a multiple of it)."""
    from pyspark.sql import functions as F

    bad = [r.name for r in rules if r.window_s % slide_s]
    if bad:
        raise ValueError(f"windows of {bad[:5]} are not multiples of the slide {slide_s} s")
    specs, members = aggregation_specs(rules, share)
    slide_ms = slide_s * 1000
    # the broadcast table: one row per (aggregation, k-th window containing an event)
    table = ev.sparkSession.createDataFrame(
        [(s, k, int(f is not None), w * 1000) for s, (w, f) in enumerate(specs) for k in range(w // slide_s)],
        "spec INT, k INT, is_sum INT, w_ms BIGINT",
    )
    pane = F.expr(f"unix_millis(t) div {slide_ms}")
    x = ev.select("symbol", pane.alias("pane"), F.col("size").cast("double").alias("size"))
    rows = x.crossJoin(F.broadcast(table)).select(
        "spec",
        "symbol",
        F.timestamp_millis((F.col("pane") - F.col("k")) * slide_ms + F.col("w_ms")).alias("wend"),
        F.when(F.col("is_sum") == 1, F.col("size")).otherwise(F.lit(1.0)).alias("x"),
    )
    longest = max(w for w, _ in specs)
    agg = (
        rows.withWatermark("wend", f"{longest + 5} seconds")
        .groupBy("spec", "symbol", "wend")
        .agg(F.sum("x").alias("v"))
    )
    lowest = F.create_map(
        *[c for s, m in enumerate(members) for c in (F.lit(s), F.lit(min(t for _, t in m)))]
    )
    length = F.create_map(*[c for s, (w, _) in enumerate(specs) for c in (F.lit(s), F.lit(w * 1000))])
    to_rules = F.create_map(
        *[
            c
            for s, m in enumerate(members)
            for c in (
                F.lit(s),
                F.array(*[F.struct(F.lit(i).alias("rule"), F.lit(t).alias("thr")) for i, t in m]),
            )
        ]
    )
    return (
        agg.where(F.col("v") > lowest[F.col("spec")])
        .select("spec", "symbol", "wend", "v", F.explode(to_rules[F.col("spec")]).alias("r"))
        .where(F.col("v") > F.col("r.thr"))
        .select(
            F.col("r.rule").alias("rule"),
            "symbol",
            F.timestamp_millis(F.unix_millis("wend") - length[F.col("spec")]).alias("start"),
            F.col("wend").alias("end"),
            "v",
        )
    )
