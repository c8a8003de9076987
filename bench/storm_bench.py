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

Old against new, side by side (each tree's own code; the bench file is the same)::

    bench/ab_trees.sh <old commit> 2 bench/storm_bench.py --rules 1000 --keys 5000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", type=int, default=1000)
    ap.add_argument("--keys", type=int, default=5000)
    ap.add_argument("--events-per-s", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=16, help="batches (one per second of event time)")
    ap.add_argument("--warm", type=int, default=6, help="batches not timed (the windows fill)")
    a = ap.parse_args()

    from bench.overload_bench import records
    from engine.core import EngineCore
    from engine.evaluation.evaluator import Evaluator
    from engine.messages import SubscriptionChange
    from engine.rule_evaluator import rule_compiler
    from engine.sinks.alert_columns import AlertColumns
    from tidewatch.settings import get_settings

    s = get_settings()
    pane = 1000
    core = EngineCore(
        pane_ms=pane,
        allowed_lateness_ms=0,
        max_future_ms=10**13,
        evaluator_factory=lambda: Evaluator("shared", ci_p=s.ci_p, pane_ms=pane),
        compile_rule=rule_compiler(s),
    )
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
    core.process(0, {"trades": records(cols, 0, 0)}, rules)
    per = a.events_per_s
    batches = [records(cols, i * per, (i + 1) * per) for i in range(a.seconds)]
    alerts, core_s, cols_s = 0, 0.0, 0.0
    for b, recs in enumerate(batches):
        t0 = time.process_time()
        out = core.process(b + 1, {"trades": recs}, [])
        t1 = time.process_time()
        if len(out.alerts):
            c = AlertColumns.of(out.alerts)
            c.ids, c.subscription_uuid_text, c.values_json, c.value_floats, c.present  # noqa: B018
        t2 = time.process_time()
        if b >= a.warm:
            alerts += len(out.alerts)
            core_s += t1 - t0
            cols_s += t2 - t1
    per_alert = 1e6 / max(alerts, 1)
    print(
        f"storm: {a.rules:,} rules, {a.keys:,} keys, {a.seconds - a.warm} timed batches, {alerts:,} alerts "
        f"({alerts / max(a.seconds - a.warm, 1):,.0f} per lookup); CPU core {core_s:.2f} s = "
        f"{core_s * per_alert:.2f} µs per alert, columns {cols_s:.2f} s = {cols_s * per_alert:.2f} µs per alert, "
        f"both {(core_s + cols_s) * per_alert:.2f} µs per alert",
        flush=True,
    )


if __name__ == "__main__":
    main()
