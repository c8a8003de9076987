"""What the Alerts page and "While you were away" both show under their summary table: alerts per
time bucket (counted in SQL, :func:`dashboard.queries.alert_rate`) beside the busiest keys
(:func:`dashboard.queries.busiest_keys`), for one user over the same filters or span; and the
"withheld (capped)" column their summary tables get when the alert cap withheld changes."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st
from sqlalchemy.orm import Session, sessionmaker

from dashboard import charts, queries

BUSIEST = 10  #: keys in the busiest-keys table
#: the summary tables' column of the changes the alert cap withheld (shown only when there are some)
WITHHELD = "withheld (capped)"


def with_withheld(frame: pd.DataFrame, rows: list[queries.SubscriptionSummary]) -> pd.DataFrame:
    """``frame`` (one row per summary row, a ``keys`` column) with :data:`WITHHELD` after ``keys``
    when the cap withheld changes of any of them (:mod:`dashboard.capped`); else as it is."""
    if not any(r.withheld for r in rows):
        return frame
    frame.insert(int(frame.columns.get_loc("keys")) + 1, WITHHELD, [r.withheld for r in rows])
    return frame


def rate_and_busiest(sm: sessionmaker[Session], username: str, **scope: Any) -> None:
    """The alert-rate chart (left; none when there are no alerts) and the busiest keys (right) of
    ``username``'s alerts within ``scope`` (the queries' keyword filters)."""
    rate = queries.alert_rate(sm, username, **scope)
    busy = queries.busiest_keys(sm, username, limit=BUSIEST, **scope)
    left, right = st.columns([3, 2])
    if rate.rows:
        left.altair_chart(charts.rate_chart(rate.rows, rate.bucket_s), width="stretch")
    right.caption("Busiest keys")
    right.dataframe(
        pd.DataFrame(
            [
                {"key": k.key, "subscription": k.subscription, "entered": k.entered, "left": k.left}
                for k in busy
            ],
            columns=["key", "subscription", "entered", "left"],
        ),
        hide_index=True,
        width="stretch",
    )
