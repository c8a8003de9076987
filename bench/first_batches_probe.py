"""The driver's first batches with and without its warm-up (engine.runtime.driver_warmup).

Each side runs in a fresh interpreter (what the warm-up changes is what a process has loaded):
a core of the default settings subscribes ``--rules`` rules of the live bench's mix
(``engine_bench.make_mixed_rules``: COUNT / SUM thresholds with AVG / MIN / MAX conditions,
windows of 1 minute to 3 hours), then takes ``--batches`` batches of ``--events`` trades each
(the live run's 50,000 trades/s at a 0.5 s trigger: 25,000; its 500 ms lateness, so lookups
from the second batch on) through the engine's mode's path --
in executors mode the executors' pure function run in the process and merged, as a replay does.
Printed per side: the warm-up's seconds (before the first batch, where the engine pays it), then
each batch's seconds (the driver's evaluation, lookups and alerts' values included); at the end,
per side, the medians over runs of the first batch, of the first batch that ran a lookup (made
alerts) and of the lookup batches after it.  The two
sides alternate ``--repeat`` times::

    .venv/bin/python bench/first_batches_probe.py --rules 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sides import alternate  # noqa: E402


def side(a: argparse.Namespace) -> None:
    """One side, in this (fresh) interpreter: JSON of the warm-up's and each batch's seconds."""
    from bench.engine_bench import make_events, make_mixed_rules
    from engine.core import default_core
    from engine.executors.warmup import kafka_records_of
    from engine.messages import SubscriptionChange
    from engine.runtime.driver_warmup import read_alerts, warm_batch, warm_driver
    from tidewatch.settings import get_settings

    s = get_settings().model_copy(update={"allowed_lateness_ms": a.lateness_ms})
    topics = {"trades": s.topic_trades}
    executors = s.engine_preaggregate == "executors"
    rate = a.events / a.trigger
    now = int(time.time() * 1000)
    sample = make_events("trades", int(rate * 60), a.keys, rate, now, seed=99)
    rules = [
        SubscriptionChange(f"r{i}", "upsert", f"m{i}", text)
        for i, text in enumerate(make_mixed_rules(a.rules, "trades", sample, 60))
    ]
    ev = make_events("trades", a.events * a.batches, a.keys, rate, now, seed=1)
    warm = warm_driver(lambda: default_core(s), topics, executors=executors)[0] if a.warm else 0.0
    core = default_core(s)
    out = {"warm_up_s": warm, "batches_s": [], "alerts": []}
    for b in range(a.batches + 1):
        lo, hi = (b - 1) * a.events, b * a.events
        recs = kafka_records_of(topics["trades"], "trades", {k: v[lo:hi] for k, v in ev.items()}, lo)
        recs = recs if b else recs.slice(0, 0)
        t0 = time.perf_counter()
        res = warm_batch(core, b, recs, topics, rules if b == 0 else [], executors=executors)
        read_alerts(res)
        if b:
            out["batches_s"].append(time.perf_counter() - t0)
            out["alerts"].append(len(res.alerts))
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=5_000)
    ap.add_argument("--events", type=int, default=25_000, help="trades per batch")
    ap.add_argument("--trigger", type=float, default=0.5, help="seconds of event time per batch")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument(
        "--lateness-ms", type=int, default=500, help="the live run's (lookups from the 2nd batch on)"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--side", choices=["warm", "cold"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        a.warm = a.side == "warm"
        return side(a)
    args = [f"--rules={a.rules}", f"--keys={a.keys}", f"--events={a.events}", f"--trigger={a.trigger}",
            f"--batches={a.batches}", f"--lateness-ms={a.lateness_ms}"]  # fmt: skip
    got = alternate(
        __file__, args, ("cold", "warm"), a.repeat,
        lambda d: f"warm-up {d['warm_up_s']:.2f} s; batches (s): " + " ".join(f"{x:.2f}" for x in d["batches_s"]),
    )  # fmt: skip
    for name, runs in got.items():
        firsts, lookups, later = [], [], []
        for d in runs:
            looked = [i for i, n in enumerate(d["alerts"]) if n]  # the batches that ran a lookup
            firsts.append(d["batches_s"][0])
            if looked:
                lookups.append(d["batches_s"][looked[0]])
                later += [d["batches_s"][i] for i in looked[1:]]
        print(
            f"{name}: first batch {statistics.median(firsts):.2f} s, first batch with a lookup "
            f"{statistics.median(lookups) if lookups else float('nan'):.2f} s (medians of runs), "
            f"the lookup batches after it {statistics.median(later) if later else float('nan'):.2f} s"
        )


if __name__ == "__main__":
    main()
