"""End to end on the real pipeline, in a real headless browser (Debian's chromium driven by
Playwright; no downloaded browser).

Everything runs as it does under ``tidewatch up``, each as its own process started by the
test and stopped by its process group afterwards:

* PostgreSQL and Kafka: the session's containers (``pg_url``, ``kafka_bootstrap`` in
  ``tests/conftest.py``), with a fresh migrated database and per-run topics (one partition,
  so the event order the test writes is the order the engine reads);
* ``tidewatch subscriptions relay``: the outbox relay, which carries the subscription the
  browser saves to the ``subscriptions`` topic;
* ``tidewatch engine run``: the Spark engine (``local[2]``), reading Kafka and writing the
  alert log, current results and metrics to PostgreSQL;
* ``streamlit run dashboard/app.py`` (the command of ``tidewatch dashboard``);
* the feed: ``tidewatch feed trades --csv`` (the ingest producer) sends CSV trades whose
  event times the test chooses, so which alerts fire, and at which lookup time, is known in
  advance (allowed lateness 0, pane 1 s).  The trades are sent only once the engine has
  applied the subscription (its log line "subscription <id> (...) ... is active"), so the
  first alert comes from the lookups of the trades' own panes, not from the PSoup
  evaluation of a rule added over data already held, whose time would depend on timing.

Scenario (issue 6, "Proof"): a user signs up in the browser and subscribes a rule (after
seeing a malformed version rejected, with a name full of HTML); the feed sends trades that
satisfy it; the engine fires and the alert appears live with its values; the dashboard
process restarts under the open tab, which falls back to the login form; the tab is closed;
more trades make one key leave and another enter; the user logs in again and "While you
were away" lists exactly the missed alerts and the current result, compared against the
database; a third login shows nothing as new; no script from user text ever ran.
Screenshots of the main pages go to ``docs/img/``.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from dashboard.catchup import format_values
from dashboard.timefmt import clock
from tests.dashboard.e2e import (
    ENGINE_START_S,
    IMG,
    PIPELINE_S,
    TIMEOUT_MS,
    G,
    Pipeline,
    code_blocks,
    login,
    sidebar,
    wait,
    wait_rows,
    watch_dialogs,
)
from tests.dashboard.support import PASSWORD
from tidewatch.db.models import ClientCursor, CurrentResult, EngineMetric, Subscription

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RULE = "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 10 SECONDS > 1000"
NAME = "<script>alert('x')</script> big volume"
AGG = "SUM(size) OVER LAST 10 SECONDS"  # the rule's aggregate, as the engine names it in values
MARKUP_RULE = "<img src=x onerror=alert('rule')> SELECT"


def _floats(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()}


LISTING = re.compile(r"^(\S+ \S+)  (ENTER|EXIT)\s+(\S+)  \((.*)\)$")


def test_subscribe_alert_disconnect_and_catch_up_on_the_real_pipeline(
    pipeline: Pipeline, browser: Any
) -> None:
    t_start = time.monotonic()
    IMG.mkdir(parents=True, exist_ok=True)
    url, procs = pipeline.url, pipeline.procs
    username = "e2e" + uuid.uuid4().hex[:8]
    dialogs: list[str] = []

    # --- sign up and subscribe in the browser --------------------------------------------------
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    watch_dialogs(page, dialogs)
    page.goto(url, wait_until="networkidle")
    # the first run has drawn the form's fields (not only their placeholders)
    page.locator('[data-testid="stForm"]').first.get_by_label("User name").wait_for(timeout=TIMEOUT_MS)
    time.sleep(1.0)
    page.screenshot(path=str(IMG / "login.png"))
    form = page.locator('[data-testid="stForm"]').nth(1)

    def sign_up_tab_open() -> bool:  # a click during the page's first runs can be lost: retry
        if not form.get_by_label("User name").is_visible():
            page.get_by_role("tab", name="Sign up").click(timeout=5_000)
            time.sleep(0.5)
        return bool(form.get_by_label("User name").is_visible())

    wait(sign_up_tab_open, 30, "the Sign up tab")
    form.get_by_label("User name").fill(username)
    form.get_by_label("Password", exact=True).fill(PASSWORD)
    form.get_by_label("Password again").fill(PASSWORD)
    form.get_by_role("button", name="Sign up").click()
    page.get_by_text(f"Signed in as {username}").wait_for(timeout=TIMEOUT_MS)

    sidebar(page, "Subscribe")
    name_box = page.get_by_role("textbox", name="Name", exact=True)
    name_box.fill(NAME)
    name_box.press("Enter")
    rule_box = page.get_by_role("textbox", name="Rule", exact=True)
    rule_box.fill(MARKUP_RULE)
    rule_box.press("Control+Enter")
    page.locator('[data-testid="stCode"]', has_text=MARKUP_RULE).wait_for(timeout=TIMEOUT_MS)
    assert page.get_by_text("line 1, column 1:").count() >= 1  # a parse error, shown as text
    assert page.locator('img[src="x"]').count() == 0  # the markup was not made into elements
    rule_box.fill(RULE.replace("SECONDS", "SECONDZ"))
    rule_box.press("Control+Enter")
    page.get_by_text("unexpected 'SECONDZ'").first.wait_for(timeout=TIMEOUT_MS)
    caret = page.locator('[data-testid="stCode"]', has_text="SECONDZ")
    caret.wait_for(timeout=TIMEOUT_MS)
    assert "^" in caret.inner_text(), caret.inner_text()  # the caret under the column
    assert page.get_by_role("button", name="Subscribe").is_disabled()
    rule_box.fill(RULE)
    rule_box.press("Control+Enter")
    page.get_by_text("The rule is valid.").wait_for(timeout=TIMEOUT_MS)
    page.get_by_text("Compiled plan (rules explain)").click()
    page.get_by_role("button", name="Subscribe").click()
    page.get_by_text("Subscribed:").wait_for(timeout=TIMEOUT_MS)
    assert page.get_by_text(f"Subscribed: {NAME}.", exact=False).count() == 1  # verbatim, not markup
    page.get_by_role("button", name="Pause").wait_for(timeout=TIMEOUT_MS)  # now editing the saved one
    sub_id = pipeline.scalar(sa.select(Subscription.id).where(Subscription.owner == username))
    assert pipeline.scalar(sa.select(Subscription.name).where(Subscription.id == sub_id)) == NAME

    # --- the relay carries it to Kafka, the engine applies it --------------------------------------
    active = f"subscription {sub_id} ("
    wait(
        lambda: any(active in ln and "is active" in ln for ln in pipeline.engine.text().splitlines()),
        ENGINE_START_S,
        "the engine to apply the subscription (outbox -> relay -> Kafka -> engine)",
        procs,
    )
    t_engine = time.monotonic() - t_start

    # --- the feed sends trades that satisfy the rule; the alert appears live -------------------
    sidebar(page, "Alerts")  # open before anything fired: the alert must arrive by the auto-refresh
    page.get_by_text("No alerts match yet.").wait_for(timeout=TIMEOUT_MS)
    b1 = int(time.time() * 1000) // G * G - 3 * G
    pipeline.feed([("AAPL", b1 + 100, 600), ("AAPL", b1 + 200, 600), ("ZZZ", b1 + 2 * G, 1)])
    # SUM(size) over (tau - 10 s, tau] exceeds 1000 from the lookup at b1 + 1 s on
    latest = page.get_by_text("Latest: ENTER AAPL")
    wait(lambda: latest.count() > 0, PIPELINE_S, "the alert on the live Alerts page", procs)
    first = pipeline.alerts(sub_id)
    assert [a[1:4] for a in first] == [("ENTER", "AAPL", b1 + G)]
    assert _floats(first[0][4]) == {AGG: 1200.0}  # the engine records the values that made it fire
    assert page.locator("script", has_text="alert('x')").count() == 0  # the name is text, not a script
    page.get_by_text("1 alert(s) shown").wait_for(timeout=TIMEOUT_MS)
    # "the values that made it fire", as the engine recorded them
    assert format_values(first[0][4]) == f"{AGG} = 1200"
    page.get_by_text(f"Values: {AGG} = 1200", exact=True).wait_for(timeout=TIMEOUT_MS)
    first_seq = first[0][0]
    cursor_q = sa.select(ClientCursor.last_alert_seq).where(ClientCursor.username == username)
    # shown live, so not "new" on the next reconnect
    wait(lambda: pipeline.scalar(cursor_q) == first_seq, 15, "the live page to move the cursor")

    sidebar(page, "Key detail")
    page.get_by_role("textbox", name="or type a key").fill("AAPL")
    page.get_by_role("textbox", name="or type a key").press("Enter")
    page.get_by_text("Key: AAPL").wait_for(timeout=TIMEOUT_MS)
    # the aggregate over its window, computed by the engine from its state, threshold drawn in
    charts = page.locator('[data-testid="stVegaLiteChart"]')
    wait(lambda: charts.count() >= 2, TIMEOUT_MS / 1000, "the aggregate chart of AAPL")
    assert page.get_by_text("No trades events of this key").count() == 0
    time.sleep(1.5)
    page.screenshot(path=str(IMG / "key_detail.png"), full_page=True)
    sidebar(page, "Health")
    page.get_by_text("The engine is running").wait_for(timeout=TIMEOUT_MS)
    assert pipeline.scalar(sa.select(sa.func.count()).select_from(EngineMetric)) >= 1
    time.sleep(1.0)
    page.screenshot(path=str(IMG / "health.png"), full_page=True)
    # the subscription being edited, its compiled plan, and its current result set (AAPL now)
    sidebar(page, "Subscribe")
    page.get_by_text("Compiled plan (rules explain)").click()
    page.get_by_text("Current result set").wait_for(timeout=TIMEOUT_MS)
    page.set_viewport_size({"width": 1400, "height": 1500})
    time.sleep(1.5)
    page.screenshot(path=str(IMG / "subscribe.png"))

    # --- the dashboard restarts under the open tab: the browser session (and the token it held,
    # in server memory only) is gone. The tab keeps what it showed until the next interaction,
    # which runs on a new server session: the login form. Nothing is lost (the cursor stays). --
    pipeline.restart_dashboard()

    def at_login_form() -> bool:
        if page.get_by_role("tab", name="Log in").count():
            return True
        sidebar = page.locator('[data-testid="stSidebar"]').get_by_text("Alerts", exact=True)
        if sidebar.count():  # the old page: interact (again, until the tab has reconnected)
            try:
                sidebar.click(timeout=5_000)
            except PlaywrightTimeout:  # the old page may not take clicks while the tab reconnects
                pass
        time.sleep(1.0)
        return False

    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    wait(at_login_form, 120, "the reconnected tab to show the login form", procs)
    assert page.get_by_text(f"Signed in as {username}").count() == 0
    assert pipeline.scalar(cursor_q) == first_seq

    # --- the tab is closed; more alerts fire ----------------------------------------------------
    ctx.close()
    b2 = max(b1 + 12 * G, int(time.time() * 1000) // G * G - 3 * G)
    pipeline.feed([("MSFT", b2 + 100, 700), ("MSFT", b2 + 200, 700), ("ZZZ", b2 + 2 * G, 1)])
    # AAPL's trades leave the 10 s window at the lookup b1 + 11 s; MSFT enters at b2 + 1 s
    expect = [("ENTER", "AAPL", b1 + G), ("EXIT", "AAPL", b1 + 11 * G), ("ENTER", "MSFT", b2 + G)]
    wait(lambda: len(pipeline.alerts(sub_id)) >= 3, PIPELINE_S, "the alerts of the second feed", procs)
    log = pipeline.alerts(sub_id)
    assert [a[1:4] for a in log] == expect
    assert [_floats(a[4]) for a in log] == [{AGG: 1200.0}, {AGG: 0.0}, {AGG: 1400.0}]
    missed = [a for a in log if a[0] > first_seq]
    with pipeline.db.connect() as c:
        current = c.execute(
            sa.select(CurrentResult.key, CurrentResult.since, CurrentResult.values).where(
                CurrentResult.subscription_id == sub_id
            )
        ).all()
    assert [r[0] for r in current] == ["MSFT"] and _floats(current[0][2]) == {AGG: 1400.0}

    # --- back again: "While you were away" lists exactly the missed alerts -----------------------
    ctx2 = browser.new_context(viewport={"width": 1400, "height": 1000})
    page2 = ctx2.new_page()
    watch_dialogs(page2, dialogs)
    login(page2, url, username)
    page2.get_by_text("2 alert(s) while you were away").wait_for(timeout=TIMEOUT_MS)
    # a summary first (per subscription entered / left, the busiest keys), the raw log one click away
    page2.locator('[data-testid="stDataFrame"]', has_text="MSFT").first.wait_for(timeout=TIMEOUT_MS)
    rows = wait_rows(page2, "entered", lambda rows: any(r[0] == NAME for r in rows), "the summary")
    (summary,) = [r for r in rows if r[0] == NAME]
    assert summary[:4] == [NAME, "active", "1", "1"], summary  # name, state, entered, left
    page2.get_by_text("Raw alert log").click()
    page2.get_by_text(f"Subscription: {NAME}").wait_for(timeout=TIMEOUT_MS)
    assert page2.get_by_text(f"Subscription: {NAME}").count() == 1
    codes = code_blocks(page2)
    shown = []
    for ln in codes[0].splitlines():
        m = LISTING.match(ln)
        assert m, ln
        shown.append(m.groups())
    # newest first, exactly the alerts after the cursor, with the engine's times and values
    assert shown == [(clock(a[5]), a[1], a[2], format_values(a[4])) for a in reversed(missed)]
    assert [s[3] for s in shown] == [f"{AGG} = 1400", f"{AGG} = 0"]
    (key, since, _) = current[0]
    # the current result set, at the engine's now, with its values: a table, times in UTC
    row = [key, clock(since), f"{AGG} = 1400"]
    # waited for: the table is drawn after the raw log's rerun (read at once, it was once still absent)
    wait_rows(page2, f"{AGG} = 1400", lambda rows: row in rows, "the current-results table")
    page2.screenshot(path=str(IMG / "while_you_were_away.png"), full_page=True)
    wait(lambda: pipeline.scalar(cursor_q) == log[-1][0], 15, "the cursor to move past what was shown")
    ctx2.close()

    # --- and once more: nothing is shown as new twice ---------------------------------------------
    ctx3 = browser.new_context(viewport={"width": 1400, "height": 1000})
    page3 = ctx3.new_page()
    watch_dialogs(page3, dialogs)
    login(page3, url, username)
    page3.get_by_text("3 alert(s) shown, 0 new").wait_for(timeout=TIMEOUT_MS)
    page3.get_by_text(f"Values: {AGG} = 1400", exact=True).wait_for(timeout=TIMEOUT_MS)
    time.sleep(1.5)  # the chart draws
    page3.screenshot(path=str(IMG / "alerts.png"), full_page=True)
    assert page3.get_by_text("alert(s) while you were away").count() == 0
    ctx3.close()
    assert dialogs == []  # no script from user text ever ran
    for p in procs:
        assert p.proc.poll() is None, f"{p.name} died:\n{p.tail()}"
    print(f"engine applied the subscription after {t_engine:.0f} s; total {time.monotonic() - t_start:.0f} s")
