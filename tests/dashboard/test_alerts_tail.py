"""dashboard.tail: the lines ``tidewatch alerts tail`` prints (no services)."""

from __future__ import annotations

import json
from datetime import UTC, timedelta, timezone

from dashboard.tail import Record, format_line, iso_time, json_line, matches

AS_OF = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _alert(**kw: object) -> Record:
    value = {
        "id": f"s1|AAPL|ENTER|{AS_OF}",
        "subscription_id": "s1",
        "rule_name": "momentum",
        "stream": "trades",
        "key": "AAPL",
        "kind": "ENTER",
        "as_of": AS_OF,
        "values": {"SUM(size) OVER LAST 10 SECONDS": 1200.0, "AVG(price)": 10.25, "MIN(price)": None},
        "batch_id": 7,
        "emitted_at": AS_OF + 50,
    }
    return Record("alerts", 0, 3, AS_OF + 50, "s1", {**value, **kw})


def test_an_alert_is_one_line_with_kind_subscription_key_time_and_values() -> None:
    assert format_line(_alert(), UTC) == (
        "2026-01-01T00:00:00.000+00:00  ENTER  momentum [s1]  key=AAPL  "
        "AVG(price)=10.25, MIN(price)=NULL, SUM(size) OVER LAST 10 SECONDS=1200"
    )
    plus2 = timezone(timedelta(hours=2))
    assert format_line(_alert(kind="EXIT", rule_name="", values={}), plus2) == (
        "2026-01-01T02:00:00.000+02:00  EXIT   s1  key=AAPL"
    )


def test_results_and_their_tombstones() -> None:
    res = {
        "subscription_id": "s1",
        "key": "AAPL",
        "present": True,
        "as_of": AS_OF,
        "values": {"n": 3.0},
        "batch_id": 1,
    }
    line = format_line(Record("results", 1, 0, AS_OF, "s1|AAPL", res), UTC)
    assert line == "2026-01-01T00:00:00.000+00:00  RESULT s1  key=AAPL  n=3"
    gone = format_line(Record("results", 1, 1, AS_OF, "s1|AAPL", {**res, "present": False}), UTC)
    assert "  GONE   s1  key=AAPL" in gone
    tomb = Record("results", 1, 2, AS_OF, "s1|AAPL", None)
    assert "REMOVED  s1|AAPL" in format_line(tomb, UTC)
    assert matches(tomb, "s1") and not matches(tomb, "s2")


def test_json_lines_carry_the_decoded_record_and_its_position() -> None:
    obj = json.loads(json_line(_alert()))
    assert obj["topic"] == "alerts" and (obj["partition"], obj["offset"]) == (0, 3)
    assert obj["record"]["values"]["MIN(price)"] is None and obj["record"]["kind"] == "ENTER"


def test_the_subscription_filter_takes_an_id_or_an_alerts_name() -> None:
    assert matches(_alert(), None) and matches(_alert(), "s1") and matches(_alert(), "momentum")
    assert not matches(_alert(), "s2")


def test_iso_time_is_local_by_default_and_exact_to_the_millisecond() -> None:
    assert iso_time(AS_OF + 7, UTC) == "2026-01-01T00:00:00.007+00:00"
    assert iso_time(AS_OF).startswith("20")  # the machine's zone, whatever it is


def test_a_capped_record_says_what_the_cap_withheld() -> None:
    """The alert cap's record (kind CAPPED, key ''): one line saying how many changes were withheld
    and that the current results are complete, never a ``key=`` of its own."""
    capped = _alert(
        id=f"s1||CAPPED|{AS_OF}",
        key="",
        kind="CAPPED",
        values={"withheld": 4900.0, "withheld_enter": 2300.0, "withheld_exit": 2600.0, "cap": 100.0},
    )
    assert format_line(capped, UTC) == (
        "2026-01-01T00:00:00.000+00:00  CAPPED momentum [s1]  capped: 4,900 more changes withheld "
        "(2,300 ENTER, 2,600 EXIT; cap 100 per lookup) \u2014 the subscription's current results are complete"
    )
