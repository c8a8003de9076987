"""Alerts: a live view of the user's ENTER / EXIT alerts -- a summary first (per subscription how
many keys entered and left, alerts per time bucket, the busiest keys; aggregated in SQL over
every matching alert), the alert log and its timeline one tab away.

The filters are ordinary widgets outside the auto-refreshing fragment
(``st.fragment(run_every=settings.dashboard_refresh_s)``), so a refresh re-runs only the
table and the chart and never resets them.  When the view is unfiltered and shows every
alert after the client's cursor, the cursor moves to the newest alert shown (those alerts
are no longer "new" on the next reconnect); otherwise it is left alone, so nothing that
was not displayed is marked seen.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import catchup, charts, queries
from dashboard.capped import CAPPED, capped_text
from dashboard.timefmt import table_time, utc_text
from dashboard.ui import client_id, current_user, empty_state, sessions
from dashboard.views.summary import rate_and_busiest, with_withheld
from subscriptions.service import SubscriptionService
from tidewatch.settings import Settings

LIMIT = 500
KIND_HELP = (
    "ENTER: a key entered the subscription's result; EXIT: it left. CAPPED: at one lookup the "
    "subscription's result changed by more keys than the alert cap (engine_alert_cap_per_lookup); "
    "the rest were withheld from this log, its current results are still complete."
)
TIME_COL = st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")


def _filters(settings: Settings, username: str) -> None:
    subs = SubscriptionService(sessions(settings), settings=settings).list(username, include_deleted=True)
    names = {str(s.id): s.name + (" (deleted)" if s.state == "deleted" else "") for s in subs}
    cols = st.columns([3, 2, 2])
    cols[0].multiselect(
        "Subscriptions", options=list(names), format_func=lambda i: names.get(i, i), key="alerts_subs"
    )
    cols[1].text_input("Key contains", key="alerts_key", max_chars=200)
    cols[2].multiselect("Kind", ["ENTER", "EXIT", CAPPED], key="alerts_kinds", help=KIND_HELP)


def _summary(settings: Settings, username: str, filters: dict[str, Any]) -> None:
    """Per subscription entered / left, alerts per time bucket and the busiest keys, all
    aggregated in PostgreSQL over every alert matching the filters (not only those listed)."""
    sm = sessions(settings)
    rows = queries.summary_by_subscription(sm, username, **filters)
    st.dataframe(
        with_withheld(
            pd.DataFrame(
                [
                    {
                        "subscription": r.name,
                        "state": r.state,
                        "entered": r.entered,
                        "left": r.left,
                        "keys": r.keys,
                        "last alert (UTC)": table_time(r.last),
                    }
                    for r in rows
                ],
                columns=["subscription", "state", "entered", "left", "keys", "last alert (UTC)"],
            ),
            rows,
        ),
        hide_index=True,
        width="stretch",
        column_config={"last alert (UTC)": TIME_COL},
    )
    rate_and_busiest(sm, username, **filters)


def _live(settings: Settings) -> None:
    user = current_user()
    sm = sessions(settings)
    sub_ids = [uuid.UUID(x) for x in st.session_state.get("alerts_subs", [])]
    key = st.session_state.get("alerts_key") or None
    kinds = st.session_state.get("alerts_kinds") or None
    filters: dict[str, Any] = {"subscription_ids": sub_ids, "key": key, "kinds": kinds}
    with sm() as s:
        cursor = catchup.get_cursor(s, user.username, client_id(settings))
    rows = queries.alerts(sm, user.username, limit=LIMIT, **filters)
    new = sum(1 for r in rows if r.seq > cursor)
    st.caption(
        f"{len(rows)} alert(s) shown, {new} new since you last looked; refreshed every "
        f"{settings.dashboard_refresh_s:g} s."
    )
    if rows:
        last = rows[0]
        if last.kind == CAPPED:
            st.text(f"Latest: {capped_text(last.values, utc_text(last.as_of))} ({last.subscription})")
        else:
            st.text(f"Latest: {last.kind} {last.key} ({last.subscription}) as of {utc_text(last.as_of)}")
            st.text(f"Values: {catchup.format_values(last.values)}")
            if any(v is None for v in last.values.values()):  # already a dict (queries.alerts)
                st.caption(catchup.NULL_MEANS)
        summary, log = st.tabs(["Summary", f"Alert log (newest {len(rows)})"])
        with summary:
            _summary(settings, user.username, filters)
        with log:
            df = charts.alerts_frame(rows)
            df.insert(0, "new", [r.seq > cursor for r in rows])
            df["time"] = df["time"].dt.tz_localize(None)  # UTC wall time (the column says so)
            st.dataframe(
                df.drop(columns=["seq"]).rename(columns={"time": "time (UTC)"}),
                hide_index=True,
                width="stretch",
                height=360,
                column_config={"time (UTC)": TIME_COL},
            )
            st.altair_chart(charts.timeline(rows), width="stretch")
    else:
        st.info("No alerts match yet.")
        st.caption(
            "Alerts appear here when a key enters or leaves the result of one of your subscriptions; "
            "Subscribe shows each rule's current result and can preview the keys that match now."
        )
    unfiltered = not sub_ids and not key and not kinds
    if unfiltered and rows:
        pending = queries.count_after(sm, user.username, cursor)
        if pending <= new:  # every alert after the cursor is on screen now
            catchup.acknowledge(sm, user.username, client_id(settings), rows[0].seq)


def render(settings: Settings) -> None:
    user = current_user()
    sm = sessions(settings)
    if queries.live_subscriptions(sm, user.username) == 0 and queries.newest_seq(sm, user.username) == 0:
        empty_state("alerts")
        return
    _filters(settings, user.username)
    every = timedelta(seconds=settings.dashboard_refresh_s)
    st.fragment(run_every=every)(_live)(settings)
