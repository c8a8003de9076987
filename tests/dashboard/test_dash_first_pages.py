"""What a newcomer sees (AppTest, PostgreSQL): the empty state that leads to Subscribe, and
"While you were away" as a summary with the raw log one click away."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from dashboard import catchup
from dashboard.ui import EMPTY_TITLE
from subscriptions.service import SubscriptionService
from tests.dashboard.support import PASSWORD, add_alerts, subscribe
from tests.dashboard.test_dash_apptest import app, frame_with, frames, logged_in, texts

pytestmark = pytest.mark.integration


def charts(at: AppTest) -> list[tuple[dict[str, Any], list[pd.DataFrame]]]:
    """The Vega-Lite charts on the page: (spec, its datasets as frames)."""
    out = []
    for c in at.get("vega_lite_chart"):
        data = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in c.proto.datasets]
        out.append((json.loads(c.proto.spec), data))
    return out


@pytest.mark.parametrize("page", ["Alerts", "While you were away", "Key detail"])
def test_a_user_without_subscriptions_is_led_to_subscribe(
    app_env: str, sm: sessionmaker[Session], new_user: Any, page: str
) -> None:
    at = logged_in(sm, new_user("empty"), page)
    assert not at.exception
    assert EMPTY_TITLE in [s.value for s in at.subheader]
    assert "No alerts match yet." not in [i.value for i in at.info]
    assert not at.dataframe  # nothing empty drawn as if it were data
    (go,) = [b for b in at.button if b.label == "Subscribe to a rule"]
    go.click().run()
    assert at.session_state["tw_page"] == "Subscribe"
    assert not at.exception and at.text_area(key="sub_rule") is not None


def test_subscribed_but_quiet_says_so_instead_of_the_empty_state(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("quiet")
    subscribe(svc, name, "volume")
    at = logged_in(sm, name, "Alerts")
    assert "No alerts match yet." in [i.value for i in at.info]
    assert EMPTY_TITLE not in [s.value for s in at.subheader]


def test_while_you_were_away_is_a_summary_with_the_log_one_click_away(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("sumaway")
    vol, mom = subscribe(svc, name, "volume"), subscribe(svc, name, "momentum")
    add_alerts(sm, vol.id, [(f"S{i:02d}", "ENTER") for i in range(30)], values={"SUM(size)": 5})
    add_alerts(sm, vol.id, [("S00", "EXIT"), ("S01", "EXIT")])
    add_alerts(sm, vol.id, [("S00", "ENTER")])
    add_alerts(sm, mom.id, [("IBM", "ENTER")])
    at = app().run()
    at.text_input(key="login_username").input(name)
    at.text_input(key="login_password").input(PASSWORD)
    at.button(key="login_submit").click().run()
    assert not at.exception and at.session_state["tw_page"] == "While you were away"
    assert "34 alert(s) while you were away" in [s.value for s in at.subheader]
    assert [m.value for m in at.metric] == ["32", "2", "2"]  # entered, left, subscriptions
    summary = frame_with(at, "entered", "left", "in result now")
    assert summary[["subscription", "entered", "left", "keys", "in result now"]].values.tolist() == [
        ["volume", 31, 2, 30, 29],
        ["momentum", 1, 0, 1, 1],
    ]
    busy = frame_with(at, "key", "subscription", "entered", "left")
    assert busy.iloc[0].tolist() == ["S00", "volume", 2, 1] and len(busy) == 10
    # alerts per time bucket, counted in SQL: one bar per (bucket, kind), 34 in all
    ((rate, (bars,)),) = [c for c in charts(at) if c[0].get("mark", {}).get("type") == "bar"]
    assert int(bars["alerts"].sum()) == 34
    # one bar per bucket, labelled with its UTC start, in time order
    assert rate["encoding"]["x"]["title"] == "time (UTC)"
    assert rate["encoding"]["x"]["sort"] == sorted(set(bars["bucket"]), key=list(bars["bucket"]).index)
    # the raw log: one click away, in an expander
    (log,) = [e for e in at.expander if e.label.startswith("Raw alert log")]
    assert "Subscription: volume" in texts(at)
    # every alert of each subscription (fewer than the cap of catchup.PER_GROUP_LIMIT), newest first
    assert sorted(len(c.value.splitlines()) for c in at.code) == [1, 33]
    assert catchup.PER_GROUP_LIMIT > 33
    assert log is not None
    # the current result sets: sortable tables, times in UTC
    current = [f for f in frames(at) if {"key", "since (UTC)", "values"} <= set(f.columns)]
    assert [sorted(f["key"]) for f in current] == [["IBM"], [f"S{i:02d}" for i in range(30) if i != 1]]
    assert current[1]["since (UTC)"].iloc[0].tzinfo is None  # UTC wall time: no "+00:00" in the grid
    assert set(current[1]["values"]) == {"SUM(size) = 5", "\u2014"}
