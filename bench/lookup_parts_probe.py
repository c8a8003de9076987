"""CPU time of a lookup's parts in the driver core: ``--rules`` mixed rules (the live bench's
``make_mixed_rules``) over 5,000 symbols fed 50,000 trades per second of event time, one batch and
one lookup per second; after the first half of the batches (the windows filling), each part's
CPU time per lookup (the thread's: ``time.thread_time``, so another load on the machine does not
count): the evaluator's ``step`` (the collective index), the alerts' values
(``Evaluator.value_columns``), ``EngineCore._emit`` (values and blocks), ``EngineCore._lookup_at``
(all of a lookup) and ``EngineCore.process`` (the batch: decode, apply, lookups).

    .venv/bin/python bench/lookup_parts_probe.py --rules 10000 --seconds 40
    bench/ab_trees.sh <old commit> 2 bench/lookup_parts_probe.py --rules 10000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: the parts timed: (class path, method)
PARTS = (
    ("engine.evaluation.evaluator.Evaluator", "step"),
    ("engine.evaluation.evaluator.Evaluator", "value_columns"),
    ("engine.core.EngineCore", "_emit"),
    ("engine.core.EngineCore", "_lookup_at"),
    ("engine.core.EngineCore", "process"),
)


def _timed(acc: dict[str, float]) -> None:
    """Wrap each part so its CPU time (the thread's) adds up in ``acc[name]``."""
    import importlib

    for path, name in PARTS:
        mod, cls_name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(mod), cls_name)
        f = getattr(cls, name)

        def w(*a: Any, _f: Any = f, _n: str = name, **k: Any) -> Any:
            t = time.thread_time()
            try:
                return _f(*a, **k)
            finally:
                acc[_n] = acc.get(_n, 0.0) + time.thread_time() - t

        setattr(cls, name, w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=40, help="batches (one per second of event time)")
    ap.add_argument("--events-per-s", type=int, default=50_000)
    a = ap.parse_args()

    from engine_bench import make_mixed_rules, make_trades

    from bench.overload_bench import records
    from bench.storm_bench import make_core
    from engine.messages import SubscriptionChange
    from engine.runtime.gc_tuning import tune_gc
    from tidewatch.settings import get_settings

    tune_gc(get_settings().engine_gc_threshold)  # as the engine runs
    acc: dict[str, float] = {}
    _timed(acc)
    per, n_batches = a.events_per_s, a.seconds
    core = make_core(1000)
    sample = make_trades(per * n_batches, 5000, per, seed=3)
    texts = make_mixed_rules(a.rules, "trades", sample, n_batches)
    rules = [SubscriptionChange(f"r{i}", "upsert", f"r{i}", t) for i, t in enumerate(texts)]
    cols = {k: sample[k] for k in ("symbol", "ts", "price", "size", "side", "exchange")}
    core.process(0, {"trades": records(cols, 0, 0)}, rules)
    alerts, warm = 0, n_batches // 2
    for b in range(n_batches):
        if b == warm:
            acc.clear()
        out = core.process(b + 1, {"trades": records(cols, b * per, (b + 1) * per)}, [])
        if b >= warm:
            alerts += len(out.alerts)
    n = n_batches - warm
    print(
        f"lookup parts: {a.rules:,} rules, {alerts / n:,.0f} alerts per lookup; ms per lookup: "
        + ", ".join(f"{name} {acc.get(name, 0.0) / n * 1000:.1f}" for _, name in PARTS),
        flush=True,
    )


if __name__ == "__main__":
    main()
