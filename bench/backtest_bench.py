"""Benchmark of ``tidewatch backtest``: shared (collective indexes) vs naive evaluation.

Two workloads, each 1,000,000 events and 1,000 COUNT / SUM threshold rules, lookups every second:

* ``trades``  -- 5,000 symbols (Zipf-skewed activity), rules on COUNT(*) / SUM(size) with a few
  WHERE / FILTER predicates and windows of 10 s .. 5 min;
* ``packets`` -- 100,000 source IPs (Zipf-skewed), rules on COUNT(*) / SUM(length) by src_ip.

For each workload the events are written to a CSV in a temporary directory and the real
backtest (:func:`subscriptions.backtest.run_backtest`: CSV load, rule compilation, evaluation,
alert file) runs with ``--strategy shared`` end to end.  The naive strategy evaluates every rule
on every key of its domain; it is run in the same process over the same input, for at most
``--naive-budget`` seconds (it stops at a lookup boundary; its rate is measured over the part it
processed, and the shared run's alerts over that part are checked to be identical).

    .venv/bin/python bench/backtest_bench.py            # full: 1M events x 1,000 rules, both workloads
    .venv/bin/python bench/backtest_bench.py --quick    # 200k events x 200 rules, under a minute
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from subscriptions.backtest import load_events, load_rules, run_backtest  # noqa: E402
from subscriptions.evaluator import Evaluator  # noqa: E402


# ---------------------------------------------------------------- workloads
def zipf_keys(rng: np.random.Generator, n_keys: int, n: int, s: float = 1.1) -> np.ndarray:
    w = 1.0 / np.arange(1, n_keys + 1) ** s
    w /= w.sum()
    return rng.choice(n_keys, size=n, p=w)


def make_trades(rng: np.random.Generator, n: int, n_keys: int, seconds: int, path: Path) -> np.ndarray:
    ts = np.sort(rng.integers(0, seconds * 1000, n)) + 1_767_225_600_000
    k = zipf_keys(rng, n_keys, n, 0.9)
    sym = np.array([f"S{i:05d}" for i in range(n_keys)], dtype=object)[k]
    price = np.round(rng.uniform(5, 500, n), 2)
    size = (rng.integers(1, 20, n) * 100).astype(np.int64)
    side = rng.choice(np.array(["BID", "ASK", "UNKNOWN"], dtype=object), n, p=[0.48, 0.48, 0.04])
    exch = rng.choice(np.array(["NASDAQ", "NYSE", "ARCA"], dtype=object), n, p=[0.6, 0.3, 0.1])
    _write_csv(path, ["symbol", "ts", "price", "size", "side", "exchange"], [sym, ts, price, size, side, exch])
    return k


def make_packets(rng: np.random.Generator, n: int, n_keys: int, seconds: int, path: Path) -> np.ndarray:
    ts = np.sort(rng.integers(0, seconds * 1000, n)) + 1_767_225_600_000
    k = zipf_keys(rng, n_keys, n, 1.05)
    ips = np.array([f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(n_keys)], dtype=object)
    src = ips[k]
    dst = ips[rng.integers(0, 256, n)]
    proto = rng.choice(np.array(["TCP", "UDP", "ICMP"], dtype=object), n, p=[0.75, 0.2, 0.05])
    flags = np.where(proto == "TCP", rng.choice(np.array(["A", "S", "SA", "PA"], dtype=object), n), "")
    sport = rng.integers(1024, 65535, n)
    dport = rng.choice(np.array([80, 443, 53, 22]), n)
    length = rng.integers(40, 1500, n)
    _write_csv(
        path,
        ["ts", "src_ip", "dst_ip", "src_port", "dst_port", "protocol", "length", "tcp_flags"],
        [ts, src, dst, sport, dport, proto, length, flags],
    )
    return k


def _write_csv(path: Path, header: list[str], cols: list[np.ndarray]) -> None:
    import pandas as pd

    pd.DataFrame(dict(zip(header, cols, strict=True))).to_csv(path, index=False)


def make_rules(
    rng: np.random.Generator, workload: str, n_rules: int, path: Path, keys: np.ndarray, seconds: int
) -> None:
    """COUNT / SUM threshold rules; each threshold is what the key of a random activity rank
    (log-uniform in 3..300) reaches in the window, so every rule matches a handful of keys."""
    if workload == "trades":
        key, stream, field, mean = "symbol", "trades", "size", 1000.0
        wheres = {"": 1.0, " WHERE exchange = 'NASDAQ'": 0.6, " WHERE side = 'ASK'": 0.48,
                  " WHERE exchange IN ('NYSE', 'ARCA')": 0.4}  # fmt: skip
    else:
        key, stream, field, mean = "src_ip", "packets", "length", 770.0
        wheres = {"": 1.0, " WHERE protocol = 'TCP'": 0.75, " WHERE tcp_flags = 'S'": 0.1875,
                  " WHERE dst_port = 443": 0.25}  # fmt: skip
    rates = np.sort(np.bincount(keys))[::-1] / seconds  # events / s per key, busiest first
    windows = [10, 30, 60, 300]
    lines = []
    for i in range(n_rules):
        T = int(rng.choice(windows))
        where = str(rng.choice(list(wheres)))
        kind = "count" if rng.random() < 0.5 else "sum"
        rank = int(np.exp(rng.uniform(np.log(3), np.log(300))))
        expect = rates[min(rank, len(rates) - 1)] * T * wheres[where] * (mean if kind == "sum" else 1.0)
        thr = max(1.0, float(np.round(expect * rng.uniform(0.8, 1.2))))
        agg = "COUNT(*)" if kind == "count" else f"SUM({field})"
        rule = f"SELECT {key} FROM {stream}{where} GROUP BY {key} HAVING {agg} OVER LAST {T} SECONDS > {thr:g}"
        lines.append(json.dumps({"name": f"r{i:04d}", "rule": rule}))
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- runs
def run_shared(rules: Path, stream: str, events: Path) -> tuple[float, float, str, object]:
    out = io.StringIO()
    res = run_backtest(rules, [(stream, events)], 1000, out, strategy="shared")
    return res.seconds, res.eval_seconds, out.getvalue(), res


def run_budgeted(rules: Path, stream: str, events: Path, strategy: str, budget: float) -> tuple[int, int, float, list]:
    """Evaluate lookups in order until ``budget`` seconds are spent; (lookups, events, seconds, alerts)."""
    plans = load_rules(rules)
    f = load_events(stream, events)
    ev = Evaluator(strategy)
    for name, _t, plan in plans:
        ev.add_rule(name, plan)
    ts = f.cols["ts"]
    t0 = (int(ts[0]) // 1000) * 1000
    taus = np.arange(t0, int(ts[-1]) + 1000, 1000)
    bounds = np.searchsorted(ts, taus, side="right")
    alerts: list = []
    start = time.perf_counter()
    a = 0
    j = 0
    for j, tau in enumerate(taus):
        b = int(bounds[j])
        if b > a:
            ev.apply(stream, {k: v[a:b] for k, v in f.cols.items()})
            a = b
        alerts.extend(ev.step(int(tau)).rows())
        if time.perf_counter() - start > budget:
            break
    return j + 1, a, time.perf_counter() - start, alerts


def workload(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    rng = np.random.default_rng(42)
    n = args.events
    n_keys = 5000 if name == "trades" else args.packet_keys
    ev_path = tmp / f"{name}.csv"
    rules_path = tmp / f"{name}_rules.jsonl"
    t = time.perf_counter()
    keys = (make_trades if name == "trades" else make_packets)(rng, n, n_keys, args.seconds, ev_path)
    make_rules(rng, name, args.rules, rules_path, keys, args.seconds)
    print(f"[{name}] generated {n:,} events over {args.seconds} s, {n_keys:,} keys, {args.rules} rules "
          f"in {time.perf_counter() - t:.1f} s")  # fmt: skip

    secs, eval_secs, text, res = run_shared(rules_path, name, ev_path)
    shared_eps = n / secs
    print(f"[{name}] shared, end to end (CSV load + compile + evaluate + write): {secs:.2f} s = "
          f"{shared_eps:,.0f} events/s; evaluation alone {eval_secs:.2f} s = {n / eval_secs:,.0f} events/s; "
          f"{res.lookups} lookups, {res.alerts:,} alerts, {res.stats['candidates']:,} index candidates")  # fmt: skip

    # side by side on the same prefix: shared and naive evaluation (no CSV load)
    s_l, s_n, s_sec, s_alerts = run_budgeted(rules_path, name, ev_path, "shared", float("inf"))
    n_l, n_n, n_sec, n_alerts = run_budgeted(rules_path, name, ev_path, "naive", args.naive_budget)
    # shared over the same prefix
    p_l, p_n, p_sec, p_alerts = run_budgeted_prefix(rules_path, name, ev_path, n_l)
    same = p_alerts == n_alerts
    ratio = (p_n / p_sec) / (n_n / n_sec) if n_n else float("nan")
    print(f"[{name}] evaluation only, first {n_l} lookups ({n_n:,} events): shared {p_sec:.2f} s "
          f"({p_n / p_sec:,.0f} events/s, {p_sec / n_l * 1000:.2f} ms/lookup) vs naive {n_sec:.2f} s "
          f"({n_n / n_sec:,.0f} events/s, {n_sec / n_l * 1000:.2f} ms/lookup): shared/naive = {ratio:.1f}x; "
          f"identical alerts: {same} ({len(n_alerts):,})")  # fmt: skip
    if n_l == s_l:
        print(f"[{name}] naive finished all {n_l} lookups; alerts identical to shared: {s_alerts == n_alerts}")
    return {"shared_eps": shared_eps, "ratio": ratio, "same": float(same)}


def run_budgeted_prefix(rules: Path, stream: str, events: Path, lookups: int) -> tuple[int, int, float, list]:
    plans = load_rules(rules)
    f = load_events(stream, events)
    ev = Evaluator("shared")
    for name, _t, plan in plans:
        ev.add_rule(name, plan)
    ts = f.cols["ts"]
    t0 = (int(ts[0]) // 1000) * 1000
    taus = np.arange(t0, int(ts[-1]) + 1000, 1000)[:lookups]
    bounds = np.searchsorted(ts, taus, side="right")
    alerts: list = []
    a = 0
    start = time.perf_counter()
    for j, tau in enumerate(taus):
        b = int(bounds[j])
        if b > a:
            ev.apply(stream, {k: v[a:b] for k, v in f.cols.items()})
            a = b
        alerts.extend(ev.step(int(tau)).rows())
    return len(taus), a, time.perf_counter() - start, alerts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200k events x 200 rules (under a minute)")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rules", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=100, help="time span of the events")
    ap.add_argument("--packet-keys", type=int, default=100_000)
    ap.add_argument("--naive-budget", type=float, default=120.0, help="seconds of naive evaluation per workload")
    ap.add_argument("--workload", choices=["trades", "packets", "both"], default="both")
    args = ap.parse_args()
    if args.quick:
        args.events, args.rules, args.naive_budget, args.seconds = 200_000, 200, 8.0, 40
    cmd = "  ".join(["$", ".venv/bin/python", *sys.argv])
    print(f"command: {cmd}")
    print(f"machine: {os.cpu_count()} cores (one used), numpy {np.__version__}")
    names = ["trades", "packets"] if args.workload == "both" else [args.workload]
    with tempfile.TemporaryDirectory(prefix="twbench") as d:
        for name in names:
            workload(name, args, Path(d))


if __name__ == "__main__":
    main()
