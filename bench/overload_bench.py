"""The overload policy on and off, side by side in one run: a lookup-heavy workload fed faster
than the engine keeps up (docs/engine.md "Overload"; figures in docs/measurements/engine.md).

The workload of ``tests/engine/test_engine_overload.py``, larger: ``--rules`` rules evaluated one by
one (``MAX(price) - MIN(price)`` over a window: no collective index, no group) at a 250 ms lookup
period, half of them with a staleness budget (4 s or 2 s).  The driver's core
(:class:`engine.core.EngineCore`, the code the engine runs per batch) is driven by a simulated live
feed: the events arrive in wall time ``--speed`` times faster than their event time, a micro-batch
starts every ``--trigger`` seconds (or at once when the previous one overran, as Spark's
processing-time trigger does) and takes every event arrived by then; its evaluation is *measured*
(real ``process`` calls, one after the other, on this machine), and after it the controller is fed
its utilisation (:meth:`EngineCore.observe_load`), as :meth:`engine.app.EngineApp._evaluate` does.
Spark, Kafka and PostgreSQL are left out: their per-batch cost is the same with the policy on and
off, and a bench that shares 2 cores with them would measure them.

A lookup time's latency = when the batch that looked up at it ended - when that lookup became
possible (the arrival of the events at its lookup time plus the allowed lateness): the latency of
any alert of an undegraded subscription there (they are looked up at every lookup time), reported
p50 / p99 / max over every lookup time, and over the alerts they actually had; the degraded ones'
largest gap between two lookups (event time) against their budget; lookups done and saved; the
evaluation time.  Policy off = the same subscriptions with no budget.

    PYTHONPATH=. .venv/bin/python bench/overload_bench.py --rules 240 --seconds 150 --events 9000 --speed 20
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

P = 250  #: pane width and lookup period (ms)
LATENESS = 1_000  #: allowed lateness (ms)


def rule_text(i: int) -> str:
    w = 2 + i % 5
    return (
        f"SELECT symbol FROM trades GROUP BY symbol HAVING MAX(price) OVER LAST {w} SECONDS "
        f"- MIN(price) OVER LAST {w} SECONDS > {2 + i % 8}"
    )


def budget_of(i: int) -> int | None:
    return {1: 4_000, 3: 2_000}.get(i % 4)


def make_trades(n: int, seconds: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "symbol": np.array([f"S{i}" for i in rng.integers(0, 12, n)], dtype=object),
        "ts": (1_700_000_000_000 + np.sort(rng.integers(0, seconds * 1000, n))).astype(np.int64),
        "price": np.round(rng.uniform(30, 80, n), 2),
        "size": rng.integers(0, 100, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n),
        "exchange": np.array(["NASDAQ"] * n, dtype=object),
    }


def records(cols: dict[str, np.ndarray], lo: int, hi: int) -> pa.Table:
    """Trades ``lo:hi`` as the Kafka records the engine reads (Avro values, partition 0)."""
    from tidewatch.wire.avro import encode_batch

    vals = encode_batch("trades", {k: v[lo:hi] for k, v in cols.items()}).messages()
    return pa.table(
        {
            "partition": pa.array(np.zeros(hi - lo, np.int32)),
            "offset": pa.array(np.arange(lo, hi, dtype=np.int64)),
            "value": pa.array(vals, pa.binary()),
        }
    )


@dataclass
class Side:
    """One side's figures."""

    batches: int = 0
    eval_s: float = 0.0
    lookups: int = 0  # (subscription, lookup time) pairs looked up
    saved: int = 0  # ... skipped by the policy
    degraded: set[str] = field(default_factory=set)
    latency: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})  # budgeted?
    per_tau: list[float] = field(default_factory=list)  # each lookup time's latency
    gap: float = 0.0  # the largest gap between two lookups of a degraded subscription / its budget
    max_level: int = 0


def run(cols: dict[str, np.ndarray], n_rules: int, budgets: bool, speed: float, trigger: float) -> Side:
    from engine.core import EngineCore
    from engine.evaluation.evaluator import Evaluator
    from engine.messages import SubscriptionChange
    from engine.overload import Marks, by_stride, skipped
    from engine.rule_evaluator import rule_compiler
    from tidewatch.settings import get_settings

    settings = get_settings()
    core = EngineCore(
        pane_ms=P,
        allowed_lateness_ms=LATENESS,
        max_future_ms=10**13,
        evaluator_factory=lambda: Evaluator("shared", ci_p=settings.ci_p, pane_ms=P),
        compile_rule=rule_compiler(settings),
    )
    marks = Marks.of(settings)
    changes = [
        SubscriptionChange(
            f"r{i}", "upsert", f"r{i}", rule_text(i), None, None, budget_of(i) if budgets else None
        )
        for i in range(n_rules)
    ]
    budgeted = {f"r{i}" for i in range(n_rules) if budget_of(i) is not None}
    budget = {f"r{i}": budget_of(i) for i in range(n_rules)}
    last: dict[str, int] = {}  # each budgeted subscription's last lookup time
    core.process(0, {"trades": records(cols, 0, 0)}, changes)
    ts = cols["ts"]
    t0 = int(ts[0])
    arrival = (ts - t0) / 1000 / speed  # wall seconds after the feed's start
    side = Side()
    wall, taken, b = 0.0, 0, 1
    while taken < len(ts):
        start = wall
        upto = int(np.searchsorted(arrival, start, "right"))
        if upto == taken:
            wall = max(wall + trigger, float(arrival[taken]))
            continue
        t = time.perf_counter()
        out = core.process(b, {"trades": records(cols, taken, upto)}, [])
        core_s = time.perf_counter() - t
        core.observe_load(core_s / trigger, marks)
        end = start + core_s
        taken, b = upto, b + 1
        side.batches += 1
        side.eval_s += core_s
        side.max_level = max(side.max_level, core.overload.level)
        side.degraded |= set(out.strides)
        grid = by_stride(out.strides)
        for tau in out.lookups:
            off = skipped(grid, tau, P) if grid else frozenset()
            side.saved += len(off)
            side.lookups += n_rules - len(off)
            side.per_tau.append(end - (tau + LATENESS - t0) / 1000 / speed)
            for sid in budgeted - off:
                if sid in last:
                    side.gap = max(side.gap, (tau - last[sid]) / (budget[sid] or 1))
                last[sid] = tau
        for a in out.alerts:
            possible = (a.as_of + LATENESS - t0) / 1000 / speed
            side.latency[a.subscription_id in budgeted].append(end - possible)
        wall = max(end, start + trigger)
    return side


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", type=int, default=240)
    ap.add_argument("--seconds", type=int, default=150, help="event time the feed spans")
    ap.add_argument("--events", type=int, default=9_000)
    ap.add_argument("--speed", type=float, default=20.0, help="event-time seconds fed per wall second")
    ap.add_argument("--trigger", type=float, default=0.5, help="trigger interval (s)")
    args = ap.parse_args(argv)
    cols = make_trades(args.events, args.seconds, seed=1)
    sides = {"policy on (budgets)": True, "policy off (no budgets)": False}
    got = {name: run(cols, args.rules, on, args.speed, args.trigger) for name, on in sides.items()}

    def pct(xs: list[float]) -> str:
        if not xs:
            return "-"
        a = np.asarray(xs)
        return f"{np.percentile(a, 50):6.2f} / {np.percentile(a, 99):6.2f} / {a.max():6.2f}"

    print(
        f"{args.rules} rules (half with a budget), {args.events:,} trades over {args.seconds} s of event time "
        f"fed at {args.speed:g}x, lookups every {P} ms, trigger {args.trigger} s"
    )
    print(f"{'':24} {'lookup time p50/p99/max s':>26} {'undegraded alerts p50/p99/max':>30} "
          f"{'alerts':>6} {'gap/budget':>10} {'lookups done':>13} {'saved':>7} {'eval s':>6} "
          f"{'batches':>7} {'level':>5}")  # fmt: skip
    for name, s in got.items():
        print(
            f"{name:24} {pct(s.per_tau):>26} {pct(s.latency[False]):>30} "
            f"{len(s.latency[False]) + len(s.latency[True]):6} {s.gap:10.2f} {s.lookups:13,} "
            f"{s.saved:7,} {s.eval_s:6.1f} {s.batches:7} {s.max_level:5}"
        )


if __name__ == "__main__":
    main()
