"""Key detail: one key (a symbol or an IP) across the user's subscriptions.

For each subscription: whether the key is in its current result and since when, the key's
alerts, and -- on request, read from the key's recent events in Kafka
(:mod:`dashboard.detail`) -- a chart of every aggregate the rule uses over its window,
evaluated at pane boundaries, with the rule's thresholds drawn in.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, detail, queries
from dashboard.catchup import format_values
from dashboard.rules import thresholds, validate
from dashboard.ui import current_user, plain, sessions
from tidewatch.settings import Settings


def render(settings: Settings) -> None:
    user = current_user()
    sm = sessions(settings)
    keys = queries.known_keys(sm, user.username)
    top = st.columns(2)
    picked = top[0].selectbox("Key", ["", *keys], key="detail_pick")
    typed = top[1].text_input("or type a key", key="detail_key", max_chars=200)
    key = (typed or picked or "").strip()
    if not key:
        st.info("Pick a key that appears in your alerts or results, or type one.")
        return
    st.text(f"Key: {key}")
    results = queries.key_results(sm, user.username, key)
    rows = queries.alerts(sm, user.username, key=key, exact_key=True, limit=2000)
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "subscription": r.subscription,
                    "state": r.state,
                    "in result now": r.in_result,
                    "since": r.since,
                    "values": format_values(r.values) if r.in_result else "",
                }
                for r in results
            ],
            columns=["subscription", "state", "in result now", "since", "values"],
        ),
        hide_index=True,
        width="stretch",
    )
    if rows:
        st.altair_chart(charts.timeline(rows), width="stretch")
    st.toggle(
        "Chart the aggregates from the stream (reads the key's recent events from Kafka)",
        key="detail_stream",
    )
    load = bool(st.session_state.get("detail_stream"))
    span_ms = int(settings.dashboard_detail_minutes * 60_000)
    cache: dict[tuple[str, str, int], tuple[dict[str, Any], bool]] = {}
    for r in results:
        v = validate(r.rule_text, settings)
        if not v.ok or v.plan is None:
            continue
        plan = v.plan
        with st.expander(f"Aggregates of {plain(r.subscription)}", expanded=True):
            st.code(r.rule_text, language=None)
            lines = thresholds(plan)
            if not load:
                for agg in plan.aggs:
                    label = "; ".join(f"{t.op} {t.value:g}" for t in lines if t.aggregate == agg.text)
                    st.text(f"{agg.text}" + (f"   threshold {label}" if label else ""))
                continue
            lookback = span_ms + detail.longest_window_ms(plan.aggs)
            ck = (plan.stream, plan.key, lookback)
            if ck not in cache:
                try:
                    cache[ck] = detail.recent_events(plan.stream, plan.key, key, lookback, settings)
                except detail.KafkaUnavailable as exc:  # Kafka down or restarting: say so
                    st.warning(str(exc))
                    cache[ck] = ({}, False)
                except Exception as exc:  # noqa: BLE001 - any other failure: say so, keep the page
                    st.warning(f"Cannot read the {plan.stream} stream from Kafka: {type(exc).__name__}")
                    cache[ck] = ({}, False)
            cols, truncated = cache[ck]
            if truncated:
                st.caption(
                    "Only part of the stream was read (limit or timeout); the oldest points may be low."
                )
            frames = detail.detail_frames(
                plan.stream, cols, plan.aggs, span_ms, settings.pane_ms, now_ms=int(time.time() * 1000)
            )
            if not frames:
                st.caption(f"No {plan.stream} events of this key in the last {lookback // 60_000} minute(s).")
                continue
            for agg in plan.aggs:
                marks = [t for t in lines if t.aggregate == agg.text]
                st.altair_chart(charts.aggregate_chart(frames[agg.text], agg.text, marks), width="stretch")
