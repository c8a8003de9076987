"""The one-scan plain-Spark baseline gives the per-rule baseline's alert rows.

On a static frame (unit: the ``spark`` fixture, no services) and on a Kafka topic drained by
both as streaming queries (integration): the rows ``(rule, symbol, start, end, v)`` of
``bench.onescan_baseline.onescan_frame`` (shared aggregations and one per rule) equal those of
``bench.spark_baseline``'s ``union`` and ``queries`` shapes.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import numpy as np
import pytest

from bench.onescan_baseline import aggregation_specs, onescan_frame
from bench.spark_baseline import ThresholdRule, make_rules, rule_frame, run_baseline, union_frame

RULES = [
    ThresholdRule("a", 60, None, 3),
    ThresholdRule("b", 120, "size", 900),
    ThresholdRule("c", 180, None, 6),
    ThresholdRule("d", 120, "size", 1500),  # shares b's aggregation
    ThresholdRule("e", 120, None, 4),
]


def _rows(frame: Any) -> set[tuple[Any, ...]]:
    return {(r["rule"], r["symbol"], r["start"], r["end"], r["v"]) for r in frame.collect()}


def _static_events(spark: Any, n: int = 3000, seed: int = 7) -> Any:
    rng = np.random.default_rng(seed)
    t0 = dt.datetime(2026, 11, 25, 8, 0, 0, tzinfo=dt.UTC)
    ms = np.sort(rng.integers(0, 10 * 60_000, n))
    data = [
        (t0 + dt.timedelta(milliseconds=int(m)), f"S{int(s)}", int(z))
        for m, s, z in zip(ms, rng.zipf(1.5, n) % 6, rng.integers(1, 100, n), strict=True)
    ]
    return spark.createDataFrame(data, "t TIMESTAMP, symbol STRING, size BIGINT")


def test_aggregation_specs_share_equal_window_and_field() -> None:
    specs, members = aggregation_specs(RULES)
    assert specs == [(60, None), (120, "size"), (180, None), (120, None)]
    assert members[1] == [(1, 900.0), (3, 1500.0)]
    alone, _ = aggregation_specs(RULES, share=False)
    assert len(alone) == len(RULES)


def test_onescan_rejects_a_window_not_multiple_of_the_slide(spark: Any) -> None:
    with pytest.raises(ValueError, match="multiples"):
        onescan_frame(_static_events(spark, 10), [ThresholdRule("x", 90, None, 1)], 60)


def test_onescan_equals_per_rule_on_a_static_frame(spark: Any) -> None:
    ev = _static_events(spark)
    union = _rows(union_frame(ev, RULES, 60))
    per_rule: set[tuple[Any, ...]] = set()
    for i, r in enumerate(RULES):
        per_rule |= _rows(rule_frame(ev, i, r, 60))
    shared = _rows(onescan_frame(ev, RULES, 60))
    alone = _rows(onescan_frame(ev, RULES, 60, share=False))
    assert len(union) > 50 and {row[0] for row in union} == set(range(len(RULES)))
    assert shared == union
    assert alone == union
    assert per_rule == union


def _final(spark: Any, table: str) -> set[tuple[Any, ...]]:
    """The last value of every alert row an update-mode query emitted (sums only grow)."""
    got: dict[tuple[Any, ...], float] = {}
    for r in spark.table(table).collect():
        key = (r["rule"], r["symbol"], r["start"], r["end"])
        got[key] = max(got.get(key, 0.0), r["v"])
    return {(*k, v) for k, v in got.items()}


@pytest.mark.integration
def test_onescan_equals_union_streaming_from_kafka(spark: Any, kafka_bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from bench.engine_bench import make_trades, produce

    topic = f"onescan-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    cols = make_trades(12_000, 50, rate=40.0)  # 300 s of event time: several 1-minute slides
    produce(kafka_bootstrap, topic, cols)
    rules = make_rules(12, data=cols, ranks=(2, 10))
    rules = [ThresholdRule(r.name, min(r.window_s, 180), r.field, r.threshold / 10) for r in rules]
    prefix = f"q{uuid.uuid4().hex[:6]}_"
    out = {}
    for shape in ("union", "onescan"):
        res = run_baseline(
            spark, kafka_bootstrap, topic, rules, slide_s=60, shape=shape, max_offsets=3000,
            timeout_s=240, sink="memory", query_prefix=prefix,
        )  # fmt: skip
        assert res["finished"], res
        assert res["processed"] == 12_000
        assert res["batches"] >= 4
        out[shape] = _final(spark, f"{prefix}{shape}")
    assert len(out["union"]) > 20
    assert out["onescan"] == out["union"]
