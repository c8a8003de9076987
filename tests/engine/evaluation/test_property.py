"""Random rules x random event streams: backtest shared == backtest naive == brute force.

The brute-force reference below is written from RULES.md alone: it walks the rule's AST (from
the parser -- the only library code it uses) over the raw events, with Python values and
``None`` for NULL, recomputing every aggregate from scratch at every lookup.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.evaluation.backtest import EventFile, iter_alerts
from engine.evaluation.evaluator import Evaluator
from subscriptions import rule_ast as A
from subscriptions.compiler import compile_rule
from subscriptions.rule_parser import parse_rule
from tidewatch.settings import get_settings

SYMBOLS = ["A", "B", "C", "D"]
IPS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


# ---------------------------------------------------------------- the reference
def _row_ok(c: A.RowCond | None, e: dict[str, Any]) -> bool:
    if c is None:
        return True
    if isinstance(c, A.RowCmp):
        return _cmp(e[c.field], c.op, c.value)
    if isinstance(c, A.RowIn):
        return any(e[c.field] == v for v in c.values)
    if isinstance(c, A.RowBetween):
        return c.lo <= e[c.field] <= c.hi  # type: ignore[operator]
    if isinstance(c, A.RowAnd):
        return all(_row_ok(x, e) for x in c.items)
    if isinstance(c, A.RowOr):
        return any(_row_ok(x, e) for x in c.items)
    if isinstance(c, A.RowNot):
        return not _row_ok(c.item, e)
    raise TypeError(c)


def _cmp(a: Any, op: str, b: Any) -> bool:
    if a is None or b is None:
        return False
    return {
        ">": a > b,
        ">=": a >= b,
        "<": a < b,
        "<=": a <= b,
        "=": a == b,
        "!=": a != b,
    }[op]


class Reference:
    """Brute-force evaluation of one rule at one time over a list of events (in arrival order)."""

    def __init__(self, text: str) -> None:
        self.rule = parse_rule(text, get_settings())

    def longest(self) -> int | None:
        ws = [a.window.start_ms for a in A.iter_aggs(self.rule.having) if isinstance(a.window, A.TimeWindow)]
        return max(ws) if ws else None

    def result(self, events: list[dict[str, Any]], tau: int) -> set[str]:
        applied = sorted(
            (e for e in events if e["ts"] <= tau), key=lambda e: e["ts"]
        )  # stable: ties by arrival
        W = self.longest()
        key = self.rule.key
        if W is None:
            domain = {e[key] for e in applied}
        else:
            domain = {e[key] for e in applied if tau - W < e["ts"] <= tau}
        out = set()
        for k in domain:
            mine = [e for e in applied if e[key] == k and _row_ok(self.rule.where, e)]
            if self._cond(self.rule.having, mine, tau):
                out.add(k)
        return out

    def _cond(self, c: A.Cond, rows: list[dict[str, Any]], tau: int) -> bool:
        if isinstance(c, A.Cmp):
            return _cmp(self._expr(c.left, rows, tau), c.op, self._expr(c.right, rows, tau))
        if isinstance(c, A.Between):
            x = self._expr(c.expr, rows, tau)
            return _cmp(x, ">=", self._expr(c.lo, rows, tau)) and _cmp(x, "<=", self._expr(c.hi, rows, tau))
        if isinstance(c, A.And):
            return all(self._cond(x, rows, tau) for x in c.items)
        if isinstance(c, A.Or):
            return any(self._cond(x, rows, tau) for x in c.items)
        if isinstance(c, A.Not):
            return not self._cond(c.item, rows, tau)
        raise TypeError(c)

    def _expr(self, e: A.Expr, rows: list[dict[str, Any]], tau: int) -> float | None:
        if isinstance(e, A.Num):
            return e.value
        if isinstance(e, A.Neg):
            v = self._expr(e.operand, rows, tau)
            return None if v is None else -v
        if isinstance(e, A.BinOp):
            a, b = self._expr(e.left, rows, tau), self._expr(e.right, rows, tau)
            if a is None or b is None:
                return None
            if e.op == "+":
                return a + b
            if e.op == "-":
                return a - b
            if e.op == "*":
                return a * b
            return None if b == 0 else a / b
        assert isinstance(e, A.Agg)
        sel = [r for r in rows if _row_ok(e.filter, r)]
        w = e.window
        if isinstance(w, A.RowsWindow):
            sel = sel[-w.n :]
        else:
            sel = [r for r in sel if tau - w.start_ms < r["ts"] <= tau - w.end_ms]
        if e.func == "COUNT":
            return float(len({r[str(e.field)] for r in sel})) if e.distinct else float(len(sel))
        vals = [float(r[e.field]) for r in sel]  # type: ignore[index]
        # SUM is the float64 nearest to the exact sum of the values (math.fsum), whatever the
        # order or grouping of the additions; AVG divides that by the count
        if e.func == "SUM":
            return math.fsum(vals)
        if not vals:
            return None
        return {
            "AVG": lambda: math.fsum(vals) / len(vals),
            "MIN": lambda: min(vals),
            "MAX": lambda: max(vals),
            "FIRST": lambda: vals[0],
            "LAST": lambda: vals[-1],
        }[e.func]()


def reference_alerts(
    rules: list[tuple[str, str]], events: dict[str, list[dict[str, Any]]], every: int
) -> list[tuple]:
    all_ts = [e["ts"] for evs in events.values() for e in evs]
    if not all_ts:
        return []
    t0 = min(all_ts) // every * every
    taus = [t0]
    while taus[-1] < max(all_ts):
        taus.append(taus[-1] + every)
    refs = [(name, Reference(text)) for name, text in rules]
    prev: dict[str, set[str]] = {name: set() for name, _ in rules}
    out = []
    for tau in taus:
        rows = []
        for name, ref in refs:
            cur = ref.result(events[ref.rule.stream], tau)
            rows += [(tau, name, k, "ENTER") for k in cur - prev[name]]
            rows += [(tau, name, k, "EXIT") for k in prev[name] - cur]
            prev[name] = cur
        out += sorted(rows, key=lambda r: (r[1], r[2]))
    return out


# ---------------------------------------------------------------- random rules
TRADE_NUMERIC = ["price", "size"]
PKT_NUMERIC = ["length", "dst_port"]


@st.composite
def windows(draw: Any) -> str:
    kind = draw(st.sampled_from(["last", "last", "last", "hist", "rows", "ms"]))
    if kind == "last":
        return f"LAST {draw(st.integers(1, 8))} SECONDS"
    if kind == "ms":
        return f"LAST {draw(st.sampled_from([500, 1500, 2500]))} MILLISECONDS"
    if kind == "hist":
        m = draw(st.integers(0, 4))
        return f"{m + draw(st.integers(1, 5))} SECONDS TO {m} SECONDS AGO"
    return f"LAST {draw(st.integers(1, 4))} ROWS"


@st.composite
def row_conds(draw: Any, stream: str, depth: int = 0) -> str:
    choice = draw(st.integers(0, 5 if depth < 2 else 2))
    if stream == "trades":
        simple = [
            f"side = '{draw(st.sampled_from(['BID', 'ASK', 'UNKNOWN']))}'",
            f"exchange {draw(st.sampled_from(['=', '!=']))} '{draw(st.sampled_from(['X', 'Y', 'Z']))}'",
            f"price {draw(st.sampled_from(['>', '>=', '<', '<=']))} {draw(st.sampled_from([2, 5, 7.5]))}",
            "exchange IN ('X', 'Z')",
            f"size BETWEEN {draw(st.integers(0, 10))} AND {draw(st.integers(5, 30))}",
        ]
    else:
        simple = [
            f"protocol = '{draw(st.sampled_from(['TCP', 'UDP']))}'",
            f"tcp_flags {draw(st.sampled_from(['=', '!=']))} '{draw(st.sampled_from(['S', '', 'SA']))}'",
            "dst_port IN (80, 443)",
            f"length > {draw(st.integers(0, 1000))}",
        ]
    if choice <= 2:
        return draw(st.sampled_from(simple))
    a = draw(row_conds(stream, depth + 1))
    b = draw(row_conds(stream, depth + 1))
    if choice == 3:
        return f"({a} AND {b})"
    if choice == 4:
        return f"({a} OR {b})"
    return f"NOT ({a})"


@st.composite
def aggs(draw: Any, stream: str) -> str:
    numeric = TRADE_NUMERIC if stream == "trades" else PKT_NUMERIC
    func = draw(
        st.sampled_from(["COUNT", "COUNT", "SUM", "SUM", "AVG", "MIN", "MAX", "FIRST", "LAST", "DISTINCT"])
    )
    if func == "COUNT":
        arg = draw(st.sampled_from(["*", numeric[0]]))
    elif func == "DISTINCT":
        func, arg = (
            "COUNT",
            "DISTINCT "
            + draw(st.sampled_from(numeric + (["exchange"] if stream == "trades" else ["protocol"]))),
        )
    else:
        arg = draw(st.sampled_from(numeric))
    flt = f" FILTER (WHERE {draw(row_conds(stream))})" if draw(st.booleans()) and draw(st.booleans()) else ""
    return f"{func}({arg}){flt} OVER {draw(windows())}"


@st.composite
def exprs(draw: Any, stream: str) -> str:
    kind = draw(st.integers(0, 5))
    a = draw(aggs(stream))
    if kind <= 2:
        return a
    if kind == 3:
        return f"{a} {draw(st.sampled_from(['+', '-', '*', '/']))} {draw(st.sampled_from(['0', '2', '0.5']))}"
    if kind == 4:
        return f"{a} {draw(st.sampled_from(['+', '-', '*', '/']))} {draw(aggs(stream))}"
    return f"-({a})"


@st.composite
def atoms(draw: Any, stream: str) -> str:
    kind = draw(st.integers(0, 4))
    if kind <= 1:  # an index-friendly threshold
        field = "size" if stream == "trades" else "length"
        agg = draw(st.sampled_from(["COUNT(*)", f"SUM({field})"]))
        flt = f" FILTER (WHERE {draw(row_conds(stream))})" if draw(st.booleans()) else ""
        T = draw(st.integers(1, 8))
        thr = draw(st.sampled_from([0, 0.5, 1, 2, 3, 5, 8, 20, 60, 150, 1000]))
        op = draw(st.sampled_from([">", ">=", "=", "<", "<=", "!="]))
        return f"{agg}{flt} OVER LAST {T} SECONDS {op} {thr}"
    left = draw(exprs(stream))
    if kind == 2:
        return f"{left} BETWEEN {draw(st.sampled_from([0, 1, 2.5]))} AND {draw(st.sampled_from([3, 10, 40]))}"
    op = draw(st.sampled_from([">", ">=", "<", "<=", "=", "!="]))
    right = draw(st.one_of(st.sampled_from(["0", "1", "2", "5", "12.5", "1 / 0"]), exprs(stream)))
    return f"{left} {op} {right}"


@st.composite
def conds(draw: Any, stream: str, depth: int = 0) -> str:
    choice = draw(st.integers(0, 5 if depth < 2 else 1))
    if choice <= 1:
        return draw(atoms(stream))
    a = draw(conds(stream, depth + 1))
    b = draw(conds(stream, depth + 1))
    if choice == 2:
        return f"{a} AND {b}"
    if choice == 3:
        return f"({a}) OR ({b})"
    if choice == 4:
        return f"NOT ({a})"
    return f"({a} OR {b}) AND {draw(atoms(stream))}"


@st.composite
def rules(draw: Any) -> str:
    stream = draw(st.sampled_from(["trades", "trades", "packets"]))
    key = "symbol" if stream == "trades" else draw(st.sampled_from(["src_ip", "dst_ip"]))
    where = f" WHERE {draw(row_conds(stream))}" if draw(st.booleans()) and draw(st.booleans()) else ""
    return f"SELECT {key} FROM {stream}{where} GROUP BY {key} HAVING {draw(conds(stream))}"


# ---------------------------------------------------------------- random events
@st.composite
def trade_events(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 40))
    out = []
    for _ in range(n):
        out.append(
            {
                "symbol": draw(st.sampled_from(SYMBOLS)),
                "ts": draw(st.sampled_from([0, 250, 500, 1000])) + draw(st.integers(0, 12)) * 1000,
                # two decimals, like real prices: float64 sums of such values depend on the
                # grouping of the additions, the engine's exact sums do not
                "price": draw(st.integers(50, 1000)) / 100,
                "size": draw(st.integers(0, 50)),
                "side": draw(st.sampled_from(["BID", "ASK", "UNKNOWN"])),
                "exchange": draw(st.sampled_from(["X", "Y", "Z"])),
            }
        )
    return out


@st.composite
def packet_events(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 30))
    out = []
    for _ in range(n):
        proto = draw(st.sampled_from(["TCP", "UDP"]))
        out.append(
            {
                "ts": draw(st.sampled_from([0, 500, 999])) + draw(st.integers(0, 12)) * 1000,
                "src_ip": draw(st.sampled_from(IPS)),
                "dst_ip": draw(st.sampled_from(IPS)),
                "src_port": draw(st.integers(1024, 1030)),
                "dst_port": draw(st.sampled_from([80, 443, 53])),
                "protocol": proto,
                "length": draw(st.integers(0, 600)),
                "tcp_flags": draw(st.sampled_from(["S", "SA", ""])) if proto == "TCP" else "",
            }
        )
    return out


def to_file(stream: str, events: list[dict[str, Any]]) -> EventFile:
    fields = {
        "trades": ["symbol", "ts", "price", "size", "side", "exchange"],
        "packets": ["ts", "src_ip", "dst_ip", "src_port", "dst_port", "protocol", "length", "tcp_flags"],
    }[stream]
    order = sorted(range(len(events)), key=lambda i: events[i]["ts"])
    cols = {}
    for f in fields:
        vals = [events[i][f] for i in order]
        if f == "price":
            cols[f] = np.array(vals, dtype=np.float64)
        elif isinstance(events[0][f] if events else "", str):
            cols[f] = np.array(vals, dtype=object)
        else:
            cols[f] = np.array(vals, dtype=np.int64)
    if not events:
        cols = {
            f: np.zeros(0, np.int64 if f in ("ts", "size", "length", "src_port", "dst_port") else object)
            for f in fields
        }
        if stream == "trades":
            cols["price"] = np.zeros(0)
    return EventFile(stream, cols)


def run(
    strategy: str, rules_: list[tuple[str, str]], files: list[EventFile], every: int, p: int
) -> list[tuple]:
    plans = [(n, t, compile_rule(t, get_settings())) for n, t in rules_]
    return list(iter_alerts(plans, files, every, evaluator=Evaluator(strategy, ci_p=p)))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    rule_texts=st.lists(rules(), min_size=1, max_size=4),
    trades=trade_events(),
    packets=packet_events(),
    every=st.sampled_from([500, 1000, 1500]),
    p=st.sampled_from([1, 2, 8]),
)
def test_shared_equals_naive_equals_brute_force(
    rule_texts: list[str], trades: list[dict[str, Any]], packets: list[dict[str, Any]], every: int, p: int
) -> None:
    named = [(f"r{i}", t) for i, t in enumerate(rule_texts)]
    files = [to_file("trades", trades), to_file("packets", packets)]
    expect = reference_alerts(named, {"trades": trades, "packets": packets}, every)
    shared = run("shared", named, files, every, p)
    naive = run("naive", named, files, every, p)
    assert shared == naive
    assert shared == expect


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    thresholds=st.lists(st.sampled_from([0, 1, 2, 3, 4, 6, 9, 15, 40, 100, 400]), min_size=2, max_size=12),
    ops=st.lists(st.sampled_from([">", ">=", "="]), min_size=12, max_size=12),
    trades=trade_events(),
)
def test_grouped_threshold_rules_match_the_reference(
    thresholds: list[int], ops: list[str], trades: list[dict[str, Any]]
) -> None:
    """Many single-threshold rules on one index and window: the grouped lookup path."""
    named = []
    for i, (thr, op) in enumerate(zip(thresholds, ops, strict=False)):
        agg = "COUNT(*)" if i % 2 else "SUM(size)"
        named.append(
            (
                f"g{i:02d}",
                f"SELECT symbol FROM trades GROUP BY symbol HAVING {agg} OVER LAST 4 SECONDS {op} {thr}",
            )
        )
    files = [to_file("trades", trades)]
    expect = reference_alerts(named, {"trades": trades, "packets": []}, 1000)
    assert run("shared", named, files, 1000, 2) == expect
    assert run("naive", named, files, 1000, 2) == expect


@st.composite
def extra_atoms(draw: Any) -> str:
    """An aggregate compared to a constant, either way round, maybe negated: the extra atoms
    of a grouped ``driver AND ...`` rule.  Each function comes over two or three windows (time
    windows, one of them historical, and ROWS windows), which the check reads together."""
    func = draw(
        st.sampled_from(
            [
                "AVG(price)",
                "MIN(price)",
                "MAX(size)",
                "SUM(size) FILTER (WHERE side = 'ASK')",
                "COUNT(*)",
                "FIRST(price)",
                "LAST(price)",
                "COUNT(DISTINCT exchange)",
            ]
        )
    )
    window = draw(
        st.sampled_from(
            ["LAST 2 SECONDS", "LAST 3 SECONDS", "3 SECONDS TO 1 SECONDS AGO", "LAST 2 ROWS", "LAST 3 ROWS"]
        )
    )
    agg = f"{func} OVER {window}"
    op = draw(st.sampled_from([">", ">=", "<", "<=", "=", "!="]))
    c = draw(st.sampled_from([0, 1, 2, 5, 7.5, 20]))
    atom = f"{agg} {op} {c}" if draw(st.booleans()) else f"{c} {op} {agg}"
    return f"NOT ({atom})" if draw(st.integers(0, 4)) == 0 else atom


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    thresholds=st.lists(st.sampled_from([0, 1, 2, 3, 6, 15, 40]), min_size=2, max_size=10),
    extras=st.lists(st.lists(extra_atoms(), min_size=0, max_size=2), min_size=10, max_size=10),
    trades=trade_events(),
)
def test_grouped_conjunctive_rules_match_the_reference(
    thresholds: list[int], extras: list[list[str]], trades: list[dict[str, Any]]
) -> None:
    """Rules ``driver AND more threshold atoms`` sharing one (index, window) are looked up with the
    driver's group, their extra atoms checked on the group's pairs: equal to the reference."""
    named = []
    for i, thr in enumerate(thresholds):
        agg = "COUNT(*)" if i % 2 else "SUM(size)"
        cond = " AND ".join([f"{agg} OVER LAST 4 SECONDS > {thr}", *extras[i]])
        named.append((f"c{i:02d}", f"SELECT symbol FROM trades GROUP BY symbol HAVING {cond}"))
    files = [to_file("trades", trades)]
    expect = reference_alerts(named, {"trades": trades, "packets": []}, 1000)
    ev = Evaluator("shared", ci_p=2)
    plans = [(n, t, compile_rule(t, get_settings())) for n, t in named]
    assert list(iter_alerts(plans, files, 1000, evaluator=ev)) == expect
    grouped = sum(len(g.members) for g in ev.groups.values())
    assert grouped == len(named)  # every rule went through a group: the path under test
    assert run("naive", named, files, 1000, 2) == expect


def test_extra_atoms_of_one_function_over_several_windows_match_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Grouped rules whose extra atoms read each function over several windows (time, historical
    and ROWS): the check reads those of one structure and function together
    (``Lookup.read_over``), and the alerts equal the reference's."""
    from engine.evaluation.lookup import Lookup

    reads = []
    orig = Lookup.read_over

    def counted(self: Lookup, s: Any, specs: Any, which: Any, keys: Any) -> Any:
        reads.append(len(specs))
        return orig(self, s, specs, which, keys)

    monkeypatch.setattr(Lookup, "read_over", counted)
    rng = np.random.default_rng(11)
    trades = [
        {
            "symbol": SYMBOLS[int(rng.integers(0, 4))],
            "ts": int(rng.integers(0, 12_000)),
            "price": int(rng.integers(50, 1000)) / 100,
            "size": int(rng.integers(0, 50)),
            "side": ("BID", "ASK", "UNKNOWN")[int(rng.integers(0, 3))],
            "exchange": ("X", "Y", "Z")[int(rng.integers(0, 3))],
        }
        for _ in range(300)
    ]
    funcs = ["AVG(price)", "MIN(price)", "MAX(size)", "COUNT(*)", "FIRST(price)", "LAST(price)",
             "COUNT(DISTINCT exchange)", "SUM(size) FILTER (WHERE side = 'ASK')"]  # fmt: skip
    wins = ["LAST 2 SECONDS", "LAST 3 SECONDS", "3 SECONDS TO 1 SECONDS AGO", "LAST 2 ROWS", "LAST 3 ROWS"]
    named = []
    for i in range(24):
        f = funcs[i % len(funcs)]
        op, c = (">", 1) if f.startswith(("COUNT", "SUM", "MAX(size)")) else (">", 5)
        atom = f"{f} OVER {wins[i % len(wins)]} {op} {c}"
        other = f"{f} OVER {wins[(i + 2) % len(wins)]} <= {c * 20}"
        having = f"COUNT(*) OVER LAST 4 SECONDS > {i % 3} AND {atom} AND {other}"
        named.append((f"w{i:02d}", f"SELECT symbol FROM trades GROUP BY symbol HAVING {having}"))
    files = [to_file("trades", trades)]
    expect = reference_alerts(named, {"trades": trades, "packets": []}, 1000)
    assert run("shared", named, files, 1000, 2) == expect
    assert len(expect) > 50  # keys enter and leave: the atoms decide
    assert reads and max(reads) >= 3  # several windows of a function in one read
