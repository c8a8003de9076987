"""ingest.trades_gen: the synthetic market's statistics, reproducibility and episodes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ingest.trades_gen import (
    K_MOMENTUM,
    SESSION_MS,
    Episode,
    TradeConfig,
    TradeGenerator,
    intraday_profile,
)


def _concat(chunks: list[dict]) -> dict[str, np.ndarray]:
    out: dict[str, list] = {}
    for c in chunks:
        for k, v in c.items():
            out.setdefault(k, []).append(v.to_numpy() if hasattr(v, "to_numpy") else v)
    return {k: np.concatenate(v) for k, v in out.items()}


def _codes(chunks: list[dict], field: str) -> np.ndarray:
    return np.concatenate([c[field].codes for c in chunks])


@pytest.mark.parametrize("s", [1.0, 0.7])
def test_symbol_activity_follows_zipf_with_the_configured_slope(s: float) -> None:
    gen = TradeGenerator(TradeConfig(n_symbols=2000, rate=40_000, zipf_s=s, intraday=False), seed=11)
    chunks = list(gen.chunks(0, 30_000, 5000))
    counts = np.bincount(_codes(chunks, "symbol"), minlength=2000)
    by_rank = np.zeros(2000)
    by_rank[gen.rank - 1] = counts
    ranks = np.arange(1, 301)  # ranks with plenty of trades
    slope = np.polyfit(np.log(ranks), np.log(by_rank[:300]), 1)[0]
    assert slope == pytest.approx(-s, abs=0.05)


def test_sizes_are_log_normal_with_the_configured_median_and_sigma() -> None:
    gen = TradeGenerator(TradeConfig(rate=50_000, size_median=100, size_sigma=1.0, intraday=False), seed=5)
    size = _concat(list(gen.chunks(0, 10_000, 2000)))["size"]
    ls = np.log(size)
    assert size.min() >= 1
    assert np.median(size) == pytest.approx(100, rel=0.03)
    assert ls.mean() == pytest.approx(math.log(100), abs=0.02)
    assert ls.std() == pytest.approx(1.0, abs=0.02)
    # log-normal tail: P(size > median * e^2) = P(Z > 2) = 2.3 %
    assert np.mean(size > 100 * math.e**2) == pytest.approx(0.0228, abs=0.003)


def test_intraday_profile_is_u_shaped_with_mean_one() -> None:
    u = (np.arange(10_000) + 0.5) / 10_000
    p = intraday_profile(u)
    assert p.mean() == pytest.approx(1.0, abs=0.01)
    assert p[0] > 2 * p[5000] and p[-1] > 1.5 * p[5000]
    gen = TradeGenerator(TradeConfig(rate=5000), seed=1, session_open_ms=0)
    opening = len(gen.chunk(0, 60_000)["ts"])
    midday = len(gen.chunk(SESSION_MS // 2, SESSION_MS // 2 + 60_000)["ts"])
    assert opening > 2 * midday


def test_prices_sides_and_venues_look_like_a_tape() -> None:
    gen = TradeGenerator(TradeConfig(rate=20_000, intraday=False), seed=2)
    chunks = list(gen.chunks(0, 10_000, 1000))
    t = _concat(chunks)
    assert np.all(np.diff(t["ts"]) >= 0)
    px = t["price"]
    hi = px >= 1
    assert np.allclose(px[hi] * 100, np.round(px[hi] * 100), atol=1e-6)  # $0.01 ticks
    side = _codes(chunks, "side")
    frac = np.bincount(side, minlength=3) / len(side)
    assert frac[0] == pytest.approx(0.48, abs=0.01) and frac[2] == pytest.approx(0.04, abs=0.005)
    assert {"NASDAQ", "NYSE"} <= set(t["exchange"])
    # a trade at the ask prints at or above the mid; at the bid at or below: ASK > BID on average per symbol
    sym = _codes(chunks, "symbol")
    top = np.bincount(sym).argmax()
    m = sym == top
    assert px[m & (side == 1)].mean() > px[m & (side == 0)].mean()


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    def run(seed: int) -> dict[str, np.ndarray]:
        g = TradeGenerator(TradeConfig(rate=3000, n_symbols=500), seed=seed)
        return _concat(list(g.chunks(1_000_000, 1_010_000, 1000)))

    a, b, c = run(4), run(4), run(5)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["price"][:100], c["price"][:100])


def test_momentum_episode_drops_the_price_with_ask_side_selling_on_nasdaq() -> None:
    gen = TradeGenerator(TradeConfig(rate=2000), seed=3)
    k = gen.pick_symbols(1, rate_between=(0.5, 2.0))[0]
    p0 = gen.mid_price(k)
    gen.episodes = [Episode(K_MOMENTUM, k, 60_000, 45_000, 0.05, extra_rate=2.0)]
    chunks = list(gen.chunks(0, 200_000, 1000))
    t = _concat(chunks)
    m = t["symbol"] == gen.symbols[k]
    during = m & (t["ts"] >= 60_000) & (t["ts"] < 105_000)
    after = m & (t["ts"] >= 105_000)
    assert np.mean(t["side"][during] == "ASK") > 0.85
    assert np.mean(t["exchange"][during] == "NASDAQ") > 0.75
    assert np.median(t["price"][after]) < 0.97 * p0  # the drop persists
    assert gen.mid_price(k) < 0.97 * p0
