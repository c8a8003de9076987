"""A corpus of malformed rules: each is refused with a RuleError at the right line and column.

Each case names the rule, where the error must point -- an *anchor*: a substring of the rule
(its ``occurrence``-th appearance, 0-based, plus ``offset`` characters) or ``$END`` for the end
of the text -- and a fragment the message must contain.  Positions are computed here from the
rule text, independently of the parser.
"""

from __future__ import annotations

import pytest

from subscriptions.errors import RuleError
from subscriptions.rule_parser import parse_rule
from tidewatch.settings import get_settings

HEAD = "SELECT symbol FROM trades GROUP BY symbol HAVING "
GOOD = HEAD + "COUNT(*) OVER LAST 1 MINUTE > 5"
PKT = "SELECT src_ip FROM packets GROUP BY src_ip HAVING "


def _deep_not(n: int) -> str:
    return HEAD + "NOT " * n + "COUNT(*) OVER LAST 1 MINUTE > 5"


def _many_aggs(n: int) -> str:
    return HEAD + " AND ".join(["COUNT(*) OVER LAST 1 MINUTE > 5"] * n)


LIMITS = get_settings()

# (id, rule, anchor, occurrence, offset, message fragment)
CASES: list[tuple[str, str, str, int, int, str]] = [
    ("empty", "", "$START", 0, 0, "empty rule"),
    ("blank", "   ", "$START", 0, 0, "empty rule"),
    (
        "misspelled-select",
        "SELEC symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "SELEC",
        0,
        0,
        "unexpected",
    ),
    (
        "no-key",
        "SELECT FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "FROM",
        0,
        0,
        "unexpected",
    ),
    (
        "no-from",
        "SELECT symbol trades GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "trades",
        0,
        0,
        "unexpected",
    ),
    (
        "keyword-as-stream",
        "SELECT symbol FROM GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "GROUP",
        0,
        0,
        "unexpected",
    ),
    (
        "unknown-stream",
        "SELECT symbol FROM tardes GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "tardes",
        0,
        0,
        "did you mean 'trades'",
    ),
    (
        "unknown-stream-far",
        "SELECT symbol FROM quotes GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "quotes",
        0,
        0,
        "unknown stream 'quotes'",
    ),
    (
        "key-not-a-key",
        "SELECT price FROM trades GROUP BY price HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "price",
        0,
        0,
        "cannot be the key",
    ),
    (
        "key-unknown-packets",
        "SELECT srcip FROM packets GROUP BY srcip HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "srcip",
        0,
        0,
        "did you mean 'src_ip'",
    ),
    (
        "group-by-mismatch",
        "SELECT symbol FROM trades GROUP BY exchange HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "exchange",
        0,
        0,
        "must name the selected key",
    ),
    (
        "select-two-columns",
        "SELECT symbol, price FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        ",",
        0,
        0,
        "unexpected",
    ),
    (
        "missing-group-by",
        "SELECT symbol FROM trades HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "HAVING",
        0,
        0,
        "GROUP",
    ),
    (
        "group-without-by",
        "SELECT symbol FROM trades GROUP symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "symbol",
        1,
        0,
        "BY",
    ),
    (
        "missing-having",
        "SELECT symbol FROM trades GROUP BY symbol COUNT(*) OVER LAST 1 MINUTE > 5",
        "COUNT",
        0,
        0,
        "HAVING",
    ),
    ("end-after-having", HEAD.rstrip(), "$END", 0, 0, "end of the rule"),
    (
        "where-unknown-field",
        "SELECT symbol FROM trades WHERE exchang = 'X' GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "exchang",
        0,
        0,
        "did you mean 'exchange'",
    ),
    (
        "where-string-vs-number",
        "SELECT symbol FROM trades WHERE price = 'ten' GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "'ten'",
        0,
        0,
        "is a number",
    ),
    (
        "where-number-vs-string",
        "SELECT symbol FROM trades WHERE exchange = 5 GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "5",
        0,
        0,
        "is a string",
    ),
    (
        "where-bad-enum",
        "SELECT symbol FROM trades WHERE side = 'SELL' GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "'SELL'",
        0,
        0,
        "not a possible value of 'side'",
    ),
    (
        "where-double-quotes",
        'SELECT symbol FROM trades WHERE side = "ASK" GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5',
        '"',
        0,
        0,
        "single quotes",
    ),
    (
        "where-missing-literal",
        "SELECT symbol FROM trades WHERE exchange = GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "GROUP",
        0,
        0,
        "unexpected",
    ),
    (
        "where-in-empty",
        "SELECT symbol FROM trades WHERE exchange IN () GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        ")",
        0,
        0,
        "unexpected",
    ),
    (
        "where-in-no-paren",
        "SELECT symbol FROM trades WHERE exchange IN 'A' GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "'A'",
        0,
        0,
        "'('",
    ),
    (
        "where-in-mixed-types",
        "SELECT symbol FROM trades WHERE exchange IN ('A', 3) GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "3)",
        0,
        0,
        "is a string",
    ),
    (
        "where-between-no-and",
        "SELECT symbol FROM trades WHERE price BETWEEN 1 2 GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "2 GROUP",
        0,
        0,
        "AND",
    ),
    (
        "where-between-string",
        "SELECT symbol FROM trades WHERE size BETWEEN 1 AND 'x' GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "'x'",
        0,
        0,
        "is a number",
    ),
    (
        "where-unclosed-paren",
        "SELECT symbol FROM trades WHERE (exchange = 'A' GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "GROUP",
        0,
        0,
        "')'",
    ),
    (
        "where-double-equals",
        "SELECT symbol FROM trades WHERE size == 5 GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "==",
        0,
        1,
        "unexpected",
    ),
    (
        "where-aggregate",
        "SELECT symbol FROM trades WHERE COUNT(*) > 5 GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "COUNT",
        0,
        0,
        "unexpected",
    ),
    (
        "where-field-vs-field",
        "SELECT symbol FROM trades WHERE size > price GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "price",
        0,
        0,
        "unexpected",
    ),
    ("unknown-function", HEAD + "MEDIAN(price) OVER LAST 1 MINUTE > 5", "MEDIAN", 0, 0, "unexpected"),
    ("sum-star", HEAD + "SUM(*) OVER LAST 1 MINUTE > 5", "SUM", 0, 0, "SUM(*) is not allowed"),
    (
        "avg-distinct",
        HEAD + "AVG(DISTINCT size) OVER LAST 1 MINUTE > 5",
        "AVG",
        0,
        0,
        "DISTINCT is only allowed in COUNT",
    ),
    ("count-distinct-star", HEAD + "COUNT(DISTINCT *) OVER LAST 1 MINUTE > 5", "*", 0, 0, "unexpected"),
    ("sum-of-string", HEAD + "SUM(symbol) OVER LAST 1 MINUTE > 5", "SUM", 0, 0, "needs a numeric field"),
    ("max-of-string", HEAD + "MAX(side) OVER LAST 1 MINUTE > 5", "MAX", 0, 0, "needs a numeric field"),
    ("agg-unknown-field", HEAD + "SUM(prize) OVER LAST 1 MINUTE > 5", "prize", 0, 0, "did you mean 'price'"),
    (
        "packets-unknown-field",
        PKT + "SUM(price) OVER LAST 1 MINUTE > 5",
        "price",
        0,
        0,
        "unknown field 'price' on packets",
    ),
    ("count-two-args", HEAD + "COUNT(symbol, price) OVER LAST 1 MINUTE > 5", ",", 0, 0, "unexpected"),
    ("missing-over", HEAD + "COUNT(*) > 5", ">", 0, 0, "OVER"),
    ("missing-window", HEAD + "COUNT(*) OVER > 5", ">", 0, 0, "LAST"),
    ("bad-unit", HEAD + "COUNT(*) OVER LAST 5 parsecs > 5", "parsecs", 0, 0, "time unit"),
    ("window-zero", HEAD + "COUNT(*) OVER LAST 0 SECONDS > 5", "0 SECONDS", 0, 0, "must be positive"),
    ("window-negative", HEAD + "COUNT(*) OVER LAST -5 SECONDS > 5", "-5", 0, 0, "unexpected"),
    (
        "window-sub-ms",
        HEAD + "COUNT(*) OVER LAST 0.0001 SECONDS > 5",
        "0.0001",
        0,
        0,
        "whole number of milliseconds",
    ),
    (
        "historical-reversed",
        HEAD + "AVG(size) OVER 1 MINUTE TO 2 MINUTES AGO > 5",
        "1 MINUTE",
        0,
        0,
        "needs n > m",
    ),
    (
        "historical-equal",
        HEAD + "AVG(size) OVER 60 SECONDS TO 1 MINUTE AGO > 5",
        "60 SECONDS",
        0,
        0,
        "needs n > m",
    ),
    ("historical-no-ago", HEAD + "AVG(size) OVER 2 MINUTES TO 1 MINUTE > 5", ">", 0, 0, "AGO"),
    ("rows-fraction", HEAD + "AVG(size) OVER LAST 2.5 ROWS > 5", "2.5", 0, 0, "whole number of rows"),
    ("rows-zero", HEAD + "AVG(size) OVER LAST 0 ROWS > 5", "0 ROWS", 0, 0, "must be positive"),
    ("no-comparison", HEAD + "COUNT(*) OVER LAST 1 MINUTE", "$END", 0, 0, "comparison operator"),
    ("dangling-plus", HEAD + "COUNT(*) OVER LAST 1 MINUTE > 5 +", "$END", 0, 0, "end of the rule"),
    ("double-operator", HEAD + "COUNT(*) OVER LAST 1 MINUTE > > 5", ">", 1, 0, "unexpected"),
    ("unclosed-paren", HEAD + "(COUNT(*) OVER LAST 1 MINUTE > 5", "$END", 0, 0, "')'"),
    ("extra-paren", HEAD + "COUNT(*) OVER LAST 1 MINUTE > 5)", ")", 1, 0, "unexpected"),
    ("trailing-garbage", HEAD + "COUNT(*) OVER LAST 1 MINUTE > 5 foo", "foo", 0, 0, "unexpected"),
    ("and-without-rhs", HEAD + "COUNT(*) OVER LAST 1 MINUTE > 5 AND", "$END", 0, 0, "end of the rule"),
    (
        "or-or",
        HEAD + "COUNT(*) OVER LAST 1 MINUTE > 5 OR OR COUNT(*) OVER LAST 1 MINUTE > 1",
        "OR",
        1,
        0,
        "unexpected",
    ),
    ("field-in-having", HEAD + "price > 5", "price", 0, 0, "unexpected"),
    ("string-in-having", HEAD + "COUNT(*) OVER LAST 1 MINUTE > 'five'", "'five'", 0, 0, "unexpected"),
    ("no-aggregate", HEAD + "1 > 0", "1 > 0", 0, 0, "at least one aggregate"),
    (
        "filter-without-where",
        HEAD + "COUNT(*) FILTER (side = 'ASK') OVER LAST 1 MINUTE > 5",
        "side",
        0,
        0,
        "WHERE",
    ),
    (
        "filter-unknown-field",
        HEAD + "COUNT(*) FILTER (WHERE sid = 'ASK') OVER LAST 1 MINUTE > 5",
        "sid",
        0,
        0,
        "did you mean 'side'",
    ),
    (
        "filter-after-over",
        HEAD + "COUNT(*) OVER LAST 1 MINUTE FILTER (WHERE side = 'ASK') > 5",
        "FILTER",
        0,
        0,
        "unexpected",
    ),
    ("unexpected-character", HEAD + "COUNT(*) OVER LAST 1 MINUTE > 5 @", "@", 0, 0, "unexpected character"),
    ("number-too-large", HEAD + "COUNT(*) OVER LAST 1 MINUTE > 1e999", "1e999", 0, 0, "too large"),
    ("between-missing-and", HEAD + "COUNT(*) OVER LAST 1 MINUTE BETWEEN 1 5", "5", 0, 0, "AND"),
    (
        "multiline-line3",
        "SELECT symbol\nFROM trades\nGROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE >> 5",
        ">",
        1,
        0,
        "unexpected",
    ),
    (
        "multiline-field-line2",
        "SELECT symbol FROM trades\nWHERE exchnge = 'NASDAQ'\nGROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        "exchnge",
        0,
        0,
        "did you mean 'exchange'",
    ),
    (
        "multiline-end",
        "SELECT symbol FROM trades\nGROUP BY symbol\nHAVING SUM(size) OVER LAST 1 MINUTE >",
        "$END",
        0,
        0,
        "end of the rule",
    ),
    ("too-deep", _deep_not(LIMITS.max_rule_depth + 5), "NOT", LIMITS.max_rule_depth, 0, "nests"),
    (
        "too-many-aggregates",
        _many_aggs(LIMITS.max_rule_aggregates + 3),
        "COUNT",
        LIMITS.max_rule_aggregates,
        0,
        "aggregates; the limit",
    ),
    ("too-long", GOOD + " " * LIMITS.max_rule_chars, "$OFFSET", LIMITS.max_rule_chars, 0, "characters long"),
]


def expected_position(text: str, anchor: str, occurrence: int, offset: int) -> tuple[int, int]:
    if anchor == "$START":
        return (1, 1)
    if anchor == "$END":
        lines = text.split("\n")
        return (len(lines), len(lines[-1]) + 1)
    if anchor == "$OFFSET":
        idx = occurrence
    else:
        idx = -1
        for _ in range(occurrence + 1):
            idx = text.index(anchor, idx + 1)
        idx += offset
    before = text[:idx]
    return (before.count("\n") + 1, idx - (before.rfind("\n") + 1) + 1)


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 50
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("name", "text", "anchor", "occurrence", "offset", "fragment"), CASES, ids=[c[0] for c in CASES]
)
def test_malformed_rule_is_refused_at_the_right_place(
    name: str, text: str, anchor: str, occurrence: int, offset: int, fragment: str
) -> None:
    with pytest.raises(RuleError) as info:
        parse_rule(text, get_settings())
    err = info.value
    assert (err.line, err.column) == expected_position(text, anchor, occurrence, offset), err.display()
    assert fragment.lower() in (err.message + " " + " ".join(err.expected)).lower(), err.display()
    # the display shows the offending line and a caret under the column
    shown = err.display().splitlines()
    if err.snippet and len(err.snippet) <= 100:
        assert shown[1] == "  " + err.snippet
        assert shown[2] == "  " + " " * (err.column - 1) + "^"


def test_long_flat_chains_are_not_deep() -> None:
    """AND / OR chains are n-ary; long ones parse without hitting the depth limit or recursion."""
    text = HEAD + " OR ".join(["COUNT(*) OVER LAST 1 MINUTE > 5"] * 30)
    parse_rule(text, get_settings())
    where = " OR ".join(f"size = {i}" for i in range(250))
    parse_rule(
        f"SELECT symbol FROM trades WHERE {where} GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5",
        get_settings(),
    )


def test_arithmetic_nesting_is_limited() -> None:
    deep = HEAD + "(" * 40 + "COUNT(*) OVER LAST 1 MINUTE" + " + 1)" * 40 + " > 5"
    with pytest.raises(RuleError, match="nests"):
        parse_rule(deep, get_settings())


def test_good_rule_of_the_corpus_parses() -> None:
    parse_rule(GOOD, get_settings())
    parse_rule(_deep_not(LIMITS.max_rule_depth - 2), get_settings())
    parse_rule(_many_aggs(LIMITS.max_rule_aggregates), get_settings())


def test_long_lines_are_shown_around_the_error() -> None:
    text = _many_aggs(LIMITS.max_rule_aggregates + 1)
    with pytest.raises(RuleError) as info:
        parse_rule(text, get_settings())
    lines = info.value.display().splitlines()
    assert len(lines[1]) < 120
    caret = lines[2].index("^")
    assert lines[1][caret : caret + 5] == "COUNT"


def test_expected_lists_are_readable() -> None:
    with pytest.raises(RuleError) as info:
        parse_rule(HEAD + "COUNT(*) OVER LAST 1 MINUTE >", get_settings())
    assert "a number" in info.value.expected
    assert "COUNT" in info.value.expected
    with pytest.raises(RuleError) as info:
        parse_rule(HEAD + "COUNT(*) OVER LAST 5 parsecs > 5", get_settings())
    assert any("time unit" in e for e in info.value.expected)
