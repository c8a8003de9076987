"""Key-detail aggregate series against a brute-force evaluation of RULES.md's definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dashboard.detail import aggregate_series, detail_frames, longest_window_ms, lookup_times, preview_keys
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings

RULE = (
    "SELECT symbol FROM trades WHERE exchange = 'NASDAQ' GROUP BY symbol HAVING "
    "COUNT(*) OVER LAST 5 SECONDS > 1 AND SUM(size) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS > 2 "
    "AND AVG(size) OVER 8 SECONDS TO 3 SECONDS AGO > 1 AND MIN(price) OVER LAST 6 SECONDS > 0 "
    "AND MAX(price) OVER LAST 6 SECONDS > 0 AND FIRST(price) OVER LAST 7 SECONDS > 0 "
    "AND LAST(price) OVER LAST 3 ROWS > 0 AND COUNT(DISTINCT side) OVER LAST 9 SECONDS > 0"
)


def _events(seed: int, n: int = 300) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "symbol": np.array(["AAPL"] * n, dtype=object),
        "ts": rng.integers(0, 60_000, n).astype(np.int64),  # unsorted, with ties
        "price": np.round(rng.uniform(10, 20, n), 2),
        "size": rng.integers(0, 50, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK", "UNKNOWN"], dtype=object), n),
        "exchange": rng.choice(np.array(["NASDAQ", "NYSE"], dtype=object), n),
    }


def _brute(ev: dict[str, np.ndarray], text: str, tau: int) -> float:
    n = len(ev["ts"])
    order = sorted(range(n), key=lambda i: ev["ts"][i])  # stable: ties in arrival order
    rows = [{k: ev[k][i] for k in ev} for i in order if ev["exchange"][i] == "NASDAQ"]
    if "FILTER" in text:
        rows = [r for r in rows if r["side"] == "ASK"]
    if "ROWS" in text:
        win = [r for r in rows if r["ts"] <= tau][-3:]
    elif "TO 3 SECONDS AGO" in text:
        win = [r for r in rows if tau - 8000 < r["ts"] <= tau - 3000]
    else:
        secs = int(text.split("OVER LAST ")[1].split()[0])
        win = [r for r in rows if tau - secs * 1000 < r["ts"] <= tau]
    func = text.split("(")[0]
    if func == "COUNT":
        return float(len({r["side"] for r in win})) if "DISTINCT" in text else float(len(win))
    if func == "SUM":
        return float(sum(r["size"] for r in win))
    if not win:
        return math.nan
    if func == "AVG":
        return sum(r["size"] for r in win) / len(win)
    vals = [r["price"] for r in win]
    return {"MIN": min(vals), "MAX": max(vals), "FIRST": vals[0], "LAST": vals[-1]}[func]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_aggregate_matches_brute_force(seed: int) -> None:
    plan = compile_rule(RULE, get_settings())
    ev = _events(seed)
    taus = lookup_times(0, 62_000, 1000)
    assert len(plan.aggs) == 8
    for agg in plan.aggs:
        got = aggregate_series("trades", ev, agg, taus)
        want = np.array([_brute(ev, agg.text, int(t)) for t in taus])
        np.testing.assert_allclose(got, want, equal_nan=True, err_msg=agg.text)


def test_lookup_times_are_pane_aligned_and_thinned() -> None:
    assert list(lookup_times(1500, 5000, 1000)) == [2000, 3000, 4000, 5000]
    t = lookup_times(0, 3_600_000, 1000, max_points=100)
    assert len(t) <= 100 and np.all(t % 1000 == 0)
    assert len(lookup_times(5000, 4000, 1000)) == 0


def test_detail_frames_cover_the_span() -> None:
    plan = compile_rule(
        "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 10 SECONDS > 5", get_settings()
    )
    ev = _events(7, 50)
    frames = detail_frames("trades", ev, plan.aggs, span_ms=20_000, pane_ms=1000)
    (df,) = frames.values()
    assert 20 <= len(df) <= 21 and df["value"].notna().all()
    assert longest_window_ms(plan.aggs) == 10_000
    assert detail_frames("trades", {}, plan.aggs, 1000, 1000) == {}


def test_detail_frames_run_to_now_so_a_quiet_key_falls_back() -> None:
    plan = compile_rule(
        "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 10 SECONDS > 5", get_settings()
    )
    cols = {
        "symbol": np.array(["A", "A"], dtype=object),
        "ts": np.array([100_100, 100_200], np.int64),
        "price": np.ones(2),
        "size": np.array([600, 600], np.int64),
        "side": np.array(["BID"] * 2, dtype=object),
        "exchange": np.array(["X"] * 2, dtype=object),
    }
    # two events inside one pane: no lookup between them, so nothing to draw without now
    assert len(detail_frames("trades", cols, plan.aggs, 600_000, 1000)[plan.aggs[0].text]) == 0
    (df,) = detail_frames("trades", cols, plan.aggs, 600_000, 1000, now_ms=115_000).values()
    got = dict(zip(df["time"].astype("int64") // 10**6, df["value"], strict=True))
    assert got[101_000] == 1200 and got[110_000] == 1200 and got[111_000] == 0 and max(got) == 115_000


def test_preview_keys_run_the_evaluator_at_the_last_pane() -> None:
    plan = compile_rule(
        "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 10 SECONDS > 1000",
        get_settings(),
    )
    cols = {
        "symbol": np.array(["A", "B", "A", "C"], dtype=object),
        "ts": np.array([1000, 2000, 3000, 9500], np.int64),
        "price": np.ones(4),
        "size": np.array([600, 5, 600, 2000], np.int64),
        "side": np.array(["BID"] * 4, dtype=object),
        "exchange": np.array(["X"] * 4, dtype=object),
    }
    assert preview_keys(plan, cols, 1000, get_settings().ci_p) == (
        ["A"],
        9000,
    )  # C's trade is after the lookup at 9000
    assert preview_keys(plan, {}, 1000, get_settings().ci_p) == ([], None)
