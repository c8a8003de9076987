"""Probe of the evaluator's state with a ROWS rule on a long stream (issue #20).

200,000 trades over 500 symbols in 800 batches of 250 (one second each), a lookup after each
batch, two rules: ``AVG(price) OVER LAST 50 ROWS > 9.9`` and ``SUM(size) OVER LAST 10 SECONDS >
2000``.  Prints, at 50,000 / 100,000 / 200,000 events, the bytes of the structures and indexes
and the raw events the evaluator's history holds.  Runs against the code on ``PYTHONPATH`` (the
history is read the old way, a dict of units, when the evaluator has no ``history_rows``), so the
same command measures the code before and after a change.

    .venv/bin/python bench/rows_retention.py [--pane-ms 1000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from engine.evaluation.evaluator import Evaluator
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings

HEAD = "SELECT symbol FROM trades GROUP BY symbol HAVING "


def _trades(rng: np.random.Generator, n: int, keys: np.ndarray, t0: int) -> dict[str, np.ndarray]:
    return {
        "symbol": keys[rng.integers(0, keys.shape[0], n)],
        "ts": np.sort(t0 + rng.integers(1, 1000, n)).astype(np.int64),
        "price": rng.integers(50, 1000, n) / 100,
        "size": rng.integers(0, 50, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK", "ASK", "ASK", "UNKNOWN"], dtype=object), n),
        "exchange": rng.choice(np.array(["X", "Y", "Z"], dtype=object), n),
    }


def _held(ev: Evaluator) -> tuple[float, int, float]:
    """(MB of structures and indexes, history rows, history MB)."""
    if hasattr(ev, "history_rows"):
        return (ev.nbytes - ev.history_nbytes) / 1e6, ev.history_rows(), ev.history_nbytes / 1e6
    units = [u for us in ev._history.values() for u in us if u.raw is not None]  # type: ignore[attr-defined]
    rows = sum(int(u.raw["ts"].shape[0]) for u in units)
    return ev.nbytes / 1e6, rows, sum(sum(v.nbytes for v in u.raw.values()) for u in units) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pane-ms", type=int, default=None)
    args = ap.parse_args()
    s = get_settings()
    ev = Evaluator("shared", ci_p=8, pane_ms=args.pane_ms)
    ev.add_rule("rows", compile_rule(HEAD + "AVG(price) OVER LAST 50 ROWS > 9.9", s))
    ev.add_rule("time", compile_rule(HEAD + "SUM(size) OVER LAST 10 SECONDS > 2000", s))
    rng = np.random.default_rng(1)
    keys = np.array([f"S{i:03d}" for i in range(500)], dtype=object)
    t0 = time.perf_counter()
    for b in range(800):
        ev.apply("trades", _trades(rng, 250, keys, b * 1000))
        ev.step((b + 1) * 1000)
        done = (b + 1) * 250
        if done in (50_000, 100_000, 200_000):
            mb, rows, hmb = _held(ev)
            print(
                f"{done:>7,} events: structures {mb:.2f} MB, history {rows:,} rows ({hmb:.2f} MB), "
                f"{time.perf_counter() - t0:.1f} s"
            )


if __name__ == "__main__":
    main()
