"""An alert storm through the engine's core: CPU µs per alert of the evaluation and of the
sinks' columns (issue #22, "no per-alert Python anywhere").

``--rules`` COUNT threshold rules (windows of 2-4 s, thresholds 3-9) over ``--keys`` symbols fed
uniformly, so at every 1 s lookup a large share of the (rule, key) pairs enter or leave the
rules' results: the storm of a market-wide move, every lookup.  The driver's core
(:meth:`engine.core.EngineCore.process`, the code the engine runs per batch) takes one batch of
Kafka records per second of event time; after ``--warm`` batches (the windows filled), each batch
is timed: the core's ``process`` (evaluation, result-set changes, alert values) and the columns
both sinks read (:meth:`engine.sinks.alert_columns.AlertColumns.of` and the derived columns the
``COPY`` and the Avro kernel use).  Printed: alerts, seconds and µs per alert of each part.

With ``--shards N`` the batches go through the sharded path instead (issue #23, what the Spark
tasks and the driver run, without Spark): routed (:func:`engine.shards.route.route_records`), each
shard's core runs its part (:func:`engine.shards.step.run_shard`) and encodes its output for the
driver; the driver decodes the N outputs, merges them (:func:`engine.shards.step.merge_outputs`)
and makes the sinks' columns.  Printed: the shards' CPU and the driver's, µs per alert.

Old against new, side by side (each tree's own code; the bench file is the same)::

    bench/ab_trees.sh <old commit> 2 bench/storm_bench.py --rules 1000 --keys 5000
    bench/ab_trees.sh <old commit> 2 bench/storm_bench.py --rules 1000 --keys 5000 --shards 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def make_core(pane: int) -> Any:
    """A driver core of the default settings' evaluator, no lateness, no future bound."""
    from engine.core import EngineCore
    from engine.evaluation.evaluator import Evaluator
    from engine.rule_evaluator import rule_compiler
    from tidewatch.settings import get_settings

    s = get_settings()
    return EngineCore(
        pane_ms=pane,
        allowed_lateness_ms=0,
        max_future_ms=10**13,
        evaluator_factory=lambda: Evaluator("shared", ci_p=s.ci_p, pane_ms=pane),
        compile_rule=rule_compiler(s),
    )


def columns_of(out: Any) -> None:
    """The columns both sinks read of a batch's alerts (what the delivery makes first)."""
    from engine.sinks.alert_columns import AlertColumns

    if len(out.alerts):
        c = AlertColumns.of(out.alerts)
        c.ids, c.subscription_uuid_text, c.values_json, c.value_floats, c.present  # noqa: B018


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", type=int, default=1000)
    ap.add_argument("--keys", type=int, default=5000)
    ap.add_argument("--events-per-s", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=16, help="batches (one per second of event time)")
    ap.add_argument("--warm", type=int, default=6, help="batches not timed (the windows fill)")
    ap.add_argument("--shards", type=int, default=0, help="N > 0: the sharded path with N shards")
    a = ap.parse_args()

    from bench.overload_bench import records
    from engine.messages import SubscriptionChange

    pane = 1000
    core = make_core(pane)
    rules = [
        SubscriptionChange(
            f"r{i}", "upsert", f"r{i}",
            f"SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST {2 + i % 3} SECONDS > {3 + i % 7}",
        )
        for i in range(a.rules)
    ]  # fmt: skip
    rng = np.random.default_rng(1)
    n = a.events_per_s * a.seconds
    cols = {
        "symbol": np.array([f"S{i}" for i in rng.integers(0, a.keys, n)], dtype=object),
        "ts": (1_700_000_000_000 + np.sort(rng.integers(0, a.seconds * 1000, n))).astype(np.int64),
        "price": np.round(rng.uniform(30, 80, n), 2),
        "size": rng.integers(0, 100, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n),
        "exchange": np.array(["NASDAQ"] * n, dtype=object),
    }
    per = a.events_per_s
    batches = [records(cols, i * per, (i + 1) * per) for i in range(a.seconds)]
    if a.shards > 0:
        return sharded(a, pane, rules, cols, batches)
    core.process(0, {"trades": records(cols, 0, 0)}, rules)

    def step(b: int, recs: Any) -> tuple[Any, list[float]]:
        t0 = time.process_time()
        out = core.process(b, {"trades": recs}, [])
        t1 = time.process_time()
        columns_of(out)
        return out, [t1 - t0, time.process_time() - t1]

    measure(a, batches, step, "storm", ["core", "columns"], "both")


def measure(
    a: argparse.Namespace, batches: list[Any], step: Any, title: str, parts: list[str], last2: str
) -> None:
    """Run ``step(batch id, records) -> (output, CPU seconds of each part)`` on every batch and
    print the parts' CPU per alert over the batches after ``a.warm``, and of the last two parts
    together as ``last2``."""
    alerts, cpu = 0, [0.0] * len(parts)
    for b, recs in enumerate(batches):
        out, took = step(b + 1, recs)
        if b >= a.warm:
            alerts += len(out.alerts)
            cpu = [x + y for x, y in zip(cpu, took, strict=True)]
    per_alert = 1e6 / max(alerts, 1)
    each = ", ".join(
        f"{p} {c:.2f} s = {c * per_alert:.2f} µs per alert" for p, c in zip(parts, cpu, strict=True)
    )
    print(
        f"{title}: {a.rules:,} rules, {a.keys:,} keys, {a.seconds - a.warm} timed batches, {alerts:,} alerts "
        f"({alerts / max(a.seconds - a.warm, 1):,.0f} per lookup); CPU {each}; {last2} "
        f"{sum(cpu[-2:]) * per_alert:.2f} µs per alert",
        flush=True,
    )


def sharded(
    a: argparse.Namespace, pane: int, rules: list[Any], cols: dict[str, Any], batches: list[Any]
) -> None:
    """The storm through ``a.shards`` shard cores and the driver's decode, merge and columns."""
    import pyarrow as pa

    from engine.shards.route import merge_spans, route_records
    from engine.shards.step import decode_output, encode_output, merge_outputs, meta_of, run_shard

    topics = {"trades": "trades", "packets": "packets", "subscriptions": "subscriptions"}
    cores = [make_core(pane) for _ in range(a.shards)]
    keys = pa.array([str(k).encode() for k in cols["symbol"]], pa.binary())
    for c in cores:
        c.process(0, {"trades": batches[0].slice(0, 0)}, rules)

    def step(b: int, recs: Any) -> tuple[Any, list[float]]:
        lo = int(recs.column("offset")[0].as_py())
        full = recs.append_column("topic", pa.array(["trades"] * len(recs), pa.string()))
        full = full.append_column("timestamp", pa.array(np.zeros(len(recs), np.int64)))
        full = full.append_column("key", keys.slice(lo, len(recs)))
        t0 = time.process_time()
        tables, span_t = route_records(full, topics, a.shards, 10**13)
        span = merge_spans([span_t])
        wire = []
        for i, c in enumerate(cores):
            out = run_shard(c, b, i, a.shards, tables[i], span, topics)
            wire.append(encode_output(out, meta_of(c, i, b, 0.0, "live", 0)))
        t1 = time.process_time()
        merged = merge_outputs(b, [decode_output(w)[0] for w in wire])
        t2 = time.process_time()
        columns_of(merged)
        return merged, [t1 - t0, t2 - t1, time.process_time() - t2]

    parts = ["shards (route, core, encode)", "driver: decode + merge", "driver: columns"]
    measure(a, batches, step, f"storm, {a.shards} shards", parts, "the driver, both")


if __name__ == "__main__":
    main()
