"""The grammar of RULES.md: every construct, precedence, case-insensitivity, the examples."""

from __future__ import annotations

import json

import pytest

from subscriptions import rule_ast as A
from subscriptions.compiler import Plan, compile_rule, explain
from subscriptions.rule_parser import parse_rule
from tidewatch.settings import get_settings

HEAD = "SELECT symbol FROM trades GROUP BY symbol HAVING "
C1 = "COUNT(*) OVER LAST 1 MINUTE"

#: every example of RULES.md, verbatim
RULES_MD_EXAMPLES = [
    "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDS > 1000",
    """SELECT symbol FROM trades WHERE exchange = 'NASDAQ' GROUP BY symbol
HAVING LAST(price) OVER LAST 20 MINUTES BETWEEN 20 AND 200
   AND LAST(price) OVER LAST 20 MINUTES < 0.98 * FIRST(price) OVER LAST 20 MINUTES
   AND SUM(size) FILTER (WHERE side = 'ASK') OVER LAST 2 MINUTES >= 0.7 * SUM(size) OVER LAST 2 MINUTES""",
    """SELECT symbol FROM trades GROUP BY symbol
HAVING LAST(price) OVER LAST 30 MINUTES BETWEEN 20 AND 200
   AND MAX(price) OVER LAST 30 MINUTES - MIN(price) OVER LAST 30 MINUTES > 0.03 * LAST(price) OVER LAST 30 MINUTES
   AND AVG(size) OVER LAST 5 MINUTES > 4 * AVG(size) OVER LAST 30 MINUTES""",
    "SELECT symbol FROM trades GROUP BY symbol HAVING AVG(size) OVER 2 MINUTES TO 1 MINUTE AGO > 500",
    """SELECT dst_ip FROM packets WHERE protocol = 'TCP' AND tcp_flags = 'S'
GROUP BY dst_ip HAVING COUNT(*) OVER LAST 10 SECONDS > 500""",
    "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST 60 SECONDS > 100",
    "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST 1 MINUTE > 10000000",
]


def having(text: str) -> A.Cond:
    return parse_rule(HEAD + text, get_settings()).having


def agg(text: str) -> A.Agg:
    c = having(text + " > 0")
    assert isinstance(c, A.Cmp) and isinstance(c.left, A.Agg)
    return c.left


@pytest.mark.parametrize("text", RULES_MD_EXAMPLES)
def test_rules_md_examples_parse_compile_and_explain(text: str) -> None:
    plan = compile_rule(text, get_settings())
    assert explain(plan)
    data = plan.to_json()
    back = Plan.from_json(json.loads(json.dumps(data)))
    assert back.to_json() == data
    assert back.rule == plan.rule


@pytest.mark.parametrize("text", RULES_MD_EXAMPLES)
def test_canonical_text_round_trips(text: str) -> None:
    rule = parse_rule(text, get_settings())
    assert parse_rule(A.rule_text(rule), get_settings()) == rule


def test_rules_md_example_structures() -> None:
    r = parse_rule(RULES_MD_EXAMPLES[1], get_settings())
    assert r.stream == "trades" and r.key == "symbol"
    assert r.where == A.RowCmp("exchange", "=", "NASDAQ")
    assert isinstance(r.having, A.And) and len(r.having.items) == 3
    between = r.having.items[0]
    assert isinstance(between, A.Between)
    assert between.expr == A.Agg("LAST", "price", False, None, A.TimeWindow(1_200_000))
    ask = r.having.items[2]
    assert isinstance(ask, A.Cmp) and ask.op == ">="
    assert ask.left == A.Agg("SUM", "size", False, A.RowCmp("side", "=", "ASK"), A.TimeWindow(120_000))
    hist = parse_rule(RULES_MD_EXAMPLES[3], get_settings()).having
    assert isinstance(hist, A.Cmp) and hist.left == A.Agg(
        "AVG", "size", False, None, A.TimeWindow(120_000, 60_000)
    )
    pkt = parse_rule(RULES_MD_EXAMPLES[5], get_settings())
    assert pkt.having.left == A.Agg("COUNT", "dst_port", True, None, A.TimeWindow(60_000))  # type: ignore[union-attr]


# ---------------------------------------------------------------- constructs
@pytest.mark.parametrize("op", [">", ">=", "<", "<=", "=", "!="])
def test_comparison_operators(op: str) -> None:
    c = having(f"{C1} {op} 5")
    assert isinstance(c, A.Cmp) and c.op == op and c.right == A.Num(5.0)


def test_sql_not_equal_spelling() -> None:
    assert having(f"{C1} <> 5") == having(f"{C1} != 5")


@pytest.mark.parametrize(
    ("func", "arg", "field", "distinct"),
    [
        ("COUNT", "*", None, False),
        ("COUNT", "size", "size", False),
        ("COUNT", "DISTINCT exchange", "exchange", True),
        ("SUM", "size", "size", False),
        ("AVG", "price", "price", False),
        ("MIN", "price", "price", False),
        ("MAX", "price", "price", False),
        ("FIRST", "price", "price", False),
        ("LAST", "price", "price", False),
    ],
)
def test_aggregate_functions(func: str, arg: str, field: str | None, distinct: bool) -> None:
    a = agg(f"{func}({arg}) OVER LAST 10 SECONDS")
    assert (a.func, a.field, a.distinct, a.filter) == (func, field, distinct, None)


@pytest.mark.parametrize(
    ("window", "expect"),
    [
        ("LAST 1 SECOND", A.TimeWindow(1000)),
        ("LAST 10 SECONDS", A.TimeWindow(10_000)),
        ("LAST 1 MINUTE", A.TimeWindow(60_000)),
        ("LAST 2 MINUTES", A.TimeWindow(120_000)),
        ("LAST 1 HOUR", A.TimeWindow(3_600_000)),
        ("LAST 3 HOURS", A.TimeWindow(10_800_000)),
        ("LAST 1 DAY", A.TimeWindow(86_400_000)),
        ("LAST 2 DAYS", A.TimeWindow(172_800_000)),
        ("LAST 1.5 MINUTES", A.TimeWindow(90_000)),
        ("LAST 250 MILLISECONDS", A.TimeWindow(250)),
        ("2 MINUTES TO 1 MINUTE AGO", A.TimeWindow(120_000, 60_000)),
        ("1 HOUR TO 30 MINUTES AGO", A.TimeWindow(3_600_000, 1_800_000)),
        ("10 SECONDS TO 0 SECONDS AGO", A.TimeWindow(10_000, 0)),
        ("LAST 5 ROWS", A.RowsWindow(5)),
        ("LAST 1 ROW", A.RowsWindow(1)),
    ],
)
def test_windows(window: str, expect: A.Window) -> None:
    assert agg(f"SUM(size) OVER {window}").window == expect


def test_filter_clause() -> None:
    a = agg("SUM(size) FILTER (WHERE side = 'ASK' AND price > 10) OVER LAST 1 MINUTE")
    assert a.filter == A.RowAnd((A.RowCmp("side", "=", "ASK"), A.RowCmp("price", ">", 10.0)))


@pytest.mark.parametrize(
    ("where", "expect"),
    [
        ("exchange = 'NASDAQ'", A.RowCmp("exchange", "=", "NASDAQ")),
        ("price >= 10.5", A.RowCmp("price", ">=", 10.5)),
        ("price > -1", A.RowCmp("price", ">", -1.0)),
        ("size != 0", A.RowCmp("size", "!=", 0.0)),
        ("exchange IN ('NYSE', 'ARCA')", A.RowIn("exchange", ("NYSE", "ARCA"))),
        ("size IN (1, 2, 3)", A.RowIn("size", (1.0, 2.0, 3.0))),
        ("price BETWEEN 10 AND 20", A.RowBetween("price", 10.0, 20.0)),
        ("NOT side = 'BID'", A.RowNot(A.RowCmp("side", "=", "BID"))),
        ("(side = 'BID')", A.RowCmp("side", "=", "BID")),
        ("exchange = 'O''Hare'", A.RowCmp("exchange", "=", "O'Hare")),
        ("exchange = ''", A.RowCmp("exchange", "=", "")),
    ],
)
def test_row_conditions(where: str, expect: A.RowCond) -> None:
    r = parse_rule(f"SELECT symbol FROM trades WHERE {where} GROUP BY symbol HAVING {C1} > 1", get_settings())
    assert r.where == expect


def test_packets_fields_and_keys() -> None:
    r = parse_rule(
        "SELECT dst_ip FROM packets WHERE protocol = 'TCP' AND tcp_flags = '' AND dst_port IN (80, 443) "
        "GROUP BY dst_ip HAVING SUM(length) OVER LAST 1 MINUTE > 1 AND MAX(src_port) OVER LAST 3 ROWS > 0",
        get_settings(),
    )
    assert (r.stream, r.key) == ("packets", "dst_ip")


def test_arithmetic() -> None:
    c = having(f"{C1} + 2 * {C1} - -3 / 4 > 0")
    assert isinstance(c, A.Cmp)
    count = agg(f"{C1}")
    # (C1 + (2 * C1)) - ((-3) / 4)
    assert c.left == A.BinOp(
        "-",
        A.BinOp("+", count, A.BinOp("*", A.Num(2.0), count)),
        A.BinOp("/", A.Neg(A.Num(3.0)), A.Num(4.0)),
    )


def test_between_in_having() -> None:
    c = having(f"{C1} BETWEEN 1 AND 2 * 5")
    assert c == A.Between(agg(C1), A.Num(1.0), A.BinOp("*", A.Num(2.0), A.Num(5.0)))


def test_comments_and_layout() -> None:
    a = parse_rule(
        f"-- a comment\nSELECT symbol\n  FROM trades -- trailing\nGROUP BY symbol\nHAVING {C1}\n > 5\n",
        get_settings(),
    )
    assert a == parse_rule(HEAD + f"{C1} > 5", get_settings())


# ---------------------------------------------------------------- precedence
def test_and_binds_tighter_than_or() -> None:
    x, y, z = (f"{C1} > {i}" for i in (1, 2, 3))
    c = having(f"{x} OR {y} AND {z}")
    assert isinstance(c, A.Or) and isinstance(c.items[1], A.And)
    c = having(f"{x} AND {y} OR {z}")
    assert isinstance(c, A.Or) and isinstance(c.items[0], A.And)
    c = having(f"({x} OR {y}) AND {z}")
    assert isinstance(c, A.And) and isinstance(c.items[0], A.Or)


def test_not_binds_tighter_than_and() -> None:
    x, y = (f"{C1} > {i}" for i in (1, 2))
    c = having(f"NOT {x} AND {y}")
    assert isinstance(c, A.And) and isinstance(c.items[0], A.Not)
    c = having(f"NOT ({x} AND {y})")
    assert isinstance(c, A.Not) and isinstance(c.item, A.And)


def test_between_and_is_not_a_conjunction() -> None:
    c = having(f"{C1} BETWEEN 1 AND 5 AND {C1} > 2")
    assert isinstance(c, A.And) and isinstance(c.items[0], A.Between) and isinstance(c.items[1], A.Cmp)


def test_chains_are_flat() -> None:
    x, y, z = (f"{C1} > {i}" for i in (1, 2, 3))
    c = having(f"{x} AND {y} AND {z}")
    assert isinstance(c, A.And) and len(c.items) == 3
    c = having(f"{x} OR {y} OR {z}")
    assert isinstance(c, A.Or) and len(c.items) == 3


def test_arithmetic_precedence_and_associativity() -> None:
    n = agg(C1)
    assert having(f"1 + 2 * {C1} > 0").left == A.BinOp("+", A.Num(1.0), A.BinOp("*", A.Num(2.0), n))  # type: ignore[union-attr]
    assert having(f"(1 + 2) * {C1} > 0").left == A.BinOp("*", A.BinOp("+", A.Num(1.0), A.Num(2.0)), n)  # type: ignore[union-attr]
    assert having(f"{C1} - 1 - 2 > 0").left == A.BinOp("-", A.BinOp("-", n, A.Num(1.0)), A.Num(2.0))  # type: ignore[union-attr]
    assert having(f"{C1} / 2 / 4 > 0").left == A.BinOp("/", A.BinOp("/", n, A.Num(2.0)), A.Num(4.0))  # type: ignore[union-attr]
    assert having(f"-{C1} * 2 > 0").left == A.BinOp("*", A.Neg(n), A.Num(2.0))  # type: ignore[union-attr]


def test_row_condition_precedence() -> None:
    r = parse_rule(
        f"SELECT symbol FROM trades WHERE side = 'ASK' OR side = 'BID' AND size > 5 GROUP BY symbol HAVING {C1} > 0",
        get_settings(),
    )
    assert isinstance(r.where, A.RowOr) and isinstance(r.where.items[1], A.RowAnd)
    r = parse_rule(
        f"SELECT symbol FROM trades WHERE NOT side = 'ASK' AND size > 5 GROUP BY symbol HAVING {C1} > 0",
        get_settings(),
    )
    assert isinstance(r.where, A.RowAnd) and isinstance(r.where.items[0], A.RowNot)


# ---------------------------------------------------------------- case
def test_keywords_are_case_insensitive() -> None:
    upper = parse_rule(RULES_MD_EXAMPLES[1], get_settings())
    lower = parse_rule(RULES_MD_EXAMPLES[1].replace("NASDAQ", "@@").replace("ASK", "##").lower()
                       .replace("@@", "NASDAQ").replace("##", "ASK"), get_settings())  # fmt: skip
    assert lower == upper
    mixed = "sElEcT symbol FrOm trades gRoUp By symbol HaViNg CoUnT(*) oVeR lAsT 1 mInUtE > 5 AnD nOt SuM(size) OvEr 2 MiNuTeS tO 1 mInUtE aGo < 3"
    assert parse_rule(mixed, get_settings()) == parse_rule(
        mixed.upper().replace("SIZE", "size").replace("SYMBOL", "symbol").replace("TRADES", "trades"),
        get_settings(),
    )


def test_names_are_case_insensitive_but_strings_are_not() -> None:
    a = parse_rule(
        f"SELECT SYMBOL FROM Trades WHERE Exchange = 'Nasdaq' GROUP BY Symbol HAVING {C1} > 1", get_settings()
    )
    assert (a.stream, a.key) == ("trades", "symbol")
    assert a.where == A.RowCmp("exchange", "=", "Nasdaq")


def test_plan_json_is_plain_json() -> None:
    for text in RULES_MD_EXAMPLES:
        data = compile_rule(text, get_settings()).to_json()
        assert json.loads(json.dumps(data)) == data
