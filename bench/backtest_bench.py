"""Benchmark of ``tidewatch backtest``: shared (collective indexes) vs naive and scan evaluation.

Two workloads, each 1,000,000 events and 1,000 COUNT / SUM threshold rules, lookups every second:

* ``trades``  -- 5,000 symbols (Zipf-skewed activity), rules on COUNT(*) / SUM(size) with a few
  WHERE / FILTER predicates and windows of 10 s .. 5 min;
* ``packets`` -- 100,000 source IPs (Zipf-skewed), rules on COUNT(*) / SUM(length) by src_ip.

For each workload the events are written to a CSV in a temporary directory and the real
backtest (:func:`engine.evaluation.backtest.run_backtest`: CSV load, rule compilation, evaluation,
alert file) runs with ``--strategy shared`` end to end (the evaluator fed one row per (key, 1-s
pane), as the backtest and the engine run it).  The naive strategy evaluates every rule
on every key of its domain; it is run in the same process over the same input, for at most
``--naive-budget`` CPU seconds (it stops at a lookup boundary; its rate is measured over the part it
processed, and the shared run's alerts over that part are checked to be identical).  So is the
``scan`` strategy (no index; each distinct aggregate computed once per lookup for all the rules
that read it, :class:`engine.evaluation.scan.ScanEvaluator`): ``naive / shared`` measures the
index and the de-duplication of aggregates, ``scan / shared`` the index alone.  Times
are CPU seconds of this process (``time.process_time``): the machine is shared, so wall-clock
times are also printed but are not the measure.

    .venv/bin/python bench/backtest_bench.py            # full: 1M events x 1,000 rules, both workloads
    .venv/bin/python bench/backtest_bench.py --quick    # 200k events x 200 rules, under a minute

``--alert-heavy`` runs issue 22's alert-heavy workloads instead (100,000 symbols, 500,000 trades;
A: 300 COUNT / SUM threshold rules every 60 s over 3 h, B: 1,000 rules every 5 s over 1 h; rules
whose result sets churn at every lookup): ``shared``, ``scan`` and ``naive`` end to end side by
side (CPU seconds, alert files compared by md5), and the alert output alone, the per-alert writer
the backtest had before vs the bulk writer, in µs per alert::

    .venv/bin/python bench/backtest_bench.py --alert-heavy --heavy A
    .venv/bin/python bench/backtest_bench.py --alert-heavy --heavy B --scale-time 0.25 --heavy-events 125000
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.evaluation.backtest import load_events, load_rules, make_evaluator, run_backtest  # noqa: E402
from tidewatch.settings import get_settings  # noqa: E402  (read after --ci-p sets the environment)


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
    _write_csv(
        path, ["symbol", "ts", "price", "size", "side", "exchange"], [sym, ts, price, size, side, exch]
    )
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
        rule = (
            f"SELECT {key} FROM {stream}{where} GROUP BY {key} HAVING {agg} OVER LAST {T} SECONDS > {thr:g}"
        )
        lines.append(json.dumps({"name": f"r{i:04d}", "rule": rule}))
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- runs
def run_shared(rules: Path, stream: str, events: Path) -> tuple[str, Any]:
    out = io.StringIO()
    res = run_backtest(rules, [(stream, events)], 1000, out, strategy="shared", settings=get_settings())
    return out.getvalue(), res


def run_eval(rules: Path, stream: str, events: Path, strategy: str, budget: float) -> dict[str, Any]:
    """Evaluation only (events already loaded): lookups in order until ``budget`` CPU seconds are spent.

    Returns the cumulative events and CPU seconds after each lookup, and the alerts."""
    plans = load_rules(rules, get_settings())
    f = load_events(stream, events)
    # as run_backtest: (key, pane) rows of the lookup period
    ev = make_evaluator(strategy, get_settings().ci_p, pane_ms=1000)
    ev.add_rules((name, plan) for name, _t, plan in plans)
    ts = f.cols["ts"]
    t0 = (int(ts[0]) // 1000) * 1000
    taus = np.arange(t0, int(ts[-1]) + 1000, 1000)
    bounds = np.searchsorted(ts, taus, side="right")
    alerts: list = []
    cum_events, cum_cpu, per_lookup = [], [], []
    c0 = time.process_time()
    a = 0
    for j, tau in enumerate(taus):
        b = int(bounds[j])
        if b > a:
            ev.apply(stream, {k: v[a:b] for k, v in f.cols.items()})
            a = b
        c1 = time.process_time()
        alerts.append(ev.step(int(tau)).rows())
        c2 = time.process_time()
        per_lookup.append(c2 - c1)
        cum_events.append(a)
        cum_cpu.append(c2 - c0)
        if c2 - c0 > budget:
            break
    return {
        "events": cum_events,
        "cpu": cum_cpu,
        "alerts": alerts,
        "lookup_cpu": per_lookup,
        "nbytes": ev.nbytes,
    }


def workload(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    rng = np.random.default_rng(42)
    n = args.events
    n_keys = 5000 if name == "trades" else args.packet_keys
    ev_path = tmp / f"{name}.csv"
    rules_path = tmp / f"{name}_rules.jsonl"
    t = time.perf_counter()
    keys = (make_trades if name == "trades" else make_packets)(rng, n, n_keys, args.seconds, ev_path)
    make_rules(rng, name, args.rules, rules_path, keys, args.seconds)
    print(f"[{name}] generated {n:,} events over {args.seconds} s ({n / args.seconds:,.0f} events/s of event time), "
          f"{n_keys:,} keys ({len(np.unique(keys)):,} active), {args.rules} COUNT/SUM threshold rules "
          f"in {time.perf_counter() - t:.1f} s")  # fmt: skip

    # warm-up: load the JIT-compiled kernels once per process (reported, not counted)
    small = tmp / f"{name}_warm.csv"
    with ev_path.open() as src, small.open("w") as dst:
        for _ in range(2001):
            dst.write(src.readline())
    c = time.process_time()
    run_shared(rules_path, name, small)
    print(f"[{name}] warm-up (numba kernels loaded from cache / compiled once per process): "
          f"CPU {time.process_time() - c:.2f} s")  # fmt: skip
    _, res = run_shared(rules_path, name, ev_path)
    print(f"[{name}] shared, end to end (CSV load + compile + evaluate + write alerts): "
          f"CPU {res.cpu_seconds:.2f} s = {n / res.cpu_seconds:,.0f} events/s "  # type: ignore[attr-defined]
          f"(wall {res.seconds:.2f} s = {n / res.seconds:,.0f} events/s on a shared machine); "  # type: ignore[attr-defined]
          f"{res.lookups} lookups, {res.alerts:,} alerts, {res.stats['candidates']:,} index candidates")  # type: ignore[attr-defined]  # fmt: skip

    sh = run_eval(rules_path, name, ev_path, "shared", float("inf"))
    out: dict[str, float] = {"shared_eps": n / res.cpu_seconds, "same": 1.0}  # type: ignore[attr-defined]
    # naive (the paper's per-rule baseline) and scan (no index, each distinct aggregate once per
    # lookup for all its rules), each for at most --naive-budget CPU seconds, each against shared
    # over the lookups it got through
    for strategy in ("naive", "scan"):
        other = run_eval(rules_path, name, ev_path, strategy, args.naive_budget)
        L = len(other["cpu"])  # type: ignore[arg-type]
        ev_n = other["events"][L - 1]  # type: ignore[index]
        s_cpu, n_cpu = sh["cpu"][L - 1], other["cpu"][L - 1]  # type: ignore[index]
        same = sh["alerts"][:L] == other["alerts"]  # type: ignore[index]
        ratio = n_cpu / s_cpu
        s_look = float(np.mean(sh["lookup_cpu"][:L])) * 1000  # type: ignore[index]
        n_look = float(np.mean(other["lookup_cpu"])) * 1000  # type: ignore[arg-type]
        full = "all" if L == len(sh["cpu"]) else "the first"  # type: ignore[arg-type]
        print(f"[{name}] evaluation only (CPU), {full} {L} lookups ({ev_n:,} events): "
              f"shared {s_cpu:.2f} s = {ev_n / s_cpu:,.0f} events/s ({s_look:.1f} ms per lookup of {args.rules} rules) | "
              f"{strategy} {n_cpu:.2f} s = {ev_n / n_cpu:,.0f} events/s ({n_look:.1f} ms per lookup) | "
              f"shared is {ratio:.1f}x {strategy}; identical alerts: {same}; shared state {sh['nbytes'] / 2**20:.1f} MiB")  # fmt: skip
        out[strategy] = ratio
        out["same"] = min(out["same"], float(same))
    return out


# ---------------------------------------------------------------- alert-heavy workloads (issue 22)
ALERT_HEAVY = {  # name -> (rules, lookup period ms, event-time span s, windows s)
    "A": (300, 60_000, 3 * 3600, [60, 300, 600, 1800]),
    "B": (1000, 5_000, 3600, [10, 30, 60, 300]),
}


def churn_rules(
    rng: np.random.Generator, n_rules: int, path: Path, keys: np.ndarray, seconds: int, windows: list[int]
) -> None:
    """COUNT / SUM(size) threshold rules on trades by symbol, each threshold what the key of a
    random activity rank (log-uniform in 3..300) reaches in the window: every rule holds
    hundreds of keys, many of them entering and leaving at every lookup (an alert storm)."""
    rates = np.sort(np.bincount(keys))[::-1] / seconds
    wheres = {"": 1.0, " WHERE exchange = 'NASDAQ'": 0.6, " WHERE side = 'ASK'": 0.48}
    lines = []
    for i in range(n_rules):
        T = int(rng.choice(windows))
        where = str(rng.choice(list(wheres)))
        kind = "count" if rng.random() < 0.5 else "sum"
        rank = int(np.exp(rng.uniform(np.log(3), np.log(300))))
        expect = rates[min(rank, len(rates) - 1)] * T * wheres[where] * (1000.0 if kind == "sum" else 1.0)
        thr = max(1.0, float(np.round(expect * rng.uniform(0.8, 1.2))))
        agg = "COUNT(*)" if kind == "count" else "SUM(size)"
        rule = (
            f"SELECT symbol FROM trades{where} GROUP BY symbol HAVING {agg} OVER LAST {T} SECONDS > {thr:g}"
        )
        lines.append(json.dumps({"name": f"r{i:04d}", "rule": rule}))
    path.write_text("\n".join(lines) + "\n")


def old_writer(changes: list[Any], out: Any) -> int:
    """The per-alert writer ``run_backtest`` had before issue 22 (Changes.rows(), one f-string
    line per alert with memoized json.dumps), for the old-vs-new output figure."""
    buf: list[str] = []
    quoted: dict[str, str] = {}
    n = 0

    def q(text: str) -> str:
        v = quoted.get(text)
        if v is None:
            v = quoted[text] = json.dumps(text)
        return v

    for ch in changes:
        for as_of, rule, key, kind in ch.rows():
            buf.append(f'{{"as_of": {int(as_of)}, "rule": {q(rule)}, "key": {q(key)}, "kind": "{kind}"}}')
            n += 1
            if len(buf) >= 4096:
                out.write("\n".join(buf) + "\n")
                buf.clear()
    if buf:
        out.write("\n".join(buf) + "\n")
    return n


def alert_heavy(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """One alert-heavy workload: shared, scan and naive end to end (run_backtest, alert file
    written), CPU seconds; then the alert output alone, old per-alert writer vs the bulk one."""
    from engine.evaluation.alert_lines import AlertWriter
    from engine.evaluation.backtest import iter_changes, make_evaluator

    n_rules, every, seconds, windows = ALERT_HEAVY[name]
    n_rules = int(n_rules * args.scale_rules)
    seconds = int(seconds * args.scale_time)
    rng = np.random.default_rng(22)
    ev_path, rules_path = tmp / f"{name}.csv", tmp / f"{name}_rules.jsonl"
    keys = make_trades(rng, args.heavy_events, args.heavy_keys, seconds, ev_path)
    churn_rules(rng, n_rules, rules_path, keys, seconds, windows)
    print(f"[{name}] {args.heavy_events:,} trades over {seconds:,} s, {args.heavy_keys:,} symbols "
          f"({len(np.unique(keys)):,} active), {n_rules} COUNT/SUM threshold rules, lookups every {every // 1000} s")  # fmt: skip
    small = tmp / f"{name}_warm.csv"
    with ev_path.open() as src, small.open("w") as dst:
        for _ in range(2001):
            dst.write(src.readline())
    strategies = () if args.output_only else ("shared", "scan", "naive")
    for strategy in strategies:  # warm-up: JIT kernels loaded once per process
        run_backtest(
            rules_path, [("trades", small)], every, io.StringIO(), strategy=strategy, settings=get_settings()
        )
    out: dict[str, float] = {}
    digests = {}
    for strategy in strategies:
        path = tmp / f"{name}_{strategy}.jsonl"
        with path.open("wb") as fh:  # as `tidewatch backtest` opens its output
            res = run_backtest(
                rules_path, [("trades", ev_path)], every, fh, strategy=strategy, settings=get_settings()
            )
        digests[strategy] = hashlib.md5(path.read_bytes()).hexdigest()
        out[strategy] = res.cpu_seconds
        out["alerts"] = res.alerts
        print(f"[{name}] {strategy:6s} end to end: CPU {res.cpu_seconds:6.2f} s (wall {res.seconds:6.2f} s), "
              f"{res.lookups} lookups, {res.alerts:,} alerts")  # fmt: skip
        path.unlink()
    # the alert output alone: the same lookups' changes through the old and the new writer
    plans = load_rules(rules_path, get_settings())
    f = load_events("trades", ev_path)
    changes = list(iter_changes(plans, [f], every, make_evaluator("shared", get_settings().ci_p, every)))
    n_alerts = sum(len(c) for c in changes)
    out["alerts"] = n_alerts
    out["old_us"] = out["new_us"] = float("inf")
    for _ in range(args.output_repeat):  # the two writers alternately, best of the repeats
        with (tmp / "old.jsonl").open("w") as fh:
            c = time.process_time()
            old_writer(changes, fh)
            out["old_us"] = min(out["old_us"], (time.process_time() - c) / max(n_alerts, 1) * 1e6)
        with (tmp / "new.jsonl").open("wb") as fh:  # as `tidewatch backtest` opens its output
            c = time.process_time()
            w = AlertWriter(fh)
            for ch in changes:
                w.add(ch)
            w.flush()
            out["new_us"] = min(out["new_us"], (time.process_time() - c) / max(n_alerts, 1) * 1e6)
    same_bytes = (tmp / "old.jsonl").read_bytes() == (tmp / "new.jsonl").read_bytes()
    same = len(set(digests.values())) <= 1
    print(f"[{name}] alert output alone, {n_alerts:,} alerts, best of {args.output_repeat}: old per-alert writer "
          f"{out['old_us']:.3f} us/alert, bulk writer {out['new_us']:.3f} us/alert (identical bytes: {same_bytes})")  # fmt: skip
    if strategies:
        print(f"[{name}] naive/shared {out['naive'] / out['shared']:.2f}x, scan/shared {out['scan'] / out['shared']:.2f}x; "
              f"identical alert files (md5) across shared, scan, naive: {same}")  # fmt: skip
    out["same"] = float(same and same_bytes)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200k events x 200 rules (under a minute)")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rules", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=100, help="time span of the events")
    ap.add_argument("--packet-keys", type=int, default=100_000)
    ap.add_argument(
        "--naive-budget", type=float, default=90.0, help="CPU seconds of naive evaluation per workload"
    )
    ap.add_argument("--workload", choices=["trades", "packets", "both"], default="both")
    ap.add_argument(
        "--alert-heavy", action="store_true",
        help="issue 22's alert-heavy workloads (A: 300 rules every 60 s over 3 h; B: 1,000 rules every 5 s over 1 h): "
        "shared, scan, naive end to end and the alert output in us per alert",
    )  # fmt: skip
    ap.add_argument("--heavy-events", type=int, default=500_000)
    ap.add_argument("--heavy-keys", type=int, default=100_000)
    ap.add_argument("--heavy", choices=["A", "B", "both"], default="both")
    ap.add_argument("--scale-rules", type=float, default=1.0, help="alert-heavy: fraction of the rules")
    ap.add_argument("--scale-time", type=float, default=1.0, help="alert-heavy: fraction of the time span")
    ap.add_argument(
        "--output-only", action="store_true",
        help="alert-heavy: only the alert output alone (old per-alert writer vs the bulk writer), no end-to-end runs",
    )  # fmt: skip
    ap.add_argument(
        "--output-repeat", type=int, default=3, help="alert-heavy: best of N for the alert output"
    )
    ap.add_argument(
        "--ci-p", type=int, default=None, help="CI-COUNT / CI-SUM parameter p (default: settings.ci_p)"
    )
    args = ap.parse_args()
    if args.ci_p is not None:  # settings are read from the environment on first use
        os.environ["TIDEWATCH_CI_P"] = str(args.ci_p)
    if args.quick:
        args.events, args.rules, args.naive_budget, args.seconds = 200_000, 200, 5.0, 40
    cmd = "  ".join(["$", ".venv/bin/python", *sys.argv])
    print(f"command: {cmd}")
    print(
        f"machine: {os.cpu_count()} cores (one used), numpy {np.__version__}; CI parameter p = {get_settings().ci_p}"
    )
    if args.alert_heavy:
        heavy = ["A", "B"] if args.heavy == "both" else [args.heavy]
        with tempfile.TemporaryDirectory(prefix="twbench") as d:
            res = {name: alert_heavy(name, args, Path(d)) for name in heavy}
        if args.output_only:
            print("summary: " + "; ".join(
                f"{k}: {v['alerts']:,.0f} alerts, output {v['old_us']:.3f} -> {v['new_us']:.3f} us/alert; "
                f"identical {bool(v['same'])}" for k, v in res.items()))  # fmt: skip
            return
        print("summary: " + "; ".join(
            f"{k}: {v['alerts']:,.0f} alerts, shared {v['shared']:.2f} s, scan {v['scan']:.2f} s, naive {v['naive']:.2f} s "
            f"(CPU); naive/shared {v['naive'] / v['shared']:.2f}x, scan/shared {v['scan'] / v['shared']:.2f}x; "
            f"output {v['old_us']:.3f} -> {v['new_us']:.3f} us/alert; identical {bool(v['same'])}"
            for k, v in res.items()))  # fmt: skip
        return
    names = ["trades", "packets"] if args.workload == "both" else [args.workload]
    with tempfile.TemporaryDirectory(prefix="twbench") as d:
        results = {name: workload(name, args, Path(d)) for name in names}
    print("summary: " + "; ".join(
        f"{k}: shared {v['shared_eps']:,.0f} events/s end to end (CPU), naive/shared {v['naive']:.1f}x, "
        f"scan/shared {v['scan']:.1f}x, identical {bool(v['same'])}" for k, v in results.items()))  # fmt: skip


if __name__ == "__main__":
    main()
