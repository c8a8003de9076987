"""The injected trade episodes make the Traderbot examples of RULES.md fire.

Two proofs: (1) a brute-force evaluation of the two rules, written here from
RULES.md's definitions, at every lookup second around each episode; (2) the
platform's own ``tidewatch backtest`` on the exported CSV.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from ingest.packets_gen import K_SYN_FLOOD, PacketConfig, PacketGenerator, demo_attacks
from ingest.trades_gen import K_MOMENTUM, K_SURGE, TradeConfig, TradeGenerator, demo_episodes
from tidewatch.wire.csv_io import write_csv

MIN = 60_000
START = 1_709_564_400_000  # 2024-03-04 15:00 UTC
MOMENTUM = (
    "SELECT symbol FROM trades WHERE exchange = 'NASDAQ' GROUP BY symbol "
    "HAVING LAST(price) OVER LAST 20 MINUTES BETWEEN 20 AND 200 "
    "AND LAST(price) OVER LAST 20 MINUTES < 0.98 * FIRST(price) OVER LAST 20 MINUTES "
    "AND SUM(size) FILTER (WHERE side = 'ASK') OVER LAST 2 MINUTES >= 0.7 * SUM(size) OVER LAST 2 MINUTES"
)
VOLATILITY = (
    "SELECT symbol FROM trades GROUP BY symbol "
    "HAVING LAST(price) OVER LAST 30 MINUTES BETWEEN 20 AND 200 "
    "AND MAX(price) OVER LAST 30 MINUTES - MIN(price) OVER LAST 30 MINUTES > 0.03 * LAST(price) OVER LAST 30 MINUTES "
    "AND AVG(size) OVER LAST 5 MINUTES > 4 * AVG(size) OVER LAST 30 MINUTES"
)


def _momentum_holds(ts, price, size, side, exch, tau: int) -> bool:  # type: ignore[no-untyped-def]
    m = exch == "NASDAQ"
    ts, price, size, ask = ts[m], price[m], size[m], side[m] == "ASK"
    hi = np.searchsorted(ts, tau, "right")
    lo20 = np.searchsorted(ts, tau - 20 * MIN, "right")
    lo2 = np.searchsorted(ts, tau - 2 * MIN, "right")
    if hi <= lo20:
        return False
    last, first = price[hi - 1], price[lo20]
    return bool(
        20 <= last <= 200
        and last < 0.98 * first
        and size[lo2:hi][ask[lo2:hi]].sum() >= 0.7 * size[lo2:hi].sum()
    )


def _volatility_holds(ts, price, size, tau: int) -> bool:  # type: ignore[no-untyped-def]
    hi = np.searchsorted(ts, tau, "right")
    lo30 = np.searchsorted(ts, tau - 30 * MIN, "right")
    lo5 = np.searchsorted(ts, tau - 5 * MIN, "right")
    if hi <= lo30 or hi <= lo5:
        return False
    w = price[lo30:hi]
    last = w[-1]
    return bool(
        20 <= last <= 200
        and w.max() - w.min() > 0.03 * last
        and size[lo5:hi].mean() > 4 * size[lo30:hi].mean()
    )


@pytest.fixture(scope="module")
def market() -> tuple[TradeGenerator, list, dict[str, np.ndarray], list[dict]]:
    # small enough for a quick backtest: 36 minutes (the volatility rule needs 30 of history) at 200 trades/s
    gen = TradeGenerator(TradeConfig(rate=200, n_symbols=1000), seed=7, session_open_ms=START - 2 * 3600_000)
    eps = demo_episodes(gen, START + 31 * MIN + 30_000, every_ms=150_000, count=2)
    gen.episodes = list(eps)
    chunks = list(gen.chunks(START, START + 36 * MIN, 10_000))
    cols = {
        k: np.concatenate([c[k].to_numpy() if hasattr(c[k], "to_numpy") else c[k] for c in chunks])
        for k in chunks[0]
    }
    return gen, eps, cols, chunks


def test_each_episode_fires_its_rule_and_the_symbol_was_quiet_before(market) -> None:  # type: ignore[no-untyped-def]
    gen, eps, cols, _ = market
    for e in eps:
        if e.kind not in (K_MOMENTUM, K_SURGE) or e.magnitude <= 0:  # skip recoveries and bursts
            continue
        m = cols["symbol"] == gen.symbols[e.symbol]
        ts, price, size, side, exch = (cols[k][m] for k in ("ts", "price", "size", "side", "exchange"))
        if e.kind == K_MOMENTUM:
            holds = partial(_momentum_holds, ts, price, size, side, exch)
        else:
            holds = partial(_volatility_holds, ts, price, size)

        before = [holds(t) for t in range(e.start_ms - 5 * MIN, e.start_ms, 1000)]
        during = [holds(t) for t in range(e.start_ms, e.start_ms + 2 * MIN, 1000)]
        assert not any(before), f"{e.kind} on {gen.symbols[e.symbol]} fired before the episode"
        first = during.index(True) if any(during) else None
        assert first is not None, f"{e.kind} on {gen.symbols[e.symbol]} never fired"
        assert first <= 60, f"{e.kind} fired only {first} s after the episode started"


def test_backtest_reports_the_injected_episodes(market, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gen, eps, _, chunks = market
    trades = tmp_path / "trades.csv"
    write_csv(trades, iter(chunks), "trades")
    rules = tmp_path / "rules.jsonl"
    rules.write_text(
        json.dumps({"name": "momentum", "rule": MOMENTUM})
        + "\n"
        + json.dumps({"name": "volatility", "rule": VOLATILITY})
        + "\n"
    )
    out = tmp_path / "alerts.jsonl"
    exe = shutil.which("tidewatch", path=str(Path(sys.executable).parent)) or "tidewatch"
    res = subprocess.run(
        [
            exe,
            "backtest",
            "--rules",
            str(rules),
            "--events",
            f"trades={trades}",
            "--every",
            "1000",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    alerts = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    enters = {(a["rule"], a["key"]): a["as_of"] for a in alerts if a["kind"] == "ENTER"}
    for e in eps:
        if e.kind == K_MOMENTUM and e.magnitude > 0:
            rule = "momentum"
        elif e.kind == K_SURGE:
            rule = "volatility"
        else:
            continue
        sym = gen.symbols[e.symbol]
        hits = [
            a["as_of"]
            for a in alerts
            if a["kind"] == "ENTER"
            and a["rule"] == rule
            and a["key"] == sym
            and e.start_ms <= a["as_of"] <= e.start_ms + 60_000
        ]
        assert hits, (
            f"backtest: no ENTER of {rule} for {sym} within a minute of the episode ({len(enters)} enters)"
        )


PACKET_RULES = {
    "syn_flood": "SELECT dst_ip FROM packets WHERE protocol = 'TCP' AND tcp_flags = 'S' "
    "GROUP BY dst_ip HAVING COUNT(*) OVER LAST 10 SECONDS > 500",
    "port_scan": "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST 60 SECONDS > 100",
    "heavy_hitter": "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST 1 MINUTE > 10000000",
}


def test_backtest_reports_the_injected_attacks(tmp_path: Path) -> None:
    attacks = demo_attacks(START + 30_000, every_ms=60_000, count=3, seed=1)
    gen = PacketGenerator(PacketConfig(rate=1000), seed=1, attacks=list(attacks))
    packets = tmp_path / "packets.csv"
    write_csv(packets, gen.chunks(START, START + 4 * MIN, 10_000), "packets")
    rules = tmp_path / "rules.jsonl"
    rules.write_text("".join(json.dumps({"name": n, "rule": r}) + "\n" for n, r in PACKET_RULES.items()))
    out = tmp_path / "alerts.jsonl"
    exe = shutil.which("tidewatch", path=str(Path(sys.executable).parent)) or "tidewatch"
    res = subprocess.run(
        [
            exe,
            "backtest",
            "--rules",
            str(rules),
            "--events",
            f"packets={packets}",
            "--every",
            "1000",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    alerts = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    enters = {(a["rule"], a["key"]) for a in alerts if a["kind"] == "ENTER"}
    for a in attacks:
        key = a.dst if a.kind == K_SYN_FLOOD else a.src
        hits = [
            x["as_of"]
            for x in alerts
            if x["kind"] == "ENTER"
            and x["rule"] == a.kind
            and x["key"] == key
            and a.start_ms <= x["as_of"] <= a.start_ms + 60_000
        ]
        assert hits, f"backtest: no ENTER of {a.kind} for {key} within a minute of the attack"
    # normal traffic raises nothing: every ENTER is one of the attacks' keys
    keys = {(a.kind, a.dst if a.kind == K_SYN_FLOOD else a.src) for a in attacks}
    assert enters <= keys, f"false positives: {sorted(enters - keys)[:10]}"
