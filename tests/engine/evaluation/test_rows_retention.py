"""Bounded retention with ROWS windows (issue #20): structures and the raw history keep each
key's newest n rows a ``LAST n ROWS`` window in use can read (and the longest time window), so
memory stays flat on a long stream while every rule in use stays exact; what a rule added later
sees is documented in :mod:`engine.evaluation.evaluator` and checked here."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.evaluation import history
from engine.evaluation.backtest import EventFile, iter_alerts
from engine.evaluation.evaluator import Evaluator
from engine.evaluation.history import COMPACT_SLACK, _cols_nbytes, _unit_nbytes, newest_per_key
from engine.evaluation.panes import aggregate
from subscriptions.compiler import compile_rule
from tests.engine.evaluation.test_property import Reference, _row_ok, row_conds
from tidewatch.settings import get_settings

SYMBOLS = np.array(["A", "B", "C", "D"], dtype=object)
HEAD = "SELECT symbol FROM trades GROUP BY symbol HAVING "


# ---------------------------------------------------------------- events and the brute force
def trades(
    rng: np.random.Generator, n: int, t0: int = 0, keys: np.ndarray = SYMBOLS
) -> dict[str, np.ndarray]:
    """n trades sorted by ts; BID is rare (a filtered ROWS window reaches far back)."""
    gaps = rng.choice(np.array([0, 1, 5, 20, 100, 250]), n)
    return {
        "symbol": keys[rng.integers(0, keys.shape[0], n)],
        "ts": t0 + np.cumsum(gaps).astype(np.int64),
        "price": rng.integers(50, 1000, n) / 100,
        "size": rng.integers(0, 50, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK", "ASK", "ASK", "UNKNOWN"], dtype=object), n),
        "exchange": rng.choice(np.array(["X", "Y", "Z"], dtype=object), n),
    }


def as_events(cols: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    names = list(cols)
    return [
        dict(zip(names, row, strict=True)) for row in zip(*(cols[k].tolist() for k in names), strict=True)
    ]


class Brute:
    """Incremental brute force of RULES.md (per key: the list of its rows after WHERE; the
    aggregates recomputed from them at every lookup by :class:`Reference`)."""

    def __init__(self, text: str) -> None:
        self.ref = Reference(text)
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.last: dict[str, int] = {}  # newest event (before WHERE) per key: the key domain

    def add(self, events: list[dict[str, Any]]) -> None:
        rule = self.ref.rule
        for e in events:
            k = e[rule.key]
            self.last[k] = e["ts"]
            mine = self.rows.setdefault(k, [])
            if _row_ok(rule.where, e):
                mine.append(e)

    def result(self, tau: int) -> set[str]:
        W = self.ref.longest()
        dom = [k for k, t in self.last.items() if W is None or t > tau - W]
        return {k for k in dom if self.ref._cond(self.ref.rule.having, self.rows.get(k, []), tau)}


def brute_alerts(rules: list[tuple[str, str]], cols: dict[str, np.ndarray], every: int) -> list[tuple]:
    events = as_events(cols)
    ts = cols["ts"]
    taus = range(int(ts[0]) // every * every, int(ts[-1]) + every, every)
    brutes = [(name, Brute(text)) for name, text in rules]
    prev: dict[str, set[str]] = {name: set() for name, _ in rules}
    out: list[tuple] = []
    a = 0
    for tau in taus:
        b = int(np.searchsorted(ts, tau, "right"))
        rows = []
        for name, br in brutes:
            br.add(events[a:b])
            cur = br.result(tau)
            rows += [(tau, name, k, "ENTER") for k in cur - prev[name]]
            rows += [(tau, name, k, "EXIT") for k in prev[name] - cur]
            prev[name] = cur
        a = b
        out += sorted(rows, key=lambda r: (r[1], r[2]))
    return out


def engine_alerts(
    rules: list[tuple[str, str]], cols: dict[str, np.ndarray], every: int, strategy: str, pane_ms: int | None
) -> tuple[list[tuple], Evaluator]:
    plans = [(n, t, compile_rule(t, get_settings())) for n, t in rules]
    ev = Evaluator(strategy, ci_p=2, pane_ms=pane_ms)
    files = [EventFile("trades", cols)]
    return list(iter_alerts(plans, files, every, evaluator=ev)), ev


# ---------------------------------------------------------------- (a) exactness, random rules
@st.composite
def rows_atoms(draw: Any) -> str:
    agg = draw(
        st.sampled_from(
            ["COUNT(*)", "SUM(size)", "AVG(price)", "MIN(price)", "MAX(size)", "FIRST(price)",
             "LAST(size)", "COUNT(DISTINCT exchange)"]
        )
    )  # fmt: skip
    flt = f" FILTER (WHERE {draw(row_conds('trades'))})" if draw(st.integers(0, 2)) == 0 else ""
    if draw(st.integers(0, 4)) == 0:
        window = f"LAST {draw(st.integers(1, 5))} SECONDS"
    else:
        window = f"LAST {draw(st.sampled_from([1, 2, 3, 5, 8, 13]))} ROWS"
    op = draw(st.sampled_from([">", ">=", "<", "<=", "=", "!="]))
    c = draw(st.sampled_from([0, 1, 2, 3, 5, 7.5, 20, 60, 150]))
    return f"{agg}{flt} OVER {window} {op} {c}"


@st.composite
def rows_rules(draw: Any) -> str:
    where = f" WHERE {draw(row_conds('trades'))}" if draw(st.integers(0, 2)) == 0 else ""
    atoms = draw(st.lists(rows_atoms(), min_size=1, max_size=3))
    joiner = draw(st.sampled_from([" AND ", " OR "]))
    return f"SELECT symbol FROM trades{where} GROUP BY symbol HAVING {joiner.join(atoms)}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(rows_rules(), min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(300, 1200),
    pane=st.sampled_from([None, 1000]),
    slack=st.sampled_from([0, 16, COMPACT_SLACK]),
)
def test_rows_rules_over_a_long_stream_equal_the_brute_force(
    texts: list[str], seed: int, n: int, pane: int | None, slack: int
) -> None:
    """ROWS rules (with WHERE, FILTER, time windows beside) over a stream of hundreds of rows per
    key, expired every second of lookup time, the history's tail compacted often (``slack``):
    alerts equal the brute force, both strategies."""
    named = [(f"r{i}", t) for i, t in enumerate(texts)]
    cols = trades(np.random.default_rng(seed), n)
    expect = brute_alerts(named, cols, 1000)
    with patch.object(history, "COMPACT_SLACK", slack):
        shared, ev = engine_alerts(named, cols, 1000, "shared", pane)
        assert shared == expect
        naive, _ = engine_alerts(named, cols, 1000, "naive", pane)
        assert naive == expect
    # and the state was trimmed: no structure holds a key's whole stream
    per_key = max(int((cols["symbol"] == s).sum()) for s in SYMBOLS)
    for st_ in ev.states.values():
        for s in st_.structs.values():
            if s.rows_n and s.horizon() < 1000 and per_key > 200:
                live = s.obj._pool.end - s.obj._pool.head
                assert int(live.max(initial=0)) < per_key


class KeyRows:
    """Per key, the positions (arrival order) of the rows satisfying a mask: the per-key deque
    of a ROWS window is the last n of them up to the lookup time."""

    def __init__(self, cols: dict[str, np.ndarray], mask: np.ndarray | None = None) -> None:
        self.ts = cols["ts"]
        m = np.ones(self.ts.shape[0], bool) if mask is None else mask
        self.idx = {k: np.flatnonzero(m & (cols["symbol"] == k)) for k in SYMBOLS}

    def last(self, k: str, tau: int, n: int) -> np.ndarray:
        i = self.idx[k]
        m = int(np.searchsorted(self.ts[i], tau, "right"))
        return i[max(0, m - n) : m]

    def since(self, k: str, tau: int, W: int) -> np.ndarray:
        i = self.idx[k]
        t = self.ts[i]
        return i[int(np.searchsorted(t, tau - W, "right")) : int(np.searchsorted(t, tau, "right"))]


def test_a_long_seeded_stream_with_rows_rules_equals_a_per_key_deque_brute_force() -> None:
    """30,000 trades (7,500 per key), ROWS windows of 1 to 40 rows with and without WHERE /
    FILTER, a time window beside one: alerts equal a per-key brute force, with and without panes."""
    cols = trades(np.random.default_rng(20), 30_000)
    price, size, ex = cols["price"], cols["size"], cols["exchange"]
    bid = cols["side"] == "BID"
    every_row, bids = KeyRows(cols), KeyRows(cols, bid)
    where = "SELECT symbol FROM trades WHERE side = 'BID' GROUP BY symbol HAVING "
    rules = {
        "sum": (
            HEAD + "SUM(size) OVER LAST 40 ROWS > 1000",
            lambda k, t: size[every_row.last(k, t, 40)].sum() > 1000,
        ),
        "bid": (
            HEAD + "SUM(size) FILTER (WHERE side = 'BID') OVER LAST 25 ROWS > 700",
            lambda k, t: size[bids.last(k, t, 25)].sum() > 700,
        ),
        "avg": (
            where + "AVG(price) OVER LAST 7 ROWS > 6",
            lambda k, t: (v := price[bids.last(k, t, 7)]).shape[0] > 0 and v.mean() > 6,
        ),
        "mix": (
            HEAD + "MAX(price) OVER LAST 3 ROWS - MIN(price) OVER LAST 30 SECONDS > 8",
            lambda k, t: (
                (w := price[every_row.since(k, t, 30_000)]).shape[0] > 0
                and price[every_row.last(k, t, 3)].max() - w.min() > 8
            ),
        ),
        "dst": (
            HEAD + "COUNT(DISTINCT exchange) OVER LAST 4 ROWS = 1 AND LAST(price) OVER LAST 1 ROWS > 5",
            lambda k, t: (
                np.unique(ex[every_row.last(k, t, 4)]).shape[0] == 1
                and price[every_row.last(k, t, 1)][-1] > 5
            ),
        ),
    }
    ts = cols["ts"]
    expect: list[tuple] = []
    prev: dict[str, set[str]] = {name: set() for name in rules}
    for tau in range(0, int(ts[-1]) + 1000, 1000):
        seen = [k for k in SYMBOLS if every_row.last(k, tau, 1).shape[0]]
        rows = []
        for name, (_, f) in rules.items():
            cur = {k for k in seen if f(k, tau)}
            rows += [(tau, name, k, "ENTER") for k in cur - prev[name]]
            rows += [(tau, name, k, "EXIT") for k in prev[name] - cur]
            prev[name] = cur
        expect += sorted(rows, key=lambda r: (r[1], r[2]))
    assert len(expect) > 1000
    named = [(name, text) for name, (text, _) in rules.items()]
    for pane in (None, 1000):
        got, ev = engine_alerts(named, cols, 1000, "shared", pane)
        assert got == expect
        # of 30,000: 2 x (40 + 25) rows x 4 keys + the compaction slack + 30 s of events
        assert ev.history_rows() < 2 * 65 * 4 + COMPACT_SLACK + 600


# ---------------------------------------------------------------- (b) bounded state
def _feed_long(
    ev: Evaluator, mode: str, n_events: int, checkpoints: list[int]
) -> dict[int, tuple[int, int, int]]:
    """Feed n_events trades over 500 symbols in batches of 250 (1 s each), a lookup per batch;
    (bytes held, bytes of the structures, history rows) at each checkpoint."""
    rng = np.random.default_rng(1)
    keys = np.array([f"S{i:03d}" for i in range(500)], dtype=object)
    out: dict[int, tuple[int, int, int]] = {}
    done = 0
    b = 0
    while done < n_events:
        cols = trades(rng, 250, keys=keys)
        cols["ts"] = np.sort(b * 1000 + rng.integers(1, 1000, 250)).astype(np.int64)
        if mode == "panes":
            spec = ev.pane_spec("trades")
            rows = aggregate(cols, spec, 1000)
            ev.apply_panes("trades", rows, key=spec.key, raw=cols if spec.needs_raw else None)
        else:
            ev.apply("trades", cols)
        ev.step((b + 1) * 1000)
        done += 250
        b += 1
        if done in checkpoints:
            out[done] = (ev.nbytes, ev.nbytes - ev.history_nbytes, ev.history_rows())
    return out


@pytest.mark.parametrize("mode,pane", [("raw", None), ("raw", 1000), ("panes", 1000)])
def test_state_stays_bounded_with_a_rows_rule(mode: str, pane: int | None) -> None:
    """200,000 events through an evaluator with a ``LAST 50 ROWS`` rule (and a 10-second rule),
    in 800 batches of 250: the bytes held (structures, indexes and retained history) do not grow
    from the 50,000th to the 200,000th event, and the history holds about the 50 newest rows of
    each of the 500 keys plus 10 s of events -- before the bounded retention both grew with the
    stream (docs/measurements/engine.md, "State with a ROWS rule on a long stream")."""
    ev = Evaluator("shared", ci_p=8, pane_ms=pane)
    ev.add_rule("rows", compile_rule(HEAD + "AVG(price) OVER LAST 50 ROWS > 9.9", get_settings()))
    ev.add_rule("time", compile_rule(HEAD + "SUM(size) OVER LAST 10 SECONDS > 2000", get_settings()))
    got = _feed_long(ev, mode, 200_000, [50_000, 200_000])
    (b50, s50, h50), (b200, s200, h200) = got[50_000], got[200_000]
    # structures and indexes: flat (before: they never expired)
    assert s200 <= 1.25 * s50, got
    # history: the newest 50 rows of the 500 keys, kept up to about twice over plus the slack
    # (compaction) and one batch, plus 11 one-second batches of 250 -- whatever the stream's
    # length (before: every event)
    assert max(h50, h200) <= 2 * 500 * 50 + COMPACT_SLACK + 12 * 250, got
    assert b200 <= 1.5 * b50, got
    assert ev.history_nbytes == _history_nbytes(ev)
    # the structure of the ROWS window holds 50 rows per key (+ what arrived since its expiry)
    rows_struct = ev.rules["rows"].agg_structs[0]
    live = rows_struct.obj._pool.end - rows_struct.obj._pool.head
    assert int(live.max()) <= 50 + 250
    # rows held, counted: the history's and every row buffer's live rows (CI-SUM holds levels)
    objs = [s.obj for st in ev.states.values() for s in st.structs.values()]
    pooled = [o._pool for o in objs if hasattr(o, "_pool")]
    assert len(pooled) < len(objs)  # the 10-second SUM's CI-SUM is not counted
    assert ev.rows_held() == ev.history_rows() + sum(int((p.end - p.head).sum()) for p in pooled)


# ---------------------------------------------------------------- rules added later (PSoup)
def _stream_then(ev: Evaluator, cols: dict[str, np.ndarray], every: int = 1000) -> int:
    """Apply cols batch by batch with a lookup per period; returns the last lookup time."""
    ts = cols["ts"]
    tau = int(ts[0]) // every * every
    a = 0
    while a < ts.shape[0]:
        tau += every
        b = int(np.searchsorted(ts, tau, "right"))
        if b > a:
            ev.apply("trades", {k: v[a:b] for k, v in cols.items()})
        ev.step(tau)
        a = b
    return tau


@pytest.fixture
def small_slack() -> Any:
    """The history's tail compacted as soon as it holds twice what it keeps plus 16 rows (the
    default slack of 4,096 rows would hold these small streams whole)."""
    with patch.object(history, "COMPACT_SLACK", 16):
        yield


def _brute_now(text: str, cols: dict[str, np.ndarray], tau: int) -> set[str]:
    br = Brute(text)
    br.add(as_events(cols))
    return br.result(tau)


@pytest.mark.parametrize("pane", [None, 1000])
def test_late_rows_rule_within_what_is_held_is_exact_at_once(pane: int | None, small_slack: Any) -> None:
    """A rule added later whose ROWS windows are no longer than those in use on the same key
    field and predicate (here: WHERE side = 'BID', rare, so its rows lie far back) is exact at once."""
    cols = trades(np.random.default_rng(3), 6000)
    where = "SELECT symbol FROM trades WHERE side = 'BID' GROUP BY symbol HAVING "
    ev = Evaluator("shared", ci_p=2, pane_ms=pane)
    ev.add_rule("in_use", compile_rule(where + "COUNT(*) OVER LAST 20 ROWS > 100", get_settings()))
    ev.add_rule("plain", compile_rule(HEAD + "COUNT(*) OVER LAST 30 ROWS > 100", get_settings()))
    tau = _stream_then(ev, cols)
    assert ev.history_rows() < 2 * 4 * (20 + 30) + 16 + 250  # of 6,000: the tail + the last batch
    for text in (
        where + "SUM(size) OVER LAST 20 ROWS > 400",
        where + "MIN(price) OVER LAST 5 ROWS < 2 AND MAX(size) OVER LAST 12 ROWS > 45",
        HEAD + "AVG(price) OVER LAST 30 ROWS > 5.2",
        HEAD + "FIRST(price) OVER LAST 30 ROWS < LAST(price) OVER LAST 1 ROWS",
    ):
        ev.add_rule("late", compile_rule(text, get_settings()))
        assert ev.evaluate_now("late", tau) == _brute_now(text, cols, tau), text
        ev.remove_rule("late")


def test_late_rows_rule_longer_than_what_is_held_is_exact_once_refilled(small_slack: Any) -> None:
    """A late ``LAST n ROWS`` rule with n above what is held sees the rows held (the newest 10 per
    key, 2 s of events) and is exact once each key has n new rows -- like a time window longer
    than the retention, which sees the retained time span first."""
    rng = np.random.default_rng(4)
    cols = trades(rng, 4000)
    ev = Evaluator("shared", ci_p=2)
    ev.add_rule("in_use", compile_rule(HEAD + "COUNT(*) OVER LAST 10 ROWS > 100", get_settings()))
    ev.add_rule("time", compile_rule(HEAD + "COUNT(*) OVER LAST 2 SECONDS > 100", get_settings()))
    tau = _stream_then(ev, cols)
    long_rows = HEAD + "COUNT(*) OVER LAST 100 ROWS >= 100"
    long_time = HEAD + "COUNT(*) OVER LAST 60 SECONDS >= 100"
    for text in (long_rows, long_time):
        ev.add_rule("late", compile_rule(text, get_settings()))
        # every key has hundreds of rows: the brute force fires on all, the rule sees what is held
        assert _brute_now(text, cols, tau) == set(SYMBOLS)
        assert ev.evaluate_now("late", tau) == set()
        ev.remove_rule("late")
    ev.add_rule("late_rows", compile_rule(long_rows, get_settings()))
    more = trades(rng, 1200, t0=int(cols["ts"][-1]) + 1)
    assert min(int((more["symbol"] == s).sum()) for s in SYMBOLS) >= 100
    tau = _stream_then(ev, more)
    both = {k: np.concatenate([cols[k], more[k]]) for k in cols}
    assert ev.evaluate_now("late_rows", tau) == _brute_now(long_rows, both, tau) == set(SYMBOLS)


@pytest.mark.parametrize("pane", [None, 1000])
def test_rebuilding_a_shared_structure_keeps_the_rows_rules_exact(pane: int | None, small_slack: Any) -> None:
    """A late rule reading a structure further back than it was kept (a longer time window, a
    longer ROWS window) rebuilds it from the history: the ROWS rules already on it, whose rows
    (WHERE side = 'BID', rare) are older than the time retention, stay exact."""
    rng = np.random.default_rng(5)
    cols = trades(rng, 5000)
    where = "SELECT symbol FROM trades WHERE side = 'BID' GROUP BY symbol HAVING "
    rows_rule = where + "SUM(size) OVER LAST 15 ROWS > 300"
    ev = Evaluator("shared", ci_p=2, pane_ms=pane)
    ev.add_rule("rows", compile_rule(rows_rule, get_settings()))
    tau = _stream_then(ev, cols)
    assert ev.evaluate_now("rows", tau) == _brute_now(rows_rule, cols, tau)
    s = ev.rules["rows"].agg_structs[0]
    # a 2.5-second window is not a multiple of the pane: it reads the same raw-fed structure
    ev.add_rule("time", compile_rule(where + "SUM(size) OVER LAST 2500 MILLISECONDS > 0", get_settings()))
    ev.add_rule("longer", compile_rule(where + "SUM(size) OVER LAST 40 ROWS > 0", get_settings()))
    assert ev.rules["time"].agg_structs[0] is s and ev.rules["longer"].agg_structs[0] is s
    assert ev.evaluate_now("rows", tau) == _brute_now(rows_rule, cols, tau)
    more = trades(rng, 3000, t0=int(cols["ts"][-1]) + 1)
    tau = _stream_then(ev, more)
    both = {k: np.concatenate([cols[k], more[k]]) for k in cols}
    for name, text in (("rows", rows_rule), ("longer", where + "SUM(size) OVER LAST 40 ROWS > 0")):
        assert ev.evaluate_now(name, tau) == _brute_now(text, both, tau)


def test_removing_the_last_rows_rule_drops_the_rows_history(small_slack: Any) -> None:
    cols = trades(np.random.default_rng(6), 3000)
    ev = Evaluator("shared", ci_p=2)
    ev.add_rule("rows", compile_rule(HEAD + "COUNT(*) OVER LAST 30 ROWS > 1", get_settings()))
    ev.add_rule("time", compile_rule(HEAD + "COUNT(*) OVER LAST 1 SECONDS > 1", get_settings()))
    _stream_then(ev, cols)
    assert ev.history_rows() >= 4 * 30
    ev.remove_rule("rows")
    more = trades(np.random.default_rng(7), 50, t0=int(cols["ts"][-1]) + 1)
    _stream_then(ev, more)
    assert ev.history_rows() <= 50


def _history_nbytes(ev: Evaluator) -> int:
    """The history's bytes recounted from scratch (its running totals must agree)."""
    h = ev._history
    units = sum(_unit_nbytes(u) for us in h.units.values() for u in us)
    return units + sum(_cols_nbytes(p) for ps in h.tail.values() for p in ps)


def packets(rng: np.random.Generator, n: int, t0: int) -> dict[str, np.ndarray]:
    ips = np.array([f"10.0.0.{i}" for i in range(6)], dtype=object)
    proto = rng.choice(np.array(["TCP", "UDP", "TCP"], dtype=object), n)
    return {
        "ts": np.sort(t0 + rng.integers(0, 1000, n)).astype(np.int64),
        "src_ip": ips[rng.integers(0, 6, n)],
        "dst_ip": ips[rng.integers(0, 6, n)],
        "src_port": rng.integers(1024, 1030, n).astype(np.int64),
        "dst_port": rng.choice(np.array([80, 443, 53]), n).astype(np.int64),
        "protocol": proto,
        "length": rng.integers(0, 600, n).astype(np.int64),
        "tcp_flags": np.where(proto == "TCP", "S", "").astype(object),
    }


def test_two_key_fields_fed_pane_rows_with_their_raw_events(small_slack: Any) -> None:
    """The engine's path: per batch, each key field's pane rows with the same raw events (one
    retained unit for both). ROWS rules on src_ip and on dst_ip (WHERE protocol = 'UDP') stay
    exact over 400 batches, the history stays bounded and its byte count exact, and a late ROWS
    rule on dst_ip within what is held is exact at once."""
    rng = np.random.default_rng(8)
    texts = {
        "src": "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST 6 ROWS > 2000",
        "dst": "SELECT dst_ip FROM packets WHERE protocol = 'UDP' GROUP BY dst_ip HAVING "
        "COUNT(*) OVER LAST 4 ROWS >= 4 AND MAX(length) OVER LAST 3 SECONDS > 300 "
        "AND AVG(length) OVER LAST 9 ROWS > 250",
    }
    ev = Evaluator("shared", ci_p=2, pane_ms=1000)
    for name, text in texts.items():
        ev.add_rule(name, compile_rule(text, get_settings()))
    brutes = {name: Brute(text) for name, text in texts.items()}
    prev: dict[str, set[str]] = {name: set() for name in texts}
    held = []
    every = []
    fired = 0
    for b in range(400):
        cols = packets(rng, int(rng.integers(0, 12)), b * 1000)
        every.append(cols)
        if cols["ts"].shape[0]:
            for spec in ev.pane_specs("packets"):
                assert spec.needs_raw
                ev.apply_panes("packets", aggregate(cols, spec, 1000), key=spec.key, raw=cols)
        tau = (b + 1) * 1000
        got = sorted(ev.step(tau).rows())
        want = []
        for name, br in brutes.items():
            br.add(as_events(cols))
            cur = br.result(tau)
            want += [(tau, name, k, "ENTER") for k in cur - prev[name]]
            want += [(tau, name, k, "EXIT") for k in prev[name] - cur]
            prev[name] = cur
        assert got == sorted(want)
        fired += len(want)
        held.append(ev.history_rows())
    assert fired > 20
    assert max(held[100:]) <= 2 * 6 * (6 + 9) + 16 + 3 * 12  # tail + 3 s of batches, of ~2,200
    assert ev.history_nbytes == _history_nbytes(ev)
    late = "SELECT dst_ip FROM packets WHERE protocol = 'UDP' GROUP BY dst_ip HAVING MIN(length) OVER LAST 9 ROWS > 20"
    ev.add_rule("late", compile_rule(late, get_settings()))
    both = {k: np.concatenate([c[k] for c in every]) for k in every[0]}
    assert ev.evaluate_now("late", 400_000) == _brute_now(late, both, 400_000)


def test_newest_per_key() -> None:
    codes = np.array([0, 1, 0, 0, 1, 2, 0])
    sel = np.array([True, True, False, True, True, True, True])
    assert newest_per_key(codes, None, 2).tolist() == [False, True, False, True, True, True, True]
    assert newest_per_key(codes, sel, 2).tolist() == [False, True, False, True, True, True, True]
    assert newest_per_key(codes, sel, 3).tolist() == [True, True, False, True, True, True, True]
    assert not newest_per_key(codes, sel, 0).any()
