""" "While you were away": a summary of what the client missed, the current results, and the raw
log one click away (PSoup).

The page reads top down as a person decides: how much happened (totals), per subscription how
many keys entered and left (a table), when (alerts per time bucket), which keys were busiest,
what holds *now* (each current result set as a sortable table), and -- in an expander -- the
raw alert log.  Counts come from the catch-up snapshot; the rate and the busiest keys are
aggregated in PostgreSQL over the same ``cursor < seq <= upto`` range
(:func:`dashboard.queries.alert_rate`, :func:`~dashboard.queries.busiest_keys`), so they agree
with it.

The snapshot is taken at login (or when this page is opened without one) and kept in the
browser session, so reruns show the same list; the cursor is advanced to the snapshot's
``upto`` only after the panel has been rendered (:func:`dashboard.catchup.acknowledge`).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import catchup, queries
from dashboard.capped import CAPPED, capped_text
from dashboard.catchup import Catchup
from dashboard.timefmt import clock, span_text, table_time, utc_text
from dashboard.ui import CATCHUP, client_id, current_user, empty_state, go, sessions
from dashboard.views.summary import rate_and_busiest, with_withheld
from tidewatch.settings import Settings

#: keys of a current result set listed on the page
CURRENT_LIMIT = 1000
TIME_COL = st.column_config.DatetimeColumn("since (UTC)", format="YYYY-MM-DD HH:mm:ss")


def listing(group: catchup.AwayGroup) -> str:
    """The group's alerts as fixed-width plain text, newest first, times in UTC (a code block)."""
    lines = []
    for a in group.alerts:
        if a.kind == CAPPED:  # the alert cap's record: what it withheld, not a key
            lines.append(f"{clock(a.as_of)}  {a.kind}  {capped_text(a.values)}")
        else:
            lines.append(f"{clock(a.as_of)}  {a.kind:<5}  {a.key}  ({catchup.format_values(a.values)})")
    return "\n".join(lines)


def result_line(r: catchup.ResultRow) -> str:
    """One key of a current result set: since when (UTC), and its values when recorded."""
    line = f"{r.key}  (since {clock(r.since)})"
    return line + (f"  {catchup.format_values(r.values)}" if r.values else "")


def capped_caption(groups: list[catchup.AwayGroup]) -> str:
    """What the alert cap withheld while away, said once above the table (the counts above are
    ENTER / EXIT alerts logged)."""
    n = sum(g.withheld for g in groups)
    lookups = sum(g.capped for g in groups)
    names = ", ".join(g.name for g in groups)
    return (
        f"Capped: {n:,} more changes withheld at {lookups:,} lookup(s) of {names} (the alert cap); "
        "the current results below are complete."
    )


def summary_frame(rows: list[queries.SubscriptionSummary], snap: Catchup) -> pd.DataFrame:
    """Per subscription with alerts while away: entered, left, distinct keys, its result's size
    now and its last alert (UTC); most alerts first."""
    now = {cs.subscription_id: len(cs.rows) for cs in snap.current}
    frame = pd.DataFrame(
        [
            {
                "subscription": r.name,
                "state": r.state,
                "entered": r.entered,
                "left": r.left,
                "keys": r.keys,
                "in result now": now.get(r.subscription_id, 0),
                "last alert (UTC)": table_time(r.last),
            }
            for r in rows
        ],
        columns=["subscription", "state", "entered", "left", "keys", "in result now", "last alert (UTC)"],
    )
    return with_withheld(frame, rows)


def results_frame(cs: catchup.CurrentSet, limit: int = CURRENT_LIMIT) -> pd.DataFrame:
    """A current result set as a table: key, since (UTC), the values that hold it there."""
    return pd.DataFrame(
        [
            {"key": r.key, "since (UTC)": table_time(r.since), "values": catchup.format_values(r.values)}
            for r in cs.rows[:limit]
        ],
        columns=["key", "since (UTC)", "values"],
    )


def _summary(settings: Settings, snap: Catchup) -> None:
    sm = sessions(settings)
    span = dict(after_seq=snap.cursor, upto_seq=snap.upto)
    st.subheader(f"{snap.total} alert(s) while you were away")
    rows = queries.summary_by_subscription(sm, snap.username, **span)
    starts = [r.first for r in rows if r.first]
    ends = [r.last for r in rows if r.last]
    if starts and ends:
        lo, hi = min(starts), max(ends)
        st.caption(f"From {utc_text(lo)} to {utc_text(hi)} ({span_text((hi - lo).total_seconds())})")
    cols = st.columns(3)
    cols[0].metric("keys entered", sum(g.enters for g in snap.groups))
    cols[1].metric("keys left", sum(g.exits for g in snap.groups))
    cols[2].metric("subscriptions with alerts", len(snap.groups))
    capped = [g for g in snap.groups if g.capped]
    if capped:
        st.caption(capped_caption(capped))
    st.dataframe(
        summary_frame(rows, snap),
        hide_index=True,
        width="stretch",
        column_config={"last alert (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")},
    )
    rate_and_busiest(sm, snap.username, **span)
    with st.expander(f"Raw alert log (newest {catchup.PER_GROUP_LIMIT} per subscription, UTC)"):
        for g in snap.groups:
            st.text(f"Subscription: {g.name}")
            if len(g.alerts) < g.total:
                st.caption(f"The newest {len(g.alerts)} of {g.total}; the Alerts page lists them all.")
            st.code(listing(g), language=None)


def render(settings: Settings) -> None:
    user = current_user()
    snap = st.session_state.get(CATCHUP)
    if not isinstance(snap, Catchup) or snap.username != user.username:
        snap = catchup.catch_up(sessions(settings), user.username, client_id(settings))
        st.session_state[CATCHUP] = snap
    if not snap.current and not snap.has_news:
        empty_state("away")
        return
    if snap.has_news:
        _summary(settings, snap)
    else:
        st.success("Nothing happened while you were away.")
    st.subheader("Current results")
    if snap.engine_as_of:
        st.caption(f"As of the engine's watermark {utc_text(snap.engine_as_of)}")
    if not snap.current:
        st.info("You have no live subscriptions: write one on the Subscribe page.")
    for cs in snap.current:
        st.text(f"{cs.name} ({cs.state}): {len(cs.rows)} key(s)")
        if cs.rows:
            st.dataframe(
                results_frame(cs),
                hide_index=True,
                width="stretch",
                column_config={"since (UTC)": TIME_COL},
                height=min(400, 38 + 35 * min(len(cs.rows), CURRENT_LIMIT)),
            )
            if len(cs.rows) > CURRENT_LIMIT:
                st.caption(f"The first {CURRENT_LIMIT} of {len(cs.rows)} keys.")
    st.button("Go to the live alerts", on_click=go, args=("Alerts",), key="away_done")
    # rendered: everything up to the snapshot's upto has been shown
    if snap.has_news:
        catchup.acknowledge(sessions(settings), user.username, client_id(settings), snap.upto)
