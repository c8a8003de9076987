"""Key detail: one key (a symbol or an IP) across the user's subscriptions.

For each subscription: whether the key is in its current result and since when, the key's
alerts, and -- on request -- a chart of every aggregate the rule uses at each pane boundary of
the rule's window, with the rule's thresholds drawn in.  The charts are computed by the engine
from the state it holds (:mod:`dashboard.engine_charts`: a request through PostgreSQL, answered
by :mod:`engine.sinks.charts`); points whose window reaches before what the engine holds are
drawn faint.  When the engine does not answer, the page says why and what to do; the
dashboard's own recomputation from the key's recent events in Kafka (:mod:`dashboard.detail`,
capped, newest events first) stays as a fallback the user turns on, labelled as such.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, detail, engine_charts, queries
from dashboard.catchup import format_values
from dashboard.rules import thresholds, validate
from dashboard.timefmt import table_time, utc_text
from dashboard.ui import current_user, empty_state, plain, sessions
from tidewatch.settings import Settings


def render(settings: Settings) -> None:
    user = current_user()
    sm = sessions(settings)
    if queries.live_subscriptions(sm, user.username) == 0:
        empty_state("detail")
        return
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
                    "since (UTC)": table_time(r.since),
                    "values": format_values(r.values) if r.in_result else "",
                }
                for r in results
            ],
            columns=["subscription", "state", "in result now", "since (UTC)", "values"],
        ),
        hide_index=True,
        width="stretch",
        column_config={"since (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")},
    )
    if rows:
        st.altair_chart(charts.timeline(rows), width="stretch")
    st.toggle(
        "Chart the aggregates over each rule's window (computed by the engine from the state it holds)",
        value=True,
        key="detail_engine",
    )
    st.toggle(
        "Fallback, when the engine does not answer: recompute them from the key's recent events in Kafka "
        f"(at most {settings.dashboard_detail_max_messages:,} records, the last "
        f"{settings.dashboard_detail_minutes:g} minutes)",
        key="detail_stream",
    )
    engine_on = bool(st.session_state.get("detail_engine"))
    load = bool(st.session_state.get("detail_stream"))
    plans = {}
    for r in results:
        v = validate(r.rule_text, settings)
        if v.ok and v.plan is not None:
            plans[r.subscription_id] = v.plan
    answers: dict[object, engine_charts.Answer] = {}
    if engine_on and plans:
        wanted = [(r.subscription_id, key) for r in results if r.subscription_id in plans]
        with st.spinner("Asking the engine for the charts..."):
            ids = engine_charts.request(sm, wanted)
            polled = engine_charts.wait(sm, ids, settings.dashboard_chart_wait_s)
        answers = {sid: polled[i] for (sid, _k), i in zip(wanted, ids, strict=True)}
    span_ms = int(settings.dashboard_detail_minutes * 60_000)
    cache: dict[tuple[str, str, int], detail.StreamRead] = {}
    for r in results:
        plan = plans.get(r.subscription_id)
        if plan is None:
            continue
        with st.expander(f"Aggregates of {plain(r.subscription)}", expanded=True):
            st.code(r.rule_text, language=None)
            lines = thresholds(plan)
            ans = answers.get(r.subscription_id)
            if ans is not None and ans.answer is not None:
                _engine_charts(ans.answer, plan.aggs, lines)
                continue
            if ans is not None:
                st.warning(engine_charts.no_answer_text(ans, settings.dashboard_chart_wait_s))
            if not load:
                for agg in plan.aggs:
                    label = "; ".join(f"{t.op} {t.value:g}" for t in lines if t.aggregate == agg.text)
                    st.text(f"{agg.text}" + (f"   threshold {label}" if label else ""))
                continue
            st.caption(
                "Fallback: recomputed by the dashboard from the key's recent events in Kafka, not by the engine."
            )
            lookback = span_ms + detail.longest_window_ms(plan.aggs)
            ck = (plan.stream, plan.key, lookback)
            if ck not in cache:
                try:
                    cache[ck] = detail.read_recent(plan.stream, plan.key, key, lookback, settings)
                except detail.KafkaUnavailable as exc:  # Kafka down or restarting: say so
                    st.warning(str(exc))
                    cache[ck] = detail.StreamRead({}, False)
                except Exception as exc:  # noqa: BLE001 - any other failure: say so, keep the page
                    st.warning(f"Cannot read the {plan.stream} stream from Kafka: {type(exc).__name__}")
                    cache[ck] = detail.StreamRead({}, False)
            got = cache[ck]
            if got.truncated:
                since = (
                    f" from {utc_text(got.complete_from_ms)} on" if got.complete_from_ms is not None else ""
                )
                st.caption(
                    f"The stream was read newest first and stopped at its limit or timeout: complete{since}. "
                    "Points whose window reaches further back are drawn faint (computed from part of it)."
                )
            frames = detail.detail_frames(
                plan.stream,
                got.cols,
                plan.aggs,
                span_ms,
                settings.pane_ms,
                now_ms=int(time.time() * 1000),
                complete_from_ms=got.complete_from_ms if got.truncated else None,
            )
            if not frames:
                st.caption(f"No {plan.stream} events of this key in the last {lookback // 60_000} minute(s).")
                continue
            for agg in plan.aggs:
                marks = [t for t in lines if t.aggregate == agg.text]
                st.altair_chart(charts.aggregate_chart(frames[agg.text], agg.text, marks), width="stretch")


def _engine_charts(answer: dict[str, Any], aggs: list[Any], lines: list[Any]) -> None:
    """The engine's series of one rule, one chart per aggregate, thresholds drawn in."""
    frames = engine_charts.frames(answer)
    for agg in aggs:
        if agg.text in frames:
            marks = [t for t in lines if t.aggregate == agg.text]
            st.altair_chart(charts.aggregate_chart(frames[agg.text], agg.text, marks), width="stretch")
    missing = engine_charts.not_charted(answer)
    if missing:
        st.caption(
            "Not charted (the engine keeps no raw events for their ROWS windows): " + "; ".join(missing)
        )
    st.caption(engine_charts.caption(answer))
