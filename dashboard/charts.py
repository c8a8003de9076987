"""Charts of the dashboard (Altair specs built from plain rows; no Streamlit calls here).

* :func:`timeline` -- alerts over time, one row per subscription, ENTER / EXIT coloured.
* :func:`aggregate_chart` -- one aggregate of a key over time (the values recorded with its
  alerts and current results), with the rule's thresholds drawn as horizontal rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import altair as alt
import pandas as pd

from dashboard.catchup import AlertRow, format_values
from dashboard.rules import Threshold

#: clock time on time axes (Vega's default shows ".500" ticks over a span of seconds)
TIME_AXIS = alt.Axis(format="%H:%M:%S", labelOverlap=True)
KIND_COLORS = alt.Scale(domain=["ENTER", "EXIT"], range=["#d62728", "#2ca02c"])


def alerts_frame(rows: Iterable[AlertRow]) -> pd.DataFrame:
    """Alert rows as a DataFrame (text columns stay text; values as one line, "\u2014" when none)."""
    data = [
        {
            "seq": r.seq,
            "time": r.as_of,
            "subscription": r.subscription,
            "key": r.key,
            "kind": r.kind,
            "values": format_values(r.values),
        }
        for r in rows
    ]
    return pd.DataFrame(data, columns=["seq", "time", "subscription", "key", "kind", "values"])


def timeline(rows: Sequence[AlertRow]) -> alt.Chart:
    """ENTER / EXIT alerts over time by subscription."""
    df = alerts_frame(rows)
    return (
        alt.Chart(df)
        .mark_tick(thickness=2, size=18)
        .encode(
            x=alt.X("time:T", title="as of", axis=TIME_AXIS),
            y=alt.Y("subscription:N", title=None),
            color=alt.Color("kind:N", scale=KIND_COLORS, title="kind"),
            tooltip=["time:T", "subscription:N", "key:N", "kind:N", "values:N"],
        )
        .properties(height=max(80, 36 * max(1, df["subscription"].nunique())))
    )


def aggregate_series(rows: Iterable[AlertRow], aggregate: str) -> pd.DataFrame:
    """(time, value, kind) of one aggregate from the values recorded with alerts."""
    data: list[dict[str, Any]] = []
    for r in rows:
        v = r.values.get(aggregate)
        if isinstance(v, int | float) and not isinstance(v, bool):
            data.append({"time": r.as_of, "value": float(v), "kind": r.kind})
    return pd.DataFrame(data, columns=["time", "value", "kind"])


def aggregate_chart(series: pd.DataFrame, aggregate: str, lines: Sequence[Threshold]) -> alt.LayerChart:
    """The aggregate's values over time with each threshold ``aggregate op value`` drawn in."""
    base = (
        alt.Chart(series)
        .mark_line(point=True)
        .encode(
            x=alt.X("time:T", title="as of", axis=TIME_AXIS),
            y=alt.Y("value:Q", title=aggregate),
            tooltip=["time:T", "value:Q", "kind:N"],
        )
    )
    th = pd.DataFrame(
        [{"threshold": t.value, "label": f"{t.op} {t.value:g}"} for t in lines if t.aggregate == aggregate],
        columns=["threshold", "label"],
    )
    rule = (
        alt.Chart(th)
        .mark_rule(color="#d62728", strokeDash=[6, 4])
        .encode(y="threshold:Q", tooltip=["label:N"])
    )
    return alt.LayerChart(layer=[base, rule]).properties(height=220)


def metric_chart(df: pd.DataFrame, field: str, title: str) -> alt.Chart:
    """One engine metric per micro-batch over time (points joined by a line)."""
    return (
        alt.Chart(df[["ts", field]].dropna())
        .mark_line(point=True)
        .encode(
            x=alt.X("ts:T", title=None, axis=TIME_AXIS),
            y=alt.Y(f"{field}:Q", title=title),
            tooltip=["ts:T", f"{field}:Q"],
        )
        .properties(height=200)
    )
