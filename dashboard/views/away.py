""" "While you were away": the alerts after the client's cursor and the current results (PSoup).

The snapshot is taken at login (or when this page is opened without one) and kept in the
browser session, so reruns show the same list; the cursor is advanced to the snapshot's
``upto`` only after the panel has been rendered (:func:`dashboard.catchup.acknowledge`).
"""

from __future__ import annotations

import streamlit as st

from dashboard import catchup
from dashboard.catchup import Catchup
from dashboard.ui import CATCHUP, client_id, current_user, go, sessions
from tidewatch.settings import Settings

#: keys of a current result set listed on the page
CURRENT_LIMIT = 200


def listing(group: catchup.AwayGroup) -> str:
    """The group's alerts as fixed-width plain text, newest first (shown in a code block)."""
    lines = []
    for a in group.alerts:
        lines.append(
            f"{a.as_of:%Y-%m-%d %H:%M:%S}  {a.kind:<5}  {a.key}  ({catchup.format_values(a.values)})"
        )
    return "\n".join(lines)


def result_line(r: catchup.ResultRow) -> str:
    """One key of a current result set: since when, and its values when the engine recorded any."""
    line = f"{r.key}  (since {r.since:%Y-%m-%d %H:%M:%S})"
    return line + (f"  {catchup.format_values(r.values)}" if r.values else "")


def render(settings: Settings) -> None:
    user = current_user()
    snap = st.session_state.get(CATCHUP)
    if not isinstance(snap, Catchup) or snap.username != user.username:
        snap = catchup.catch_up(sessions(settings), user.username, client_id(settings))
        st.session_state[CATCHUP] = snap
    if snap.has_news:
        st.subheader(f"{snap.total} alert(s) while you were away")
        for g in snap.groups:
            with st.container(border=True):
                st.text(f"Subscription: {g.name}")
                cols = st.columns(3)
                cols[0].metric("ENTER", g.enters)
                cols[1].metric("EXIT", g.exits)
                cols[2].metric("state", g.state)
                if len(g.alerts) < g.total:
                    st.caption(f"The newest {len(g.alerts)} of {g.total}; the Alerts page lists them all.")
                st.code(listing(g), language=None)
    else:
        st.success("Nothing happened while you were away.")
    st.subheader("Current results")
    as_of = (
        f"as of the engine's watermark {snap.engine_as_of:%Y-%m-%d %H:%M:%S %Z}" if snap.engine_as_of else ""
    )
    if as_of:
        st.caption(as_of)
    if not snap.current:
        st.info("You have no subscriptions yet: write one on the Subscribe page.")
    for cs in snap.current:
        st.text(f"{cs.name} ({cs.state}): {len(cs.rows)} key(s)")
        if cs.rows:
            shown = cs.rows[:CURRENT_LIMIT]
            st.code("\n".join(result_line(r) for r in shown), language=None)
            if len(cs.rows) > len(shown):
                st.caption(f"The first {len(shown)} of {len(cs.rows)} keys.")
    st.button("Go to the live alerts", on_click=go, args=("Alerts",), key="away_done")
    # rendered: everything up to the snapshot's upto has been shown
    if snap.has_news:
        catchup.acknowledge(sessions(settings), user.username, client_id(settings), snap.upto)
