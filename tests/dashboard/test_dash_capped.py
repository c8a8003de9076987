"""A CAPPED record (the alert cap, ``engine_alert_cap_per_lookup``) on the dashboard, against a real
PostgreSQL: "While you were away" counts it apart from ENTER / EXIT and says what it withheld, the
summaries count its withheld changes and no key for it, and the Alerts page lists it in words."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from dashboard import catchup, queries
from dashboard.timefmt import clock, utc_text
from dashboard.views.away import listing
from subscriptions.service import SubscriptionService
from tests.dashboard.support import add_alerts, subscribe
from tests.dashboard.test_dash_apptest import frame_with, log_frame, logged_in, texts

pytestmark = pytest.mark.integration

AT = datetime(2026, 11, 27, 12, 0, 1, tzinfo=UTC)
WITHHELD = {"withheld": 4900, "withheld_enter": 2300, "withheld_exit": 2600, "cap": 100}
WHEN = clock(AT)  # "2026-11-27 12:00:01" (the date: not today)
SAID = (
    f"capped: 4,900 more changes withheld at {WHEN} (2,300 ENTER, 2,600 EXIT; cap 100 per lookup) "
    "\u2014 the subscription's current results are complete"
)


def _storm(sm: sessionmaker[Session], svc: SubscriptionService, user: str) -> Any:
    sub = subscribe(svc, user, "everything")
    add_alerts(sm, sub.id, [("AAPL", "ENTER"), ("MSFT", "ENTER")], as_of=AT)
    add_alerts(sm, sub.id, [("", "CAPPED")], values=WITHHELD, as_of=AT)
    return sub


def test_catch_up_and_summaries_count_a_capped_record_apart(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    user = new_user("capped")
    sub = _storm(sm, svc, user)
    snap = catchup.catch_up(sm, user, "web")
    (g,) = snap.groups
    assert (g.enters, g.exits, g.capped, g.withheld, g.total) == (2, 0, 1, 4900, 3)
    assert listing(g).splitlines()[0] == f"{WHEN}  CAPPED  {SAID.replace(f' at {WHEN}', '')}"
    (row,) = queries.summary_by_subscription(sm, user)
    assert (row.entered, row.left, row.keys, row.withheld) == (2, 0, 2, 4900)
    assert {k.key for k in queries.busiest_keys(sm, user)} == {"AAPL", "MSFT"}
    assert "" not in queries.known_keys(sm, user)
    assert [r.key for r in queries.alerts(sm, user, limit=10, kinds=["CAPPED"])] == [""]
    assert sub.id == g.subscription_id


def test_alerts_and_away_pages_say_what_was_withheld(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    user = new_user("capview")
    _storm(sm, svc, user)
    away = logged_in(sm, user, "While you were away")
    assert not away.exception
    assert [m.value for m in away.metric][:2] == ["2", "0"]  # keys entered / left: ENTER and EXIT only
    assert any(
        "Capped: 4,900 more changes withheld at 1 lookup(s) of everything" in c.value for c in away.caption
    )
    assert any("CAPPED  capped: 4,900 more changes withheld" in c.value for c in away.code)
    at = logged_in(sm, user, "Alerts")
    assert not at.exception
    assert f"Latest: {SAID.replace(WHEN, utc_text(AT))} (everything)" in texts(at)
    df = log_frame(at)
    assert df[df["kind"] == "CAPPED"]["values"].tolist() == [SAID]
    summary = frame_with(at, "entered", "left", "keys")
    assert summary[["entered", "left", "keys", "withheld (capped)"]].values.tolist() == [[2, 0, 2, 4900]]
    assert "CAPPED" in at.multiselect(key="alerts_kinds").options


def test_the_kind_legend_names_capped_only_when_there_is_one() -> None:
    from dashboard.charts import kind_colors

    assert list(kind_colors(["ENTER", "EXIT"]).domain) == ["ENTER", "EXIT"]
    assert list(kind_colors(["EXIT", "CAPPED"]).domain) == ["ENTER", "EXIT", "CAPPED"]
