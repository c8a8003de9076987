"""Key detail: one key (a symbol or an IP) across the user's subscriptions.

For each subscription: whether the key is in its current result and since when, the key's
alerts, and a chart per aggregate the rule compares with a constant, with the threshold
drawn in (values as recorded by the engine with each alert and current result).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, queries
from dashboard.catchup import AlertRow
from dashboard.rules import thresholds, validate
from dashboard.ui import current_user, plain, sessions


def render() -> None:
    user = current_user()
    sm = sessions()
    keys = queries.known_keys(sm, user.username)
    cols = st.columns(2)
    picked = cols[0].selectbox("Key", ["", *keys], key="detail_pick")
    typed = cols[1].text_input("or type a key", key="detail_key", max_chars=200)
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
                }
                for r in results
            ],
            columns=["subscription", "state", "in result now", "since"],
        ),
        hide_index=True,
        width="stretch",
    )
    if rows:
        st.altair_chart(charts.timeline(rows), width="stretch")
    for r in results:
        v = validate(r.rule_text)
        if not v.ok or v.plan is None:
            continue
        mine = [a for a in rows if a.subscription_id == r.subscription_id]
        if r.in_result and r.since is not None:
            mine = [AlertRow(0, "", r.subscription_id, r.subscription, key, "NOW", r.since, r.values), *mine]
        with st.expander(f"Aggregates of {plain(r.subscription)}", expanded=True):
            st.code(r.rule_text, language=None)
            lines = thresholds(v.plan)
            for agg in v.plan.aggs:
                series = charts.aggregate_series(mine, agg.text)
                marks = [t for t in lines if t.aggregate == agg.text]
                if series.empty:
                    label = "; ".join(f"{t.op} {t.value:g}" for t in marks) or "no constant threshold"
                    st.caption(f"{agg.text}: no recorded values yet (threshold {label})")
                    continue
                st.altair_chart(charts.aggregate_chart(series, agg.text, marks), width="stretch")
