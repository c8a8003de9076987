"""Bad input through the pages (Streamlit AppTest against the real PostgreSQL), the login rate
limit as the form shows it, alert values as the pages show them, and the Health banner.

User text -- names, rule text, keys, values -- must come back as text: in ``st.text`` /
``st.code`` elements, dataframe cells, or Markdown that :func:`dashboard.ui.plain` escaped;
SQL metacharacters are stored and shown verbatim and change no query.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from dashboard.catchup import NO_VALUES, NULL_MEANS, format_values
from engine import liveness
from subscriptions.service import NAME_MAX, SubscriptionService
from tests.dashboard.support import PASSWORD, RULE, add_alerts, subscribe
from tests.dashboard.test_dash_apptest import app, frames, log_frame, logged_in, shown, texts
from tidewatch.db.models import EngineMetric, LoginAttempt, User
from tidewatch.settings import get_settings

pytestmark = pytest.mark.integration

SCRIPT = "<script>alert('x')</script>"
IMG = "<img src=x onerror=alert(1)>"
SQL = "x'; DROP TABLE alerts; --"


def _lit(text: str) -> str:
    """A string literal of the rule language ('' is a quote inside it)."""
    return "'" + text.replace("'", "''") + "'"


def _errors(at: Any) -> list[str]:
    return [shown(e.value) for e in at.error]


# --- the rule editor ---------------------------------------------------------------------------


def test_huge_and_malformed_rules_are_refused_with_a_message_and_cannot_be_saved(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("big")
    at = logged_in(sm, name, "Subscribe")
    limit = get_settings().max_rule_chars
    # over the editor's max_chars: the browser cannot send it, and Streamlit drops such a value
    at.text_area(key="sub_rule").input("x" * (limit * 25)).run()
    assert not at.exception and len(at.text_area(key="sub_rule").value or "") <= limit
    assert at.button(key="sub_save").disabled
    cases = {
        "(" * 3000: "line 1, column",
        "x" * limit: "line 1, column 1:",
        "   \n  ": None,  # blank: the hint, no error
        RULE + " AND": "line 1, column",
        "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 0 SECONDS > 1": "line 1",
    }
    for text, message in cases.items():
        at.text_area(key="sub_rule").input(text).run()
        assert not at.exception, text[:40]
        assert at.button(key="sub_save").disabled, text[:40]
        if message is None:
            assert not at.error and at.info
        else:
            (err,) = _errors(at)
            assert err.startswith(message) or message in err, (text[:40], err)
    assert svc.list(name) == []


def test_html_and_sql_in_a_rule_are_stored_and_shown_verbatim(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("lit")
    at = logged_in(sm, name, "Subscribe")
    # a malformed rule made of markup: an error at 1:1, the text shown in a code block
    at.text_area(key="sub_rule").input(f"{IMG}{SCRIPT}").run()
    assert _errors(at)[0].startswith("line 1, column 1:")
    assert any(IMG + SCRIPT in c.value for c in at.code)
    # a valid rule whose string literals hold markup and SQL ('' is a quote inside a literal)
    rule = (
        f"SELECT symbol FROM trades WHERE exchange = {_lit(SCRIPT)} OR exchange = {_lit(SQL)} "
        "GROUP BY symbol HAVING COUNT(*) OVER LAST 10 SECONDS > 5"
    )
    at.text_area(key="sub_rule").input(rule).run()
    assert not at.error and [s.value for s in at.success] == ["The rule is valid."]
    at.text_input(key="sub_name").input(f"{SQL} {SCRIPT}").run()
    at.button(key="sub_save").click().run()
    assert not at.exception
    (sub,) = svc.list(name)
    assert sub.rule_text == rule and sub.name == f"{SQL} {SCRIPT}"
    df = frames(at)[0]
    assert list(df["rule"]) == [rule] and list(df["name"]) == [f"{SQL} {SCRIPT}"]
    # the flash message is Markdown: escaped, so it reads back verbatim
    assert [shown(s.value) for s in at.success][0] == (
        f"Subscribed: {SQL} {SCRIPT}. Its first results arrive within one micro-batch."
    )
    # the SQL in the literal did nothing
    with sm() as s:
        assert s.scalar(sa.text("SELECT to_regclass('alerts') IS NOT NULL"))
    # the Key detail page shows the rule text as code
    add_alerts(sm, sub.id, [("AAPL", "ENTER")])
    at.sidebar.radio(key="tw_page").set_value("Key detail").run()
    at.text_input(key="detail_key").input("AAPL").run()
    assert not at.exception
    assert rule in [c.value for c in at.code]
    assert f"Aggregates of {SQL} {SCRIPT}" in [shown(e.label) for e in at.expander]


def test_names_too_long_or_unprintable_are_refused_with_a_message(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("nm")
    at = logged_in(sm, name, "Subscribe")
    at.text_area(key="sub_rule").input(RULE).run()
    for bad in ("tab\there", "bell\a", "line\nbreak"):
        at.text_input(key="sub_name").input(bad)
        at.button(key="sub_save").click().run()
        assert not at.exception
        assert _errors(at) == [f"Not saved: a subscription name is 1-{NAME_MAX} printable characters"]
    assert svc.list(name) == []
    # longer than the field's max_chars: dropped, never stored
    at.text_input(key="sub_name").input("n" * 100_000)
    at.button(key="sub_save").click().run()
    assert not at.exception and all(len(s.name) <= NAME_MAX for s in svc.list(name))


# --- accounts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "username", [SCRIPT, "robert'); DROP TABLE users;--", "a" * 10_000, "ünïcode name", "%", ""]
)
def test_sign_up_with_a_bad_user_name_is_refused_as_text(
    app_env: str, sm: sessionmaker[Session], username: str
) -> None:
    at = app().run()
    at.text_input(key="signup_username").input(username)
    at.text_input(key="signup_password").input(PASSWORD)
    at.text_input(key="signup_password2").input(PASSWORD)
    at.button(key="signup_submit").click().run()
    assert not at.exception
    assert len(_errors(at)) == 1 and "tw_token" not in at.session_state
    with sm() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(User).where(User.username == username)) == 0
        assert s.scalar(sa.text("SELECT to_regclass('users') IS NOT NULL"))


def test_huge_password_and_huge_login_name_are_refused(app_env: str, new_user: Any) -> None:
    name = new_user("pw")
    at = app().run()
    at.text_input(key="login_username").input(name)
    at.text_input(key="login_password").input("p" * 1_000_000)
    at.button(key="login_submit").click().run()
    assert _errors(at) == ["wrong user name or password"]
    at.text_input(key="login_username").input("u" * 100_000)
    at.text_input(key="login_password").input(PASSWORD)
    at.button(key="login_submit").click().run()
    assert _errors(at) == ["wrong user name or password"] and "tw_token" not in at.session_state


def test_the_login_form_refuses_after_too_many_failures(
    app_env: str, sm: sessionmaker[Session], new_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEWATCH_LOGIN_MAX_FAILURES", "3")
    get_settings.cache_clear()
    name, other = new_user("rl"), new_user("rl")
    at = app().run()
    for _ in range(3):
        at.text_input(key="login_username").input(name)
        at.text_input(key="login_password").input("wrong password")
        at.button(key="login_submit").click().run()
        assert _errors(at) == ["wrong user name or password"]
    # the right password is now refused too, without being checked
    at.text_input(key="login_username").input(name)
    at.text_input(key="login_password").input(PASSWORD)
    at.button(key="login_submit").click().run()
    (err,) = _errors(at)
    assert err.startswith("too many failed logins") and "tw_token" not in at.session_state
    with sm() as s:
        rows = s.execute(
            sa.select(LoginAttempt.succeeded, LoginAttempt.client).where(LoginAttempt.username == name)
        ).all()
    assert [tuple(r) for r in rows] == [(False, "unknown")] * 3  # the refused attempt is not counted
    # another user name from the same client is not affected
    at.text_input(key="login_username").input(other)
    at.text_input(key="login_password").input(PASSWORD)
    at.button(key="login_submit").click().run()
    assert not at.exception and f"Signed in as {other}" in [t.value for t in at.sidebar.text]


# --- alerts, values, keys ---------------------------------------------------------------------


def test_a_null_value_is_shown_as_null_and_explained(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    """An aggregate without a value (an empty window) reads NULL, as in ``tidewatch alerts``,
    and the page says once what NULL means; without one, no such note."""
    name = new_user("null")
    sub = subscribe(svc, name, SCRIPT)
    add_alerts(sm, sub.id, [("MSFT", "ENTER")], values={"SUM(size) OVER LAST 10 SECONDS": 5.0})
    at = logged_in(sm, name, "Alerts")
    assert NULL_MEANS not in [c.value for c in at.caption]
    add_alerts(sm, sub.id, [("MSFT", "EXIT")], values={"AVG(size) OVER LAST 10 SECONDS": None})
    at = logged_in(sm, name, "Alerts")
    assert "Values: AVG(size) OVER LAST 10 SECONDS = NULL" in texts(at)
    assert NULL_MEANS in [c.value for c in at.caption]


def test_alert_values_keys_and_filters_are_shown_verbatim(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("val")
    sub = subscribe(svc, name, SCRIPT)
    add_alerts(sm, sub.id, [("MSFT", "ENTER")])  # no values recorded
    at = logged_in(sm, name, "Alerts")
    assert f"Values: {NO_VALUES}" in texts(at)
    assert list(log_frame(at)["values"]) == [NO_VALUES]
    values = {
        "SUM(size) OVER LAST 10 SECONDS": 1200.0,
        "AVG(price) OVER LAST 1 MINUTE": 101.23456789,
        IMG: SQL,
    }
    add_alerts(sm, sub.id, [(f"{IMG}%_", "ENTER")], values=values)
    at = logged_in(sm, name, "Alerts")
    line = format_values(values)
    assert line == (
        f"{IMG} = {SQL}, AVG(price) OVER LAST 1 MINUTE = 101.235, SUM(size) OVER LAST 10 SECONDS = 1200"
    )
    assert f"Values: {line}" in texts(at)
    assert f"Latest: ENTER {IMG}%_ ({SCRIPT})" in " ".join(texts(at))
    df = log_frame(at)
    assert list(df["key"]) == [f"{IMG}%_", "MSFT"] and list(df["values"]) == [line, NO_VALUES]
    # filters with SQL and LIKE metacharacters match themselves only
    for typed, keys in (
        ("' OR '1'='1", []),
        ("%_", [f"{IMG}%_"]),
        ("<img", [f"{IMG}%_"]),
        ("%", [f"{IMG}%_"]),
    ):
        at.text_input(key="alerts_key").input(typed).run()
        assert not at.exception
        got = log_frame(at)
        assert (list(got["key"]) if got is not None else []) == keys, typed


def test_while_you_were_away_shows_values_and_markup_as_text(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("awv")
    sub = subscribe(svc, name, IMG)
    add_alerts(sm, sub.id, [(SCRIPT, "ENTER")], values={"COUNT(*) OVER LAST 10 SECONDS": 13})
    add_alerts(sm, sub.id, [("IBM", "ENTER")])
    at = app().run()
    at.text_input(key="login_username").input(name)
    at.text_input(key="login_password").input(PASSWORD)
    at.button(key="login_submit").click().run()
    assert not at.exception
    assert f"Subscription: {IMG}" in texts(at)
    listing = [ln.split("  ", 2)[2] for ln in at.code[0].value.splitlines()]
    assert listing == [f"IBM  ({NO_VALUES})", f"{SCRIPT}  (COUNT(*) OVER LAST 10 SECONDS = 13)"]
    # the current result set: a sortable table, keys and values verbatim
    current = {r["key"]: r for r in frames(at)[-1].to_dict("records")}
    assert set(current) == {"IBM", SCRIPT}
    assert current["IBM"]["values"] == NO_VALUES
    assert current[SCRIPT]["values"] == "COUNT(*) OVER LAST 10 SECONDS = 13"
    assert current[SCRIPT]["since (UTC)"].tzinfo is None  # UTC wall time: no "+00:00" in the grid
    # the summary: per subscription, the name verbatim; the busiest keys, markup as text
    (summary,) = [f for f in frames(at) if "entered" in f.columns and "keys" in f.columns]
    assert summary[["subscription", "entered", "left", "keys"]].values.tolist() == [[IMG, 2, 0, 2]]


def test_key_detail_with_a_huge_or_html_key(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("kdx")
    subscribe(svc, name, "vol")
    at = logged_in(sm, name, "Key detail")
    for key in (SCRIPT, "' OR 1=1 --", "%"):
        at.text_input(key="detail_key").input(key).run()
        assert not at.exception
        assert f"Key: {key}" in texts(at)
        assert list(frames(at)[0]["in result now"]) == [False]
    at.text_input(key="detail_key").input("k" * 100_000).run()  # over max_chars: dropped
    assert not at.exception and not any(t.startswith("Key: k") for t in texts(at))


# --- the Health banner -------------------------------------------------------------------------


def _metric(sm: sessionmaker[Session], ts: datetime, lag_ms: float) -> None:
    with sm.begin() as s:
        s.add(EngineMetric(ts=ts, batch_id=10**6, events_per_s=500.0, batch_ms=80.0, lag_ms=lag_ms))


def test_health_banner_running_behind_and_down(
    app_env: str, sm: sessionmaker[Session], new_user: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEWATCH_RUN_DIR", str(tmp_path))  # the engine's run record: none yet
    get_settings.cache_clear()
    name = new_user("hl")
    now = datetime.now(UTC)
    s = get_settings()
    with sm.begin() as db:
        db.execute(sa.delete(EngineMetric))  # the lag series of other tests (hysteresis reads it)
    _metric(sm, now - timedelta(seconds=2), 800.0)
    at = logged_in(sm, name, "Health")
    assert not at.exception
    assert [x.value for x in at.success][0].startswith("The engine is running")
    assert not at.warning and not at.error
    for _ in range(3):  # three batches over the threshold in a row (hysteresis)
        _metric(sm, now - timedelta(seconds=1), s.engine_behind_lag_ms + 35_000)
    at = logged_in(sm, name, "Health")
    (warn,) = [x.value for x in at.warning]
    assert warn.startswith("The engine is behind: lag ") and not at.error
    _metric(sm, now - timedelta(seconds=s.engine_down_after_s + 120), 100.0)
    at = logged_in(sm, name, "Health")
    (err,) = [x.value for x in at.error]
    assert err.startswith("The engine looks down: its last batch was ") and not at.warning
    # the engine then failed: the banner gives its error and what to do
    boom = ValueError("TIDEWATCH_PANE_MS must divide every window <b>x</b>")
    liveness.write_record(s, liveness.failed("default", boom, s))
    at = logged_in(sm, name, "Health")
    (err,) = [x.value for x in at.error]
    assert err.startswith("The engine is down: it stopped on an error at ")
    assert "ValueError: TIDEWATCH_PANE_MS must divide every window" in err
    assert "`tidewatch restart engine`" in err


def test_a_draft_rule_and_the_filters_survive_a_visit_to_another_page(
    app_env: str, sm: sessionmaker[Session], new_user: Any
) -> None:
    name = new_user("keep")
    SubscriptionService(sm, settings=get_settings()).create(name, RULE, name="first")
    at = logged_in(sm, name, "Subscribe")
    at.text_input(key="sub_name").input(f"draft {SCRIPT}")
    at.text_area(key="sub_rule").input(RULE).run()
    at.sidebar.radio(key="tw_page").set_value("Alerts").run()
    at.text_input(key="alerts_key").input("AAPL").run()
    at.sidebar.radio(key="tw_page").set_value("Health").run()
    at.sidebar.radio(key="tw_page").set_value("Subscribe").run()
    assert not at.exception
    assert (
        at.text_area(key="sub_rule").value == RULE
        and at.text_input(key="sub_name").value == f"draft {SCRIPT}"
    )
    assert [s.value for s in at.success] == ["The rule is valid."]
    at.sidebar.radio(key="tw_page").set_value("Alerts").run()
    assert at.text_input(key="alerts_key").value == "AAPL"
