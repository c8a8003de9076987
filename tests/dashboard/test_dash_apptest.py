"""Page logic with Streamlit's AppTest (no browser): login, ownership, validation, cursors."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from dashboard import auth, catchup
from subscriptions.service import SubscriptionService
from tests.dashboard.support import PASSWORD, RULE, add_alerts, add_storm_metrics, subscribe, two_batches
from tidewatch.db.models import EngineMetric
from tidewatch.settings import get_settings

pytestmark = pytest.mark.integration

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def app() -> AppTest:
    return AppTest.from_file(APP, default_timeout=60)


def logged_in(sm: sessionmaker[Session], username: str, page: str | None = None) -> AppTest:
    """An app whose browser session holds a live token of ``username`` (as after the login form)."""
    at = app()
    at.session_state["tw_token"] = auth.login(sm, username, PASSWORD, settings=get_settings()).token
    if page:
        at.session_state["tw_page"] = page
    return at.run()


def shown(markdown: str) -> str:
    """What Streamlit displays for Markdown produced by :func:`dashboard.ui.plain` (escapes removed)."""
    return re.sub(r"\\(.)", r"\1", markdown)


def texts(at: AppTest) -> list[str]:
    return [t.value for t in at.text]


def frames(at: AppTest) -> list[Any]:
    return [d.value for d in at.dataframe]


def frame_with(at: AppTest, *columns: str) -> Any:
    """The first dataframe on the page that has all of ``columns`` (None when there is none)."""
    return next((f for f in frames(at) if set(columns) <= set(f.columns)), None)


def log_frame(at: AppTest) -> Any:
    """The Alerts page's alert log (the table with the ``new`` and ``values`` columns)."""
    return frame_with(at, "new", "values")


def test_without_a_session_only_the_login_page_is_shown(app_env: str) -> None:
    at = app().run()
    assert not at.exception
    assert [t.label for t in at.tabs] == ["Log in", "Sign up"]
    assert not at.sidebar.radio  # no navigation before login


def test_sign_up_through_the_form_then_log_out(app_env: str, sm: sessionmaker[Session]) -> None:
    from tests.dashboard.support import unique

    name = unique("form")
    at = app().run()
    at.text_input(key="signup_username").input(name)
    at.text_input(key="signup_password").input(PASSWORD)
    at.text_input(key="signup_password2").input(PASSWORD)
    at.button(key="signup_submit").click().run()
    assert not at.exception
    assert f"Signed in as {name}" in [t.value for t in at.sidebar.text]
    assert at.session_state["tw_page"] == "Alerts"  # nothing happened yet: no catch-up page
    token = at.session_state["tw_token"]
    assert auth.resolve(sm, token) is not None
    at.sidebar.button(key="logout").click().run()
    assert auth.resolve(sm, token) is None
    assert [t.label for t in at.tabs] == ["Log in", "Sign up"]


def test_wrong_password_shows_an_error(app_env: str, new_user: Any) -> None:
    name = new_user()
    at = app().run()
    at.text_input(key="login_username").input(name)
    at.text_input(key="login_password").input("not the password")
    at.button(key="login_submit").click().run()
    assert "wrong user name or password" in [shown(e.value) for e in at.error]
    assert "tw_token" not in at.session_state


def test_login_opens_while_you_were_away_and_advances_the_cursor_after_display(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("away")
    sub = subscribe(svc, name, "<b>vol</b>")
    seqs = add_alerts(sm, sub.id, [("AAPL", "ENTER"), ("MSFT", "ENTER")])
    at = app().run()
    at.text_input(key="login_username").input(name)
    at.text_input(key="login_password").input(PASSWORD)
    at.text_input(key="login_client").input("laptop")
    at.button(key="login_submit").click().run()
    assert not at.exception
    assert at.session_state["tw_page"] == "While you were away"
    assert "2 alert(s) while you were away" in [s.value for s in at.subheader]
    assert "Subscription: <b>vol</b>" in texts(at)  # the name verbatim, as text
    assert [m.value for m in at.metric][:2] == ["2", "0"]
    listing = at.code[0].value.splitlines()
    assert [ln.split()[2:] for ln in listing] == [
        ["ENTER", "MSFT", "(\u2014)"],
        ["ENTER", "AAPL", "(\u2014)"],
    ]
    with sm() as s:
        assert catchup.get_cursor(s, name, "laptop") == max(seqs)
    # logging in again: nothing new is shown twice
    at2 = app().run()
    at2.text_input(key="login_username").input(name)
    at2.text_input(key="login_password").input(PASSWORD)
    at2.text_input(key="login_client").input("laptop")
    at2.button(key="login_submit").click().run()
    assert at2.session_state["tw_page"] == "Alerts"


def test_alerts_page_shows_only_own_alerts_and_acknowledges_what_it_showed(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    a, b = new_user("a"), new_user("b")
    sub_a = subscribe(svc, a, "a-rule")
    sub_b = subscribe(svc, b, "b-rule")
    add_alerts(sm, sub_a.id, [("SECRET", "ENTER")])
    seqs_b = add_alerts(sm, sub_b.id, [("IBM", "ENTER")])
    at = logged_in(sm, b, "Alerts")
    assert not at.exception
    df = log_frame(at)
    assert list(df["key"]) == ["IBM"] and list(df["subscription"]) == ["b-rule"] and list(df["new"]) == [True]
    # the summary first: per subscription entered / left (counted in SQL), the busiest keys
    summary = frame_with(at, "entered", "left", "keys")
    assert summary[["subscription", "entered", "left", "keys"]].values.tolist() == [["b-rule", 1, 0, 1]]
    busy = frame_with(at, "key", "entered", "left")
    assert busy[["key", "subscription", "entered"]].values.tolist() == [["IBM", "b-rule", 1]]
    assert [t.label for t in at.tabs] == ["Summary", "Alert log (newest 1)"]
    assert [o for o in at.multiselect(key="alerts_subs").options] == ["b-rule"]
    with sm() as s:
        assert catchup.get_cursor(s, b, "web") == seqs_b[0]
    # a filter is kept over the live refresh (the fragment reruns alone) and filters the table
    at.text_input(key="alerts_key").input("zzz").run()
    assert at.text_input(key="alerts_key").value == "zzz"
    assert not frames(at)


def test_subscribe_page_validates_live_and_saves(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("sub")
    at = logged_in(sm, name, "Subscribe")
    assert not at.exception
    assert at.button(key="sub_save").disabled  # nothing to save yet
    at.text_area(key="sub_rule").input(
        "SELECT symbol FROM trades\nGROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDZ > 1000"
    ).run()
    assert [shown(e.value) for e in at.error] == ["line 2, column 48: unexpected 'SECONDZ'"]
    assert "SECONDZ" in at.code[0].value and "^" in at.code[0].value
    assert at.button(key="sub_save").disabled
    # a template fills the editor with a valid rule and the plan is shown
    at.selectbox(key="sub_template").select("Heavy hitter").run()
    assert "SUM(length) OVER LAST 1 MINUTE > 10000000" in (at.text_area(key="sub_rule").value or "")
    assert [s.value for s in at.success] == ["The rule is valid."]
    assert any("CI-SUM" in c.value for c in at.code)
    nasty = "<img src=x onerror=alert(1)> '; DROP TABLE subscriptions; --"
    at.text_input(key="sub_name").input(nasty)
    at.button(key="sub_save").click().run()
    assert not at.exception
    (sub,) = svc.list(name)
    assert sub.name == nasty and sub.state == "active"
    assert nasty in list(frames(at)[0]["name"])
    # pause, resume, delete through the page
    at.button(key="sub_pause").click().run()
    assert svc.get(name, sub.id).state == "paused"
    at.button(key="sub_resume").click().run()
    assert svc.get(name, sub.id).state == "active"
    at.checkbox(key="sub_confirm_delete").check().run()
    at.button(key="sub_delete").click().run()
    assert svc.list(name) == []


def test_subscribe_page_lists_only_own_subscriptions(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    a, b = new_user("a"), new_user("b")
    subscribe(svc, a, "a-private", RULE)
    at = logged_in(sm, b, "Subscribe")
    assert "a-private" not in str(frames(at)) and "None yet." in [i.value for i in at.info]
    assert at.selectbox(key="sub_edit").options == ["(new subscription)"]


def test_key_detail_and_health_pages_render(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("kd")
    sub = subscribe(svc, name, "vol")
    add_alerts(sm, sub.id, [("AAPL", "ENTER")], values={"SUM(size) OVER LAST 5 MINUTES": 1234})
    at = logged_in(sm, name, "Key detail")
    assert not at.exception
    assert at.selectbox(key="detail_pick").options == ["", "AAPL"]
    at.selectbox(key="detail_pick").select("AAPL").run()
    assert not at.exception
    assert "Key: AAPL" in texts(at)
    assert list(frames(at)[0]["in result now"]) == [True]
    assert list(frames(at)[0]["values"]) == ["SUM(size) OVER LAST 5 MINUTES = 1234"]
    at.sidebar.radio(key="tw_page").set_value("Health").run()
    assert not at.exception
    assert at.metric  # events/s, batch duration, lag, dead letters, last batch


def test_health_page_warns_of_an_alert_storm(
    app_env: str,
    sm: sessionmaker[Session],
    svc: SubscriptionService,
    new_user: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A minute at 200 alerts/s after a quarter hour at 5/s: the Health page shows alerts/s and a
    storm warning naming the user's subscription (another user sees "another user's
    subscription") and saying the engine keeps up."""
    monkeypatch.setenv("TIDEWATCH_RUN_DIR", str(tmp_path))  # the engine's run record: none
    get_settings.cache_clear()
    owner, other = new_user("storm"), new_user("calm")
    sub = subscribe(svc, owner, "everything *crosses*")
    add_storm_metrics(sm, datetime.now(UTC) - timedelta(seconds=1), sub.id)
    try:
        at = logged_in(sm, owner, "Health")
        assert not at.exception
        assert [x.value for x in at.success][0].startswith("The engine is running")
        (warn,) = [shown(x.value) for x in at.warning]
        assert warn.startswith("Alert storm: 200 alerts/s over the last 60 s, 40× the usual 5.0/s")
        assert f"'everything *crosses*' ({str(sub.id)[:8]}): at least 90% of the alerts" in warn
        assert warn.endswith("The engine is keeping up (lag 0.9 s).")
        assert {m.label: m.value for m in at.metric}["alerts/s"] == "200"
        assert any("Alert storm rule: ≥ 10× the median minute" in c.value for c in at.caption)
        at = logged_in(sm, other, "Health")
        (warn,) = [shown(x.value) for x in at.warning]
        assert f"another user's subscription ({str(sub.id)[:8]})" in warn and "everything" not in warn
    finally:
        with sm.begin() as db:
            db.execute(delete(EngineMetric))


def test_health_page_shows_the_drivers_share_and_ceiling(
    app_env: str, sm: sessionmaker[Session], new_user: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two batches 2 s apart, the newer one's driver CPU 400 ms for 504 events (1,200/s × 0.42 s):
    the Health page says the driver used 20 % of a core and would saturate one at no less than
    1.3 k events/s
    (793.65 µs per event) -- and "-" before any batch has reported its CPU (migration 0013)."""
    monkeypatch.setenv("TIDEWATCH_RUN_DIR", str(tmp_path))
    get_settings.cache_clear()
    older, newer = two_batches(
        datetime.now(UTC), {"lag_ms": 800.0}, {"lag_ms": 900.0, "driver_cpu_ms": 400.0}
    )
    with sm.begin() as db:
        db.execute(delete(EngineMetric))
        db.add(older)
    try:
        at = logged_in(sm, new_user("cpu"), "Health")
        assert not at.exception and {m.label: m.value for m in at.metric}["driver CPU"] == "-"
        with sm.begin() as db:
            db.add(newer)
        at.run()
        shown_metrics = {m.label: m.value for m in at.metric}
        assert not at.exception
        assert shown_metrics["driver CPU"] == "20% of a core"
        assert shown_metrics["driver ceiling"] == "≥ 1.3 k/s"  # a lower bound
        assert not any(c.value.startswith(("drivers:", "engines:")) for c in at.caption)  # one engine
        with sm.begin() as db:  # a second engine on the database, its driver busier
            db.add_all(
                EngineMetric(
                    engine_id="shard-2",
                    ts=datetime.now(UTC) - timedelta(seconds=ago),
                    batch_id=b,
                    events_per_s=1000.0,
                    batch_ms=100.0,
                    lag_ms=5000.0,
                    driver_cpu_ms=cpu,
                )  # fmt: skip
                for b, ago, cpu in [(1, 1.5, None), (2, 0.5, 500.0)]
            )
        at.run()
        shown_metrics = {m.label: m.value for m in at.metric}
        assert not at.exception and shown_metrics["driver CPU"] == "50% of a core"  # the busiest
        assert shown_metrics["driver ceiling"] == "≥ 200/s"  # its own: 0.5 s for 100 events
        lines = [c.value for c in at.caption if c.value.startswith("drivers:")]
        assert lines == [
            "drivers: shard-2 50% of a core, ≥ 200 events/s; default 20% of a core, ≥ 1.3 k events/s"
        ]
        # the top figures are the worst engine's: shard-2's lag, the default engine's batch time
        assert (shown_metrics["lag"], shown_metrics["batch duration"]) == ("5.0 s", "420 ms")
        assert shown_metrics["processing capacity"] == "2,200/s"  # 1,200 + 1,000
        (engines,) = [c.value for c in at.caption if c.value.startswith("engines:")]
        assert engines.startswith("engines: default lag 0.9 s, batch 420 ms, last ")
        assert "; shard-2 lag 5.0 s, batch 100 ms, last " in engines
    finally:
        with sm.begin() as db:
            db.execute(delete(EngineMetric))


def test_health_page_shows_the_fitted_ceiling_where_batch_sizes_vary(
    app_env: str, sm: sessionmaker[Session], new_user: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight batches a second apart of 1,000-8,000 events, each costing the driver 10 ms plus
    2 µs per event: the ceiling is the fit's, (1 - 10 ms × 1 batch/s) / 2 µs ≈ 495 k events/s,
    shown as "≈"; its help gives the fit's two costs and the bound counting both per event
    (140 ms for 35,000 events: 250 k/s)."""
    monkeypatch.setenv("TIDEWATCH_RUN_DIR", str(tmp_path))
    get_settings.cache_clear()
    now = datetime.now(UTC)
    rows = [
        EngineMetric(
            ts=now - timedelta(seconds=8 - i),
            batch_id=i + 1,
            events_per_s=1000.0,
            batch_ms=1000.0 * (i + 1),  # 1,000 × (i + 1) events
            lag_ms=500.0,
            driver_cpu_ms=10.0 + 0.002 * 1000.0 * (i + 1),
        )  # fmt: skip
        for i in range(8)
    ]
    with sm.begin() as db:
        db.execute(delete(EngineMetric))
        db.add_all(rows)
    try:
        at = logged_in(sm, new_user("fit"), "Health")
        assert not at.exception
        (ceiling,) = [m for m in at.metric if m.label == "driver ceiling"]
        assert ceiling.value == "≈ 495 k/s"
        assert "10.0 ms fixed per batch, 2.000 µs per event, at 1.00 batches per second" in ceiling.help
        assert "the bound from below is 250 k/s" in ceiling.help
        assert {m.label: m.value for m in at.metric}["driver CPU"] == "2% of a core"
    finally:
        with sm.begin() as db:
            db.execute(delete(EngineMetric))


def test_subscribe_page_edits_a_subscription_and_refuses_a_duplicate_name(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("edit")
    first = subscribe(svc, name, "first")
    subscribe(svc, name, "second")
    at = logged_in(sm, name, "Subscribe")
    at.selectbox(key="sub_edit").select(str(first.id)).run()
    assert at.text_input(key="sub_name").value == "first" and at.text_area(key="sub_rule").value == RULE
    assert at.button(key="sub_save").label == "Save changes"
    new_rule = RULE.replace("> 1000", "> 5000")
    at.text_area(key="sub_rule").input(new_rule)
    at.button(key="sub_save").click().run()
    assert not at.exception
    edited = svc.get(name, first.id)
    assert edited.rule_text == new_rule and edited.version == first.version + 1
    assert [shown(s.value) for s in at.success][0] == f"Saved first (version {edited.version})."
    # another of the user's names is refused, and nothing changes
    at.text_input(key="sub_name").input("second")
    at.button(key="sub_save").click().run()
    assert [shown(e.value) for e in at.error] == ["Not saved: you already have a subscription named 'second'"]
    assert svc.get(name, first.id).name == "first" and svc.get(name, first.id).version == edited.version
