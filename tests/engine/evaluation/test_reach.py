"""The windows in use summed up once per rule set (:mod:`engine.evaluation.reach`): after any
sequence of rules added and removed, with batches applied and lookups made in between, the
evaluator's cached :class:`~engine.evaluation.reach.Reach` equals a brute force over the rules
in use (their plans' windows, not the structures), so a rule set change that did not drop the
cache would fail here."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.evaluation.evaluator import Evaluator
from subscriptions import rule_ast as A
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings

HEAD = "SELECT symbol FROM trades GROUP BY symbol HAVING "
PACKETS = "SELECT src_ip FROM packets GROUP BY src_ip HAVING "
WINDOWS = ["LAST 1 SECONDS", "LAST 3 SECONDS", "LAST 10 SECONDS", "LAST 3 ROWS", "LAST 7 ROWS"]
TEXTS = [
    *(HEAD + f"COUNT(*) OVER {w} > 1" for w in WINDOWS),
    *(HEAD + f"SUM(size) FILTER (WHERE side = 'BID') OVER {w} > 5" for w in WINDOWS),
    *(HEAD + f"MAX(price) OVER {w} > 3" for w in WINDOWS),
    PACKETS + "COUNT(*) OVER LAST 5 SECONDS > 2",
    PACKETS + "COUNT(DISTINCT dst_port) OVER LAST 4 ROWS > 2",
]
HISTORY_MS = 2_000


def _brute(plans: dict[str, Any]) -> tuple[int, dict[str, tuple[int, dict[tuple[str, str], int]]]]:
    """From the rules' plans alone: the longest time window of any aggregate or indexed atom,
    and per stream (its longest time window, at least HISTORY_MS; the largest n per (key
    field, predicate) of its ROWS windows)."""
    longest = 0
    streams: dict[str, tuple[int, dict[tuple[str, str], int]]] = {}
    for plan in plans.values():
        far, rows = streams.get(plan.stream, (HISTORY_MS, {}))
        for a in plan.aggs:
            if isinstance(a.window, A.RowsWindow):
                k = (plan.key, A.row_text(a.predicate))
                rows[k] = max(rows.get(k, 0), int(a.window.n))
            else:
                w = a.window.start_ms if isinstance(a.window, A.TimeWindow) else int(a.window)
                longest, far = max(longest, w), max(far, w)
        for t in plan.atoms:
            if t.indexable and t.window_ms is not None:
                longest, far = max(longest, t.window_ms), max(far, t.window_ms)
        streams[plan.stream] = (far, rows)
    return longest, streams


def _trades(rng: np.random.Generator, n: int, t0: int) -> dict[str, np.ndarray]:
    return {
        "symbol": np.array(["A", "B", "C"], dtype=object)[rng.integers(0, 3, n)],
        "ts": t0 + np.sort(rng.integers(0, 1_000, n)).astype(np.int64),
        "price": rng.integers(50, 1000, n) / 100,
        "size": rng.integers(0, 50, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n),
        "exchange": rng.choice(np.array(["X", "Y"], dtype=object), n),
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, len(TEXTS) - 1)), min_size=1, max_size=14),
    seed=st.integers(0, 2**16),
)
def test_the_cached_reach_equals_a_brute_force_over_the_rules_in_use(
    ops: list[tuple[bool, int]], seed: int
) -> None:
    s = get_settings()
    rng = np.random.default_rng(seed)
    ev = Evaluator("shared", ci_p=2, pane_ms=1_000, history_ms=HISTORY_MS)
    plans: dict[str, Any] = {}
    t = 0
    for step, (add, i) in enumerate(ops):
        name = f"r{i}"
        if add and name not in plans:
            plans[name] = compile_rule(TEXTS[i], s)
            ev.add_rule(name, plans[name])
        elif not add and name in plans:
            del plans[name]
            ev.remove_rule(name)
        if "trades" in {p.stream for p in plans.values()}:
            ev.apply("trades", _trades(rng, 20, t))  # batches applied: the reach is read (and cached)
        t += 1_000
        if step % 2:
            ev.step(t)
        longest, streams = _brute(plans)
        got = ev._reach()
        assert got.longest == longest
        for stream in ("trades", "packets"):
            keep, rows = got.retention(stream)
            want_keep, want_rows = streams.get(stream, (HISTORY_MS, {}))
            assert keep == want_keep, (stream, keep, want_keep)
            assert {(r.key, A.row_text(r.predicate)): r.n for r in rows} == want_rows
