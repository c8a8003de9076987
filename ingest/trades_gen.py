"""A synthetic stock-trade stream modelled on real markets (seeded, vectorized).

Model (see docs/feeds.md, "Trade generator"):

* **Symbols.** ``n_symbols`` unique tickers (1-4 letters); each has a listing
  exchange (NASDAQ, NYSE, ARCA, ...), an initial price (log-normal around $40)
  and a daily volatility (log-normal around 2 %).
* **Activity.** Symbol of rank k trades with probability ``∝ k^-zipf_s``
  (Zipf-skewed: a few names make most of the prints).  The market-wide rate is
  ``rate`` trades/s times a U-shaped **intraday profile** over a 6.5 h session
  (busy open, quiet lunch, busier close; mean 1 over the session).
  Per chunk (``chunk_ms``) the count is Poisson, times are uniform in the chunk.
* **Sizes.** log-normal: ``log(size) ~ N(log(size_median), size_sigma)``, ≥ 1.
* **Prices.** Per-symbol geometric random walk in trade time, variance
  ``sigma_daily² · Δt / session`` between consecutive trades of the symbol; a
  trade prints at mid ± half-spread by side (BID: hit the bid, ASK: lifted the
  ask, UNKNOWN: mid), rounded to the tick ($0.01, or $0.0001 under $1).
* **Venues.** 55 % on the listing exchange, the rest spread over the other
  venues by market share.
* **Episodes** (:class:`Episode`) are injected per symbol and time span:
  ``momentum`` (a drop of ``magnitude`` in log-price over the span, ask-side
  selling on NASDAQ, extra trades; the drop persists), ``surge`` (trade sizes
  × ``magnitude`` -- block trades), ``volatility`` (price swings of amplitude
  ``magnitude`` around the walk).  :func:`demo_episodes` schedules episodes that
  make the Traderbot examples of RULES.md fire.

Everything is drawn from one ``numpy.random.Generator`` seeded by ``seed`` and
consumed chunk by chunk, so the same (seed, config, start, chunking) gives the
same stream.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tidewatch.wire.avro import Coded

SESSION_MS = int(6.5 * 3600 * 1000)
EXCHANGES = ("NASDAQ", "NYSE", "ARCA", "BATS", "EDGX", "IEX", "AMEX")
#: listing share of each exchange (for the symbol's home market)
LISTING_SHARE = np.array([0.50, 0.35, 0.07, 0.03, 0.0, 0.0, 0.05])
#: share of off-listing prints per venue
VENUE_SHARE = np.array([0.30, 0.22, 0.15, 0.13, 0.10, 0.06, 0.04])
SIDES = ("BID", "ASK", "UNKNOWN")
NASDAQ = 0
K_MOMENTUM, K_SURGE, K_VOLATILITY = "momentum", "surge", "volatility"


@dataclass
class TradeConfig:
    """Parameters of the trade model (defaults: a quiet but realistic tape)."""

    n_symbols: int = 3000
    rate: float = 1000.0  # mean trades/s over the session
    zipf_s: float = 1.0
    size_median: float = 100.0
    size_sigma: float = 1.0
    price_median: float = 40.0
    price_sigma: float = 0.9
    vol_daily_median: float = 0.02
    listing_venue_share: float = 0.55
    unknown_side: float = 0.04
    intraday: bool = True


def intraday_profile(frac: np.ndarray | float) -> np.ndarray:
    """U-shaped relative trading intensity at session fraction ``frac`` in [0, 1) (mean ≈ 1)."""
    u = np.asarray(frac, dtype=np.float64)
    raw = 0.55 + 2.2 * np.exp(-u / 0.04) + 1.5 * np.exp(-(1.0 - u) / 0.05)
    return raw / _PROFILE_MEAN


_u = (np.arange(100_000) + 0.5) / 100_000
_PROFILE_MEAN = float(np.mean(0.55 + 2.2 * np.exp(-_u / 0.04) + 1.5 * np.exp(-(1.0 - _u) / 0.05)))


@dataclass
class Episode:
    """An injected market episode on one symbol over ``[start_ms, start_ms + duration_ms)``."""

    kind: str  # momentum | surge | volatility
    symbol: int  # index into TradeGenerator.symbols
    start_ms: int
    duration_ms: int
    magnitude: float  # momentum: log drop; surge: size factor; volatility: swing amplitude (log)
    extra_rate: float = 0.0  # extra trades/s of the symbol during the episode

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.duration_ms


def _tickers(rng: np.random.Generator, n: int) -> list[str]:
    letters = np.array(list(string.ascii_uppercase))
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        k = int(rng.choice([1, 2, 3, 4, 4], 1)[0]) if n > 500 else int(rng.integers(2, 5))
        t = "".join(rng.choice(letters, k))
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


@dataclass
class TradeGenerator:
    """Generates trade chunks column-wise; see the module docstring for the model."""

    config: TradeConfig = field(default_factory=TradeConfig)
    seed: int = 0
    session_open_ms: int = 0  # epoch ms of a session open (intraday profile phase)
    episodes: list[Episode] = field(default_factory=list)

    def __post_init__(self) -> None:
        c = self.config
        self.rng = np.random.default_rng(self.seed)
        rng = self.rng
        n = c.n_symbols
        self.symbols: list[str] = _tickers(rng, n)
        # activity: a random permutation of ranks, weights k^-s
        self.rank = rng.permutation(n) + 1
        w = self.rank.astype(np.float64) ** -c.zipf_s
        self.weights = w / w.sum()
        self.cum_weights = np.cumsum(self.weights)
        self.listing = rng.choice(len(EXCHANGES), n, p=LISTING_SHARE / LISTING_SHARE.sum()).astype(np.int32)
        p0 = np.exp(rng.normal(math.log(c.price_median), c.price_sigma, n))
        self.log_mid = np.log(np.clip(p0, 1.0, 2000.0))
        self.offset = np.zeros(n)  # permanent episode offsets of the log price
        vol = np.exp(rng.normal(math.log(c.vol_daily_median), 0.4, n))
        self.sigma_ms = vol / math.sqrt(SESSION_MS)
        self.half_spread = np.clip(rng.normal(0.0004, 0.0002, n), 0.0001, 0.002)
        self.last_ts = np.full(n, -1, np.int64)

    # ----------------------------------------------------------------- helpers
    def symbol_rate(self, k: int | np.ndarray) -> np.ndarray | float:
        """Mean trades/s of symbol index ``k`` (at profile 1)."""
        return self.config.rate * self.weights[k]

    def mid_price(self, k: int) -> float:
        """Current mid of symbol ``k`` (without transient episode effects)."""
        return float(np.exp(self.log_mid[k] + self.offset[k]))

    def pick_symbols(
        self,
        count: int,
        *,
        rate_between: tuple[float, float],
        price_between: tuple[float, float] = (30.0, 150.0),
        listing: int | None = None,
        exclude: set[int] | None = None,
    ) -> list[int]:
        """Symbols whose trade rate and price lie in the given ranges (deterministic order)."""
        lam = self.config.rate * self.weights
        px = np.exp(self.log_mid + self.offset)
        ok = (lam >= rate_between[0]) & (lam <= rate_between[1])
        ok &= (px >= price_between[0]) & (px <= price_between[1])
        if listing is not None:
            ok &= self.listing == listing
        cand = [int(k) for k in np.flatnonzero(ok) if not exclude or int(k) not in exclude]
        if len(cand) < count:  # widen: closest rates first
            order = np.argsort(np.abs(np.log(lam / math.sqrt(rate_between[0] * rate_between[1]))))
            pband = (px >= price_between[0]) & (px <= price_between[1])
            extra = [
                int(k)
                for k in order
                if pband[k] and int(k) not in cand and (not exclude or int(k) not in exclude)
            ]
            cand += extra
        return cand[:count]

    # ----------------------------------------------------------------- generation
    def chunk(self, start_ms: int, end_ms: int) -> dict[str, Any]:
        """All trades with ``start_ms <= ts < end_ms``, sorted by ts, as columns.

        Returns ``{"symbol": Coded, "ts": int64, "price": float64, "size": int64,
        "side": Coded, "exchange": Coded}``.  Call with consecutive spans.
        """
        c, rng = self.config, self.rng
        span = max(0, end_ms - start_ms)
        mid = start_ms + span / 2
        prof = (
            float(intraday_profile(((mid - self.session_open_ms) % SESSION_MS) / SESSION_MS))
            if c.intraday
            else 1.0
        )
        m = int(rng.poisson(c.rate * prof * span / 1000.0))
        sym = np.searchsorted(self.cum_weights, rng.random(m) * self.cum_weights[-1]).astype(np.int32)
        sym = np.minimum(sym, c.n_symbols - 1)
        ts = start_ms + rng.integers(0, max(span, 1), m)
        # extra trades of active episodes
        active = [e for e in self.episodes if e.start_ms < end_ms and e.end_ms > start_ms]
        extra_sym, extra_ts = [], []
        for e in active:
            lo, hi = max(start_ms, e.start_ms), min(end_ms, e.end_ms)
            k = int(rng.poisson(e.extra_rate * (hi - lo) / 1000.0))
            if k:
                extra_sym.append(np.full(k, e.symbol, np.int32))
                extra_ts.append(rng.integers(lo, hi, k))
        if extra_sym:
            sym = np.concatenate([sym, *extra_sym])
            ts = np.concatenate([ts, *extra_ts])
        order = np.argsort(ts, kind="stable")
        sym, ts = sym[order], ts[order].astype(np.int64)
        n = len(ts)
        side = rng.choice(
            3, n, p=[(1 - c.unknown_side) / 2, (1 - c.unknown_side) / 2, c.unknown_side]
        ).astype(np.int32)
        venue_other = rng.choice(len(EXCHANGES), n, p=VENUE_SHARE / VENUE_SHARE.sum()).astype(np.int32)
        exch = np.where(rng.random(n) < c.listing_venue_share, self.listing[sym], venue_other).astype(
            np.int32
        )
        size = np.maximum(1, np.rint(np.exp(rng.normal(math.log(c.size_median), c.size_sigma, n)))).astype(
            np.int64
        )
        logmid = self._walk(sym, ts)
        # episode effects on the rows of their symbol
        for e in active:
            rows = np.flatnonzero((sym == e.symbol) & (ts >= e.start_ms) & (ts < e.end_ms))
            if e.kind == K_MOMENTUM:
                sel = np.flatnonzero(sym == e.symbol)
                frac = np.clip((ts[sel] - e.start_ms) / e.duration_ms, 0.0, 1.0)
                logmid[sel] -= e.magnitude * frac
                if e.magnitude > 0:  # a drop: ask-side selling, routed to NASDAQ (< 0: a quiet recovery)
                    side[rows] = np.where(rng.random(len(rows)) < 0.92, 1, 0)
                    exch[rows] = np.where(rng.random(len(rows)) < 0.8, NASDAQ, exch[rows])
            elif e.kind == K_SURGE:
                size[rows] = np.rint(size[rows] * e.magnitude).astype(np.int64)
            elif e.kind == K_VOLATILITY:
                phase = (ts[rows] - e.start_ms) / (e.duration_ms / 3.0)
                logmid[rows] += e.magnitude * np.sin(2 * math.pi * phase)
            else:
                raise ValueError(f"unknown episode kind {e.kind!r}")
        # fold finished momentum drops into the permanent offset
        for e in list(self.episodes):
            if e.end_ms <= end_ms:
                if e.kind == K_MOMENTUM:
                    self.offset[e.symbol] -= e.magnitude
                self.episodes.remove(e)
        logmid += self.offset[sym]
        mid_px = np.exp(logmid)
        hs = self.half_spread[sym] * mid_px
        px = mid_px + np.where(side == 1, hs, np.where(side == 0, -hs, 0.0))
        tick = np.where(px >= 1.0, 0.01, 0.0001)
        price = np.maximum(np.round(px / tick) * tick, tick)
        return {
            "symbol": Coded(sym, self.symbols),
            "ts": ts,
            "price": np.round(price, 4),
            "size": size,
            "side": Coded(side, SIDES),
            "exchange": Coded(exch, EXCHANGES),
        }

    def _walk(self, sym: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Log-mid of each row: the per-symbol random walk advanced in trade time (vectorized)."""
        n = len(ts)
        if n == 0:
            return np.zeros(0)
        order = np.lexsort((ts, sym))
        s_sym, s_ts = sym[order], ts[order]
        first = np.ones(n, bool)
        first[1:] = s_sym[1:] != s_sym[:-1]
        prev = np.empty(n, np.int64)
        prev[1:] = s_ts[:-1]
        lt = self.last_ts[s_sym[first]]
        prev[first] = np.where(lt < 0, s_ts[first], lt)
        dt = np.maximum(s_ts - prev, 0).astype(np.float64)
        eps = self.rng.standard_normal(n) * self.sigma_ms[s_sym] * np.sqrt(dt)
        cs = np.cumsum(eps)
        starts = np.flatnonzero(first)
        lengths = np.diff(np.append(starts, n))
        base = np.repeat(cs[starts] - eps[starts], lengths)
        walk = self.log_mid[s_sym] + (cs - base)
        lasts = np.append(starts[1:] - 1, n - 1)
        self.log_mid[s_sym[lasts]] = walk[lasts]
        self.last_ts[s_sym[lasts]] = s_ts[lasts]
        out = np.empty(n)
        out[order] = walk
        return out

    def chunks(
        self, start_ms: int, end_ms: int | None = None, chunk_ms: int = 1000
    ) -> Iterator[dict[str, Any]]:
        """Consecutive chunks from ``start_ms`` (to ``end_ms``, or forever)."""
        t = start_ms
        while end_ms is None or t < end_ms:
            hi = t + chunk_ms if end_ms is None else min(t + chunk_ms, end_ms)
            yield self.chunk(t, hi)
            t = hi


def demo_episodes(
    gen: TradeGenerator,
    first_ms: int,
    *,
    every_ms: int = 120_000,
    count: int = 10,
    duration_ms: int = 90_000,
) -> list[Episode]:
    """Episodes that make the Traderbot examples of RULES.md fire, from ``first_ms`` on.

    At each of ``count`` slots ``every_ms`` apart, two symbols get (1) a NASDAQ **momentum** drop of 5 % with ask-side selling
    (rule "NASDAQ short-term downward momentum") and (2) a **surge** of block
    trades (sizes × 100) together with a **volatility** burst of ±2.5 % on the
    other (rule "high volatility with recent volume surge").  Each slot takes
    fresh symbols for an hour's worth of slots, then reuses them; a momentum
    symbol's drop is undone 25-35 minutes later.  Symbols trade
    about once a second and are priced in [30, 150], inside the rules' price
    band.  The second rule compares 5-minute and 30-minute averages, so it needs
    30 minutes of history of the symbol (the demo feed backfills it).
    """
    lam_lo, lam_hi = 0.5, 2.0
    pool = min(count, max(1, 3_600_000 // max(every_ms, 1)))  # fresh symbols for an hour, then reuse
    mom = gen.pick_symbols(pool, rate_between=(lam_lo, lam_hi), listing=NASDAQ)
    vol = gen.pick_symbols(pool, rate_between=(lam_lo, lam_hi), exclude=set(mom))
    out: list[Episode] = []
    for i in range(count):
        t = first_ms + i * every_ms
        k = mom[i % len(mom)]
        lam = float(gen.symbol_rate(k))
        out.append(Episode(K_MOMENTUM, k, t, duration_ms // 2, 0.05, extra_rate=2 * lam))
        # the price recovers 25-35 minutes later (outside the rule's 20-minute window), so a long
        # demo that reuses the symbol keeps it inside the rules' price band
        out.append(Episode(K_MOMENTUM, k, t + 25 * 60_000, 10 * 60_000, -0.05))
        k = vol[i % len(vol)]
        out.append(Episode(K_SURGE, k, t, duration_ms, 100.0))
        out.append(Episode(K_VOLATILITY, k, t, duration_ms, 0.025))
    return out
