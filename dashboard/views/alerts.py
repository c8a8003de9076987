"""Alerts: a live view of the user's ENTER / EXIT alerts, with filters and a timeline.

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

import streamlit as st

from dashboard import catchup, charts, queries
from dashboard.ui import client_id, current_user, sessions
from subscriptions.service import SubscriptionService
from tidewatch.settings import Settings

LIMIT = 500


def _filters(settings: Settings, username: str) -> None:
    subs = SubscriptionService(sessions(settings), settings=settings).list(username, include_deleted=True)
    names = {str(s.id): s.name + (" (deleted)" if s.state == "deleted" else "") for s in subs}
    cols = st.columns([3, 2, 2])
    cols[0].multiselect(
        "Subscriptions", options=list(names), format_func=lambda i: names.get(i, i), key="alerts_subs"
    )
    cols[1].text_input("Key contains", key="alerts_key", max_chars=200)
    cols[2].multiselect("Kind", ["ENTER", "EXIT"], key="alerts_kinds")


def _live(settings: Settings) -> None:
    user = current_user()
    sm = sessions(settings)
    sub_ids = [uuid.UUID(x) for x in st.session_state.get("alerts_subs", [])]
    key = st.session_state.get("alerts_key") or None
    kinds = st.session_state.get("alerts_kinds") or None
    with sm() as s:
        cursor = catchup.get_cursor(s, user.username, client_id(settings))
    rows = queries.alerts(sm, user.username, subscription_ids=sub_ids, key=key, kinds=kinds, limit=LIMIT)
    new = sum(1 for r in rows if r.seq > cursor)
    st.caption(
        f"{len(rows)} alert(s) shown, {new} new since you last looked; refreshed every "
        f"{settings.dashboard_refresh_s:g} s."
    )
    if rows:
        last = rows[0]
        st.text(
            f"Latest: {last.kind} {last.key} ({last.subscription}) as of {last.as_of:%Y-%m-%d %H:%M:%S %Z}"
        )
        st.text(f"Values: {catchup.format_values(last.values)}")
        df = charts.alerts_frame(rows)
        df.insert(0, "new", [r.seq > cursor for r in rows])
        st.dataframe(df.drop(columns=["seq"]), hide_index=True, width="stretch", height=360)
        st.altair_chart(charts.timeline(rows), width="stretch")
    else:
        st.info("No alerts match yet.")
    unfiltered = not sub_ids and not key and not kinds
    if unfiltered and rows:
        pending = queries.count_after(sm, user.username, cursor)
        if pending <= new:  # every alert after the cursor is on screen now
            catchup.acknowledge(sm, user.username, client_id(settings), rows[0].seq)


def render(settings: Settings) -> None:
    user = current_user()
    _filters(settings, user.username)
    every = timedelta(seconds=settings.dashboard_refresh_s)
    st.fragment(run_every=every)(_live)(settings)
