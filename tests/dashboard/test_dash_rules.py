"""Unit tests of the dashboard's pure logic: rule validation, thresholds, safe text, health status."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from dashboard import charts, queries
from dashboard.catchup import NO_VALUES, AlertRow, as_values, format_values
from dashboard.queries import classify, escape_like
from dashboard.rules import TEMPLATES, Threshold, thresholds, validate
from dashboard.ui import plain
from tidewatch.settings import Settings, get_settings


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_every_template_compiles(name: str) -> None:
    v = validate(TEMPLATES[name], get_settings())
    assert v.ok, v.display
    assert "driver" in v.explain and "post-check" in v.explain


def test_validation_reports_line_column_and_expected() -> None:
    v = validate(
        "SELECT symbol FROM trades\nGROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDZ > 1000",
        get_settings(),
    )
    assert not v.ok
    assert (v.line, v.column) == (2, 48)
    assert "SECONDZ" in v.message
    assert v.summary.startswith("line 2, column 48:")
    assert "^" in v.display and any("time unit" in e for e in v.expected)


def test_validation_of_an_unfinished_rule_names_the_end() -> None:
    v = validate(
        "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 10 SECONDS >", get_settings()
    )
    assert not v.ok and "end of the rule" in v.message


@pytest.mark.parametrize("text", ["", "   \n", "x" * 100_000, "(" * 3000, "SELECT " * 600])
def test_empty_and_huge_inputs_are_refused_with_a_message(text: str) -> None:
    v = validate(text, get_settings())
    assert not v.ok and v.message and v.line >= 1 and v.column >= 1


def test_script_in_rule_text_is_an_error_not_markup() -> None:
    v = validate("<script>alert(1)</script>", get_settings())
    assert not v.ok and (v.line, v.column) == (1, 1)
    assert "<script>" in v.display  # shown verbatim (in a code block) by the page


def test_thresholds_put_the_aggregate_on_the_left() -> None:
    v = validate(
        "SELECT symbol FROM trades GROUP BY symbol HAVING 1000 < SUM(size) OVER LAST 5 MINUTES "
        "AND LAST(price) OVER LAST 5 MINUTES BETWEEN 20 AND 200 AND NOT (COUNT(*) OVER LAST 1 MINUTE > 9) "
        "AND NOT (AVG(size) OVER LAST 1 MINUTE > 7)",
        get_settings(),
    )
    assert v.ok and v.plan is not None
    got = {(t.aggregate, t.op, t.value) for t in thresholds(v.plan)}
    assert got == {
        ("SUM(size) OVER LAST 5 MINUTES", ">", 1000.0),
        ("LAST(price) OVER LAST 5 MINUTES", ">=", 20.0),
        ("LAST(price) OVER LAST 5 MINUTES", "<=", 200.0),
        # NOT of a comparison that cannot be NULL is pushed down; NOT of AVG (maybe NULL) is skipped
        ("COUNT(*) OVER LAST 1 MINUTE", "<=", 9.0),
    }


@pytest.mark.parametrize(
    "text",
    ["<script>alert('x')</script>", "[click](javascript:alert(1))", "**bold** _it_ `code` # h", "a\\b|c"],
)
def test_plain_escapes_every_markdown_character(text: str) -> None:
    out = plain(text)
    # every special character is preceded by a backslash; removing them gives the text back
    assert re.sub(r"\\(.)", r"\1", out) == text
    for ch in "<>[]()*_`#|":
        assert ch not in re.sub(r"\\.", "", out)


def test_escape_like_makes_wildcards_literal() -> None:
    assert escape_like("50%_a\\b") == "50\\%\\_a\\\\b"


def test_health_status_banner() -> None:
    s = Settings(engine_behind_lag_ms=10_000, engine_down_after_s=60)
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert classify(None, [], now, s)[0] == "unknown"
    assert classify(now - timedelta(seconds=2), [500.0], now, s)[0] == "ok"
    status, banner = classify(now - timedelta(seconds=2), [25_000.0] * 3, now, s)
    assert status == "behind" and "25.0 s" in banner
    # one batch over the threshold is not "behind" (hysteresis: three in a row)
    assert classify(now - timedelta(seconds=2), [500.0, 25_000.0], now, s)[0] == "ok"
    status, banner = classify(now - timedelta(minutes=5), [0.0], now, s)
    assert status == "down" and "5 min" in banner and "tidewatch status" in banner


def test_health_input_rate_is_events_per_wall_clock_second() -> None:
    # 800 events/s arriving, batches every 0.5 s, each evaluated in 1 ms (capacity 400,000/s)
    t = [1000.0 + 0.5 * i for i in range(121)]
    assert queries.input_rate(t, [400] * 121) == 800.0
    # only the last 60 s count: an old burst is forgotten
    assert queries.input_rate([0.0, *t], [10**9] + [400] * 121) == 800.0
    assert queries.input_rate([5.0], [100]) is None and queries.input_rate([], []) is None
    assert queries.input_rate([3.0, 1.0, 2.0], [30, 10, 20]) == 25.0  # any order; the first is the start


def test_charts_build_with_thresholds() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        AlertRow(
            1, "a", uuid.uuid4(), "<b>s</b>", "AAPL", "ENTER", t, {"SUM(size) OVER LAST 5 MINUTES": 1500}
        ),
        AlertRow(2, "b", uuid.uuid4(), "<b>s</b>", "AAPL", "EXIT", t, {"SUM(size) OVER LAST 5 MINUTES": 900}),
    ]
    spec = charts.timeline(rows).to_dict()
    assert spec["mark"]["type"] == "tick"
    series = charts.aggregate_series(rows, "SUM(size) OVER LAST 5 MINUTES")
    assert list(series["value"]) == [1500.0, 900.0]
    layer = charts.aggregate_chart(
        series, "SUM(size) OVER LAST 5 MINUTES", [Threshold("SUM(size) OVER LAST 5 MINUTES", ">", 1000.0)]
    ).to_dict()
    assert len(layer["layer"]) == 2
    assert '"threshold": 1000.0' in json.dumps(layer)


@pytest.mark.parametrize("raw", [None, {}, [], ""])
def test_no_values_show_a_dash(raw: object) -> None:
    assert format_values(raw) == NO_VALUES == "\u2014"
    assert as_values(None) == {} and as_values({}) == {}


def test_values_are_one_sorted_compact_line() -> None:
    values = {
        "SUM(size) OVER LAST 10 SECONDS": 1200.0,
        "AVG(price) OVER LAST 1 MINUTE": 101.23456789,
        "COUNT(*) OVER LAST 5 SECONDS": 13,
        "flag": True,
        "missing": None,
        "nan": float("nan"),
        "big": 1e20,
    }
    assert format_values(values) == (
        "AVG(price) OVER LAST 1 MINUTE = 101.235, COUNT(*) OVER LAST 5 SECONDS = 13, "
        "SUM(size) OVER LAST 10 SECONDS = 1200, big = 1e+20, flag = true, missing = NULL, nan = nan"
    )


def test_malformed_values_are_shown_not_lost_and_cut_when_huge() -> None:
    assert format_values([1, 2]) == "value = [1, 2]"
    assert format_values("text") == "value = text"
    assert format_values({1: "a"}) == "1 = a"
    line = format_values({"<b>k</b>": "x" * 10_000, "multi\nline": "a\nb"})
    assert line.startswith("<b>k</b> = " + "x" * 70) and len(line) < 250 and "\n" not in line
    assert line.endswith("\u2026, multi line = a b")
    many = format_values({f"a{i:02d}": i for i in range(40)})
    assert many.endswith("\u2026 (28 more)") and many.startswith("a00 = 0, a01 = 1")
