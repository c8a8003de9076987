"""Readable for people (issue 21), no services: UTC times in words and on every time axis,
chart titles that hold long names, the newest-first Kafka read plan of Key detail, and the
points drawn from part of their window."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pandas as pd

from dashboard import charts
from dashboard.catchup import AlertRow
from dashboard.detail import chunks, detail_frames, newest_starts
from dashboard.rules import TEMPLATES, Threshold
from dashboard.timefmt import as_utc, clock, span_text, utc_text
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings

T = datetime(2026, 11, 25, 8, 30, 0, tzinfo=UTC)


def test_times_are_utc_text_never_epoch_ms() -> None:
    ms = 1795549722000
    assert utc_text(ms) == "2026-11-24 19:48:42 UTC"
    cet = timezone(timedelta(hours=1))
    assert utc_text(datetime(2026, 11, 25, 9, 30, tzinfo=cet)) == "2026-11-25 08:30:00 UTC"
    assert utc_text(datetime(2026, 11, 25, 8, 30)) == "2026-11-25 08:30:00 UTC"  # naive = UTC
    assert utc_text(None) == "-" and clock(T) == "2026-11-25 08:30:00"
    assert as_utc(ms).tzinfo is UTC
    assert [span_text(s) for s in (5, 600, 3 * 3600 + 300, 5 * 86400)] == [
        "5 s",
        "10 min",
        "3 h 5 min",
        "5 days",
    ]


def _rows(names: list[str]) -> list[AlertRow]:
    return [
        AlertRow(
            i, f"a{i}", uuid.uuid4(), n, "AAPL", "ENTER" if i % 2 else "EXIT", T + timedelta(seconds=i), {}
        )
        for i, n in enumerate(names)
    ]


def test_time_axes_are_utc_and_say_so() -> None:
    names = list(TEMPLATES)[:2]  # the demo's long names, side by side
    rate = charts.rate_chart([(T, "ENTER", 3), (T + timedelta(seconds=5), "EXIT", 1)], 5).to_dict()
    # the alert rate: one bar per bucket (a band axis), labelled with its start in UTC
    assert rate["encoding"]["x"]["title"] == "time (UTC)"
    assert rate["encoding"]["x"]["sort"] == ["08:30:00", "08:30:05"]
    assert rate["encoding"]["y"]["stack"] == "zero"
    specs = [
        charts.timeline(_rows(names)).to_dict(),
        charts.metric_chart(
            pd.DataFrame({"ts": [T, T + timedelta(seconds=1)], "lag_ms": [1.0, 2.0]}), "lag_ms", "lag (ms)"
        ).to_dict(),
    ]
    for spec in specs:
        x = spec["encoding"]["x"]
        assert x["scale"]["type"] == "utc" and x["title"] == "time (UTC)"
        assert "%H:%M" in x["axis"]["format"]
    # the timeline: a row of ROW_PX per subscription, room for long names, no y title to cut
    tl = specs[0]
    assert tl["height"] == {"step": charts.ROW_PX} and tl["encoding"]["y"]["title"] is None
    assert tl["encoding"]["y"]["axis"]["labelLimit"] >= 300
    # tooltips carry the time as UTC text
    data = next(iter(tl["datasets"].values()))
    assert data[0]["when"] == "2026-11-25 08:30:00 UTC"


def test_long_aggregate_names_are_wrapped_titles_not_cut_axis_titles() -> None:
    agg = "SUM(size) FILTER (WHERE side = 'ASK') OVER LAST 2 MINUTES"
    series = pd.DataFrame({"time": [T, T + timedelta(seconds=1)], "value": [1.0, 2.0], "kind": "stream"})
    spec = charts.aggregate_chart(series, agg + " " + agg, [Threshold(agg, ">", 1.0)]).to_dict()
    assert spec["title"]["text"] == charts.wrap_title(agg + " " + agg) and len(spec["title"]["text"]) == 2
    assert spec["layer"][0]["encoding"]["y"]["title"] is None
    assert spec["layer"][0]["encoding"]["x"]["scale"]["type"] == "utc"
    # a day or more of data: the date is on the axis too
    days = pd.Series(pd.to_datetime([T, T + timedelta(days=2)], utc=True))
    assert charts.time_format(days) == "%b %d %H:%M"


def test_newest_starts_keep_the_newest_records_within_the_budget() -> None:
    ranges = {0: (100, 1100), 1: (0, 3000)}  # 1000 + 3000 records
    assert newest_starts(ranges, 10_000) == {0: 100, 1: 0}  # all fit: from the lookback's start
    got = newest_starts(ranges, 400)
    assert got == {0: 1000, 1: 2700}  # each gives up its oldest, in proportion
    assert sum(ranges[p][1] - got[p] for p in got) == 400


def test_chunks_go_from_the_newest_back_and_cover_everything_once() -> None:
    starts, ends = {0: 0, 1: 10}, {0: 100, 1: 15}
    pieces = chunks(starts, ends, 3)
    assert pieces[0] == {0: (66, 100), 1: (13, 15)}  # the newest first
    for p in (0, 1):
        covered = sorted((a, b) for piece in pieces for q, (a, b) in piece.items() if q == p)
        assert covered[0][0] == starts[p] and covered[-1][1] == ends[p]
        assert all(x[1] == y[0] for x, y in zip(covered, covered[1:], strict=False))


def test_points_from_part_of_their_window_are_marked() -> None:
    plan = compile_rule(TEMPLATES["High volatility with recent volume surge (Traderbot)"], get_settings())
    n = 600
    cols = {
        "symbol": np.array(["A"] * n, dtype=object),
        "ts": np.arange(n, dtype=np.int64) * 1000,  # one trade a second for 10 minutes
        "price": np.linspace(50, 60, n),
        "size": np.full(n, 10, np.int64),
        "side": np.array(["BID"] * n, dtype=object),
        "exchange": np.array(["NASDAQ"] * n, dtype=object),
    }
    frames = detail_frames("trades", cols, plan.aggs, 600_000, 1000, complete_from_ms=0)
    assert set(frames) == {a.text for a in plan.aggs}
    for a in plan.aggs:
        df = frames[a.text]
        assert len(df) > 0 and df["value"].notna().any()
        window = a.window.start_ms  # type: ignore[union-attr]
        expect = np.where(df["time"].astype("int64") // 10**6 - window < 0, "partial", "whole")
        assert list(df["window"]) == list(expect)
    # a complete read: every point whole
    full = detail_frames("trades", cols, plan.aggs, 600_000, 1000)
    assert all((f["window"] == "whole").all() for f in full.values())
    five = next(a.text for a in plan.aggs if a.window.start_ms == 300_000)  # type: ignore[union-attr]
    spec = charts.aggregate_chart(frames[five], five, []).to_dict()
    shown = [r for d in spec["datasets"].values() for r in d if "window" in r]
    assert {r["window"] for r in shown} == {"partial", "whole"}  # drawn faint / full
    assert spec["layer"][0]["encoding"]["opacity"]["legend"]["title"] == "window read"


def test_engine_metrics_of_several_engines_are_one_line_each() -> None:
    """Two engines' batches in turn (several ``--engine-id`` on one database): one coloured line per
    engine, so no line zigzags between them; one engine: one line, no legend."""
    ts = [T + timedelta(seconds=i) for i in range(4)]
    two = pd.DataFrame({"ts": ts, "lag_ms": [1.0, 50.0, 2.0, 60.0], "engine": ["a", "b", "a", "b"]})
    spec = charts.metric_chart(two, "lag_ms", "lag (ms)").to_dict()
    assert spec["encoding"]["color"]["field"] == "engine"
    assert {"field": "engine", "title": "engine", "type": "nominal"} in spec["encoding"]["tooltip"]
    one = charts.metric_chart(two.assign(engine="a"), "lag_ms", "lag (ms)").to_dict()
    assert "color" not in one["encoding"]
    # the legend, a row per engine under the plot, has room of its own: the plot keeps its height
    assert spec["encoding"]["color"]["legend"]["direction"] == "vertical"
    assert spec["height"] == one["height"] + charts.LEGEND_PX + 2 * charts.LEGEND_ROW_PX


def test_engine_metrics_are_not_joined_across_a_stop() -> None:
    """Batches of two runs of the engine (a ``run`` column, :func:`dashboard.queries.health`):
    a line per run, so none is drawn across the time the engine was down."""
    ts = [T, T + timedelta(seconds=1), T + timedelta(hours=1), T + timedelta(hours=1, seconds=1)]
    df = pd.DataFrame(
        {"ts": ts, "lag_ms": [1.0, 2.0, 3.0, 4.0], "run": ["default 1"] * 2 + ["default 2"] * 2}
    )
    spec = charts.metric_chart(df, "lag_ms", "lag (ms)").to_dict()
    assert spec["encoding"]["detail"] == {"field": "run", "type": "nominal"}
    assert (
        "detail"
        not in charts.metric_chart(df.drop(columns="run"), "lag_ms", "lag (ms)").to_dict()["encoding"]
    )


def test_the_alert_rate_leaves_a_gap_where_no_alert_was_committed() -> None:
    """Alerts at 08:30:00 and 08:30:15 in buckets of 5 s: four bars' places, the two between
    them empty -- not two bars side by side as if the time between had not passed."""
    rows = [(T, "ENTER", 3), (T + timedelta(seconds=15), "EXIT", 1)]
    x = charts.rate_chart(rows, 5).to_dict()["encoding"]["x"]
    assert x["scale"]["domain"] == x["sort"] == ["08:30:00", "08:30:05", "08:30:10", "08:30:15"]
    far = [(T, "ENTER", 3), (T + timedelta(seconds=5 * charts.MAX_RATE_BARS), "EXIT", 1)]
    assert charts.rate_chart(far, 5).to_dict()["encoding"]["x"]["sort"] == ["08:30:00", "09:11:40"]
