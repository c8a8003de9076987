"""A new user's first hour, in a real browser on the real pipeline (issue 21, "Proof").

The same services as ``test_dash_e2e.py`` (:class:`tests.dashboard.e2e.Pipeline`: relay, engine, dashboard on
the session's PostgreSQL and Kafka containers; Debian's chromium driven by Playwright):

1. sign up: the landing page is the empty state, which says what to do and has a button to
   Subscribe (not "No alerts match yet.");
2. the button opens Subscribe; pick a template (the demo's "Volume over 5 minutes"), name it,
   subscribe;
3. trades arrive: the Alerts page shows a summary (per subscription entered / left, alerts per
   time bucket, the busiest keys) with the alert log one tab away; every time is UTC text;
4. log out; more trades arrive; log in again: "While you were away" sums up what was missed,
   with the current result set as a table and the raw log one click away.

Screenshots of each step go to ``docs/img/first_hour_*.png`` (README, "First hour").
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from dashboard.rules import TEMPLATES
from dashboard.ui import EMPTY_TITLE
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
from tidewatch.db.models import Alert, Subscription

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEMPLATE = "Volume over 5 minutes (Arasu & Widom, Example 2.1)"
NAME = "Volume over 5 minutes"


def _shot(page: Any, name: str) -> None:
    time.sleep(1.5)  # charts draw
    page.screenshot(path=str(IMG / f"first_hour_{name}.png"), full_page=True)


def _sign_up(page: Any, url: str, username: str) -> None:
    page.goto(url, wait_until="networkidle")
    page.locator('[data-testid="stForm"]').first.get_by_label("User name").wait_for(timeout=TIMEOUT_MS)
    time.sleep(1.0)
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


def test_a_new_users_first_hour(pipeline: Pipeline, browser: Any) -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    url, procs = pipeline.url, pipeline.procs
    username = "first" + uuid.uuid4().hex[:8]
    dialogs: list[str] = []
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    watch_dialogs(page, dialogs)

    # 1. sign up: an empty state that leads to Subscribe
    _sign_up(page, url, username)
    page.get_by_text(EMPTY_TITLE).wait_for(timeout=TIMEOUT_MS)
    assert page.get_by_text("No alerts match yet.").count() == 0
    page.get_by_text("You have no subscriptions yet", exact=False).first.wait_for(timeout=TIMEOUT_MS)
    # viewer toolbar: no "Deploy" button
    assert page.get_by_role("button", name="Deploy").count() == 0
    _shot(page, "1_empty")

    # 2. subscribe from a template
    page.get_by_role("button", name="Subscribe to a rule").click()
    rule_box = page.get_by_role("textbox", name="Rule", exact=True)
    rule_box.wait_for(timeout=TIMEOUT_MS)
    page.locator('[data-testid="stSelectbox"]', has_text="Template").click()
    page.get_by_role("option", name=TEMPLATE).click()
    wait(lambda: rule_box.input_value() == TEMPLATES[TEMPLATE], 20, "the template in the editor")
    page.get_by_text("The rule is valid.").wait_for(timeout=TIMEOUT_MS)
    name_box = page.get_by_role("textbox", name="Name", exact=True)
    name_box.fill(NAME)
    name_box.press("Enter")
    time.sleep(0.5)
    _shot(page, "2_subscribe")
    page.get_by_role("button", name="Subscribe").click()
    page.get_by_text(f"Subscribed: {NAME}.").wait_for(timeout=TIMEOUT_MS)
    sub_id = pipeline.scalar(sa.select(Subscription.id).where(Subscription.owner == username))
    active = f"subscription {sub_id} ("
    wait(
        lambda: any(active in ln and "is active" in ln for ln in pipeline.engine.text().splitlines()),
        ENGINE_START_S,
        "the engine to apply the subscription",
        procs,
    )

    # 3. trades arrive: the Alerts page sums them up, the log one tab away
    sidebar(page, "Alerts")
    page.get_by_text("No alerts match yet.").wait_for(timeout=TIMEOUT_MS)  # subscribed, nothing yet
    b1 = int(time.time() * 1000) // G * G - 3 * G
    pipeline.feed(
        [
            ("AAPL", b1 + 100, 600),
            ("AAPL", b1 + 200, 600),
            ("MSFT", b1 + 300, 700),
            ("MSFT", b1 + 400, 700),
            ("ZZZ", b1 + 2 * G, 1),
        ]
    )
    n_alerts = sa.select(sa.func.count()).select_from(Alert).where(Alert.subscription_id == sub_id)
    wait(lambda: pipeline.scalar(n_alerts) >= 2, PIPELINE_S, "the first alerts", procs)
    page.get_by_text("2 alert(s) shown").wait_for(timeout=TIMEOUT_MS)
    page.locator('[data-testid="stDataFrame"]', has_text="entered").first.wait_for(timeout=TIMEOUT_MS)
    row = [NAME, "active", "2", "0", "2"]
    wait_rows(page, "entered", lambda rows: row in [r[:5] for r in rows], "the summary", procs)
    # the busiest-keys table renders after the summary (a page refresh may come between): poll it
    wait_rows(
        page,
        "MSFT",
        lambda rows: sorted(r[0] for r in rows if r[0] in ("AAPL", "MSFT")) == ["AAPL", "MSFT"],
        "the busiest keys AAPL and MSFT",
        procs,
    )
    assert page.get_by_text(" UTC", exact=False).count() >= 1  # "Latest: ... as of <date> UTC"
    _shot(page, "3_results")
    page.get_by_role("tab", name="Alert log", exact=False).click()
    page.locator('[data-testid="stVegaLiteChart"]').last.wait_for(timeout=TIMEOUT_MS)

    # 4. log out; more trades; back: a summary of what was missed
    page.locator('[data-testid="stSidebar"]').get_by_role("button", name="Log out").click()
    page.get_by_role("tab", name="Log in").wait_for(timeout=TIMEOUT_MS)
    ctx.close()
    b2 = max(b1 + 3 * G, int(time.time() * 1000) // G * G - 3 * G)
    pipeline.feed([("IBM", b2 + 100, 800), ("IBM", b2 + 200, 800), ("ZZZ", b2 + 2 * G, 1)])
    wait(lambda: pipeline.scalar(n_alerts) >= 3, PIPELINE_S, "the alert while away", procs)
    ctx2 = browser.new_context(viewport={"width": 1400, "height": 1000})
    page2 = ctx2.new_page()
    watch_dialogs(page2, dialogs)
    login(page2, url, username)
    page2.get_by_text("1 alert(s) while you were away").wait_for(timeout=TIMEOUT_MS)
    page2.locator('[data-testid="stDataFrame"]', has_text="IBM").first.wait_for(timeout=TIMEOUT_MS)
    # the tables render one after the other (Streamlit's grid fills its cells late): poll them
    summary = wait_rows(page2, "in result now", bool, "the summary table", procs)
    assert [r[:6] for r in summary] == [[NAME, "active", "1", "0", "1", "3"]], summary
    current = wait_rows(page2, "AAPL", lambda rows: len(rows) >= 3, "the current results", procs)
    assert sorted(r[0] for r in current) == ["AAPL", "IBM", "MSFT"]
    assert all(r[1].count(":") == 2 and r[1][:4].isdigit() for r in current)  # "YYYY-MM-DD HH:MM:SS"
    _shot(page2, "4_away")
    page2.get_by_text("Raw alert log").click()
    page2.get_by_text(f"Subscription: {NAME}").wait_for(timeout=TIMEOUT_MS)
    (listing,) = code_blocks(page2)
    assert "ENTER  IBM" in listing and "AAPL" not in listing
    ctx2.close()
    assert dialogs == []
