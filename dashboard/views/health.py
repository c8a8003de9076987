"""Health: engine status from ``engine_metrics`` and the engine's run record, with a banner when
it is behind or down (its cause and what to do: :func:`engine.liveness.verdict`, the rule
``tidewatch status`` uses too)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, queries
from dashboard.timefmt import as_utc, utc_text
from dashboard.ui import sessions
from tidewatch.settings import Settings


def render(settings: Settings) -> None:
    h = queries.health(sessions(settings), settings)
    {"ok": st.success, "behind": st.warning, "down": st.error}.get(h.status, st.info)(h.banner)
    if h.lost_banner:
        st.error(h.lost_banner)
    if h.restarts:
        st.warning(
            f"The engine was started again {h.restarts:,} time(s) after it failed or was killed "
            "(`tidewatch status` shows its supervisor's restarts and log)."
        )
    cols = st.columns(6)
    cols[0].metric(
        "events/s",
        "-" if h.events_per_s is None else f"{h.events_per_s:,.0f}",
        help=f"events taken in per second, over the last {queries.RATE_WINDOW_S:g} s of batches",
    )
    cols[5].metric(
        "processing capacity",
        "-" if h.capacity_per_s is None else f"{h.capacity_per_s:,.0f}/s",
        help="the newest batch's events over its evaluation time: how fast the engine could go",
    )
    cols[1].metric("batch duration", "-" if h.batch_ms is None else f"{h.batch_ms:,.0f} ms")
    cols[2].metric("lag", "-" if h.lag_ms is None else f"{h.lag_ms / 1000:,.1f} s")
    cols[3].metric(
        "dead letters",
        f"{h.dead_letters_total:,}",
        delta=f"{h.dead_letters_recent:,} recent" if h.dead_letters_recent else None,
        delta_color="inverse",
    )
    cols[4].metric(
        "last batch (UTC)", "-" if h.last_batch_at is None else as_utc(h.last_batch_at).strftime("%H:%M:%S")
    )
    if h.watermark is not None:
        st.caption(f"watermark {utc_text(h.watermark)}, batch {h.last_batch_id}")
    if h.series:
        df = pd.DataFrame(h.series)
        c = st.columns(3)
        for col, (field, title) in zip(
            c,
            [
                ("events_per_s", "processing capacity (events/s)"),
                ("batch_ms", "batch duration (ms)"),
                ("lag_ms", "lag (ms)"),
            ],
            strict=True,
        ):
            col.altair_chart(charts.metric_chart(df, field, title), width="stretch")
