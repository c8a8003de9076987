"""Charts of the dashboard (Altair specs built from plain rows; no Streamlit calls here).

* :func:`timeline` -- alerts over time, one row per subscription, ENTER / EXIT coloured (a
  CAPPED record, :mod:`dashboard.capped`, grey; in the alert log its values say what it withheld).
* :func:`rate_chart` -- alerts per time bucket, stacked by kind (counted in SQL:
  :func:`dashboard.queries.alert_rate`).
* :func:`aggregate_chart` -- one aggregate of a key over time, with the rule's thresholds drawn
  as horizontal rules.
* :func:`metric_chart` -- one engine metric per micro-batch (Health).

Every time axis is in UTC (a ``utc`` scale, so the browser's time zone plays no part) and
says so in its title; tooltips show the time as text (``2026-11-25 08:30:00 UTC``).  Long
names sit in chart titles (wrapped) or on axes with a generous label limit, never in an axis
title that the chart's height would cut.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

import altair as alt
import pandas as pd

from dashboard.capped import CAPPED, capped_text
from dashboard.catchup import AlertRow, format_values
from dashboard.rules import Threshold
from dashboard.timefmt import FORMAT, as_utc, clock, span_text

#: ENTER red, EXIT green, CAPPED (the alert cap's record: dashboard.capped) grey
KIND_COLORS = alt.Scale(domain=["ENTER", "EXIT", CAPPED], range=["#d62728", "#2ca02c", "#7f7f7f"])
#: the same without CAPPED: the legend names it only when the data has one (the cap is off by
#: default, and a newcomer asked what "CAPPED" was)
_ENTER_EXIT = alt.Scale(domain=["ENTER", "EXIT"], range=["#d62728", "#2ca02c"])


def kind_colors(kinds: Any) -> alt.Scale:
    """The colour scale of alert kinds for a chart of ``kinds`` (CAPPED in it only if present)."""
    return KIND_COLORS if CAPPED in set(kinds) else _ENTER_EXIT


#: a row of the timeline per subscription, this many pixels high (ticks are 18 px)
ROW_PX = 40
#: room for subscription names on the timeline's y axis before they are cut with an ellipsis
LABEL_PX = 320
TIME_TITLE = "time (UTC)"


def _when(times: pd.Series) -> pd.Series:
    """Times as text for tooltips (UTC)."""
    return times.map(lambda t: as_utc(t.to_pydatetime()).strftime(FORMAT) if pd.notna(t) else "")


def time_format(times: pd.Series) -> str:
    """A d3 time format fit for the span of ``times``: clock time within a day, date and time
    beyond."""
    if times.empty:
        return "%H:%M:%S"
    span = (times.max() - times.min()).total_seconds()
    if span > 86400:
        return "%b %d %H:%M"
    return "%H:%M:%S" if span < 3 * 3600 else "%H:%M"


def time_x(field: str, times: pd.Series, title: str | None = TIME_TITLE) -> alt.X:
    """An x encoding of ``field`` on a UTC time scale, labels that do not overlap."""
    return alt.X(
        f"{field}:T",
        title=title,
        scale=alt.Scale(type="utc"),
        axis=alt.Axis(format=time_format(times), labelOverlap=True, labelAngle=0, labelFlush=True),
    )


def wrap_title(text: str, width: int = 70) -> list[str]:
    """A long title as lines of at most ``width`` characters (Vega draws one line per item)."""
    return textwrap.wrap(text, width) or [""]


def alerts_frame(rows: Iterable[AlertRow]) -> pd.DataFrame:
    """Alert rows as a DataFrame (times in UTC; text columns stay text; values as one line,
    "\u2014" when none)."""
    data = [
        {
            "seq": r.seq,
            "time": as_utc(r.as_of),
            "subscription": r.subscription,
            "key": r.key,
            "kind": r.kind,
            "values": capped_text(r.values, clock(r.as_of)) if r.kind == CAPPED else format_values(r.values),
        }
        for r in rows
    ]
    df = pd.DataFrame(data, columns=["seq", "time", "subscription", "key", "kind", "values"])
    df["time"] = pd.to_datetime(df["time"], utc=True)
    return df


def timeline(rows: Sequence[AlertRow]) -> alt.Chart:
    """ENTER / EXIT alerts over time, a row of :data:`ROW_PX` per subscription."""
    df = alerts_frame(rows)
    df["when"] = _when(df["time"])
    return (
        alt.Chart(df)
        .mark_tick(thickness=2, size=18)
        .encode(
            x=time_x("time", df["time"]),
            y=alt.Y(
                "subscription:N",
                title=None,
                axis=alt.Axis(labelLimit=LABEL_PX, labelPadding=8, labelFontSize=12),
            ),
            color=alt.Color(
                "kind:N", scale=kind_colors(df["kind"]), title="kind", legend=alt.Legend(orient="top")
            ),
            tooltip=[
                alt.Tooltip("when:N", title="as of"),
                "subscription:N",
                "key:N",
                "kind:N",
                "values:N",
            ],
        )
        .properties(height=alt.Step(ROW_PX), title="Alerts over time")
    )


def rate_frame(rows: Sequence[tuple[Any, str, int]], bucket_s: int = 1) -> pd.DataFrame:
    """(bucket start, kind, count) rows as a frame (times in UTC), each bucket also as the label
    of its bar (clock time; with the date when the buckets span more than a day)."""
    df = pd.DataFrame(list(rows), columns=["time", "kind", "alerts"])
    df["time"] = pd.to_datetime(df["time"], utc=True)
    df["when"] = _when(df["time"])
    df["bucket"] = _bucket_labels(df["time"], df["time"], bucket_s)
    return df


def _bucket_labels(times: pd.Series, span: pd.Series, bucket_s: int) -> pd.Series:
    """The bar labels of buckets starting at ``times``: clock time, with the date when ``span``
    (the chart's bucket starts) covers more than a day."""
    fmt = "%b %d %H:%M" if not span.empty and (span.max() - span.min()).days >= 1 else "%H:%M:%S"
    return times.dt.strftime(fmt if bucket_s < 86400 else "%b %d")


#: at most this many bars on the alert-rate chart's axis; with more buckets from the first alert
#: to the last (a caller's own bucket width), only the buckets with alerts get one
MAX_RATE_BARS = 500


def rate_chart(rows: Sequence[tuple[Any, str, int]], bucket_s: int) -> alt.Chart:
    """Alerts per bucket of ``bucket_s`` seconds, ENTER and EXIT stacked: one bar per bucket,
    in time order, labelled with its start (UTC) -- a band axis, so one bucket is one full bar,
    not a line on a time scale of no width.  Every bucket from the first alert's to the last's
    has its place, so a time without alerts (the engine stopped, a quiet market) shows as a gap
    rather than the bars on either side of it drawn side by side."""
    df = rate_frame(rows, bucket_s).sort_values("time", kind="stable")
    labels = list(dict.fromkeys(df["bucket"]))
    if not df.empty and (df["time"].max() - df["time"].min()).total_seconds() / bucket_s < MAX_RATE_BARS:
        starts = pd.Series(
            pd.date_range(df["time"].min(), df["time"].max(), freq=pd.Timedelta(seconds=bucket_s))
        )
        labels = list(dict.fromkeys(_bucket_labels(starts, df["time"], bucket_s)))
    return (
        alt.Chart(df)
        .mark_bar()
        .encode(
            x=alt.X(
                "bucket:O",
                title=TIME_TITLE,
                sort=labels,
                scale=alt.Scale(domain=labels),
                axis=alt.Axis(labelAngle=0, labelOverlap=True),
            ),
            y=alt.Y("alerts:Q", title="alerts", stack="zero", axis=alt.Axis(tickMinStep=1)),
            color=alt.Color(
                "kind:N", scale=kind_colors(df["kind"]), title="kind", legend=alt.Legend(orient="right")
            ),
            tooltip=[alt.Tooltip("when:N", title="from"), "kind:N", "alerts:Q"],
        )
        .properties(height=200, title=f"Alerts per {span_text(bucket_s)}")
    )


def aggregate_series(rows: Iterable[AlertRow], aggregate: str) -> pd.DataFrame:
    """(time, value, kind) of one aggregate from the values recorded with alerts."""
    data: list[dict[str, Any]] = []
    for r in rows:
        if r.kind == CAPPED:  # its values are counts of withheld alerts, not the rule's aggregates
            continue
        v = r.values.get(aggregate)
        if isinstance(v, int | float) and not isinstance(v, bool):
            data.append({"time": as_utc(r.as_of), "value": float(v), "kind": r.kind})
    return pd.DataFrame(data, columns=["time", "value", "kind"])


def aggregate_chart(series: pd.DataFrame, aggregate: str, lines: Sequence[Threshold]) -> alt.LayerChart:
    """The aggregate's values over time (its text as the chart's title) with each threshold
    ``aggregate op value`` drawn in.  A ``window`` column, when present, tells points whose
    window was read whole (``whole``) from those computed from part of it (``partial``)."""
    df = series.copy()
    df["time"] = pd.to_datetime(df["time"], utc=True)
    df["when"] = _when(df["time"])
    if "window" not in df.columns:
        df["window"] = "whole"
    base = (
        alt.Chart(df)
        .mark_line(point=True)
        .encode(
            x=time_x("time", df["time"]),
            y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False), axis=alt.Axis(tickCount=4)),
            opacity=alt.Opacity(
                "window:N",
                scale=alt.Scale(domain=["whole", "partial"], range=[1.0, 0.35]),
                legend=alt.Legend(orient="top", title="window read")
                if (df["window"] != "whole").any()
                else None,
            ),
            tooltip=[alt.Tooltip("when:N", title="time"), "value:Q", "window:N"],
        )
    )
    th = pd.DataFrame(
        [{"threshold": t.value, "label": f"{t.op} {t.value:g}"} for t in lines if t.aggregate == aggregate],
        columns=["threshold", "label"],
    )
    rule = (
        alt.Chart(th)
        .mark_rule(color="#d62728", strokeDash=[6, 4])
        .encode(y="threshold:Q", tooltip=[alt.Tooltip("label:N", title="threshold")])
    )
    return alt.LayerChart(layer=[base, rule]).properties(
        height=220, title=alt.TitleParams(wrap_title(aggregate), fontSize=12, anchor="start")
    )


#: height of an engine metric's chart (:func:`metric_chart`); the room of its legend, with
#: several engines: the legend's title and gap, and a row per engine (measured in chromium)
METRIC_PX = 200
LEGEND_PX = 44
LEGEND_ROW_PX = 28


def metric_chart(df: pd.DataFrame, field: str, title: str) -> alt.Chart:
    """One engine metric per micro-batch over time (points joined by a line), its name as the
    title.  With an ``engine`` column naming more than one engine (several ``--engine-id`` on one
    database), one line per engine, coloured, so no line joins two engines' batches; with a
    ``run`` column, one line per run (:func:`dashboard.queries.health`'s unbroken runs of
    batches), so none joins the batches before a stop of the engine to those after it."""
    engines = df["engine"].nunique() if "engine" in df.columns else 1
    several = engines > 1
    runs = "run" in df.columns
    d = df[["ts", field, *(["engine"] if several else []), *(["run"] if runs else [])]].dropna().copy()
    d["ts"] = pd.to_datetime(d["ts"], utc=True)
    d["when"] = _when(d["ts"])
    tooltip = [alt.Tooltip("when:N", title="time"), f"{field}:Q"]
    split: dict[str, Any] = {}
    if several:
        split["color"] = alt.Color(
            "engine:N", title="engine", legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0)
        )
        tooltip.append(alt.Tooltip("engine:N", title="engine"))
    if runs:  # a line per unbroken run of batches: none drawn across the time the engine was down
        split["detail"] = alt.Detail("run:N")
    return (
        alt.Chart(d)
        .mark_line(point=True)
        .encode(x=time_x("ts", d["ts"]), y=alt.Y(f"{field}:Q", title=None), tooltip=tooltip, **split)
        .properties(
            # the dashboard fits the whole chart, legend included, into its height: a legend row
            # more per engine keeps the plot as tall as one engine's
            height=METRIC_PX + (LEGEND_PX + LEGEND_ROW_PX * engines if several else 0),
            title=alt.TitleParams(wrap_title(title, 40), fontSize=12, anchor="start"),
        )
    )
