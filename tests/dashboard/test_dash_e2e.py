"""End to end in a real headless browser (Debian's chromium driven by Playwright).

The dashboard runs as ``streamlit run dashboard/app.py`` (the command of ``tidewatch
dashboard``) against the session's PostgreSQL.  The engine's driver-side batch logic
(:class:`engine.core.EngineCore` with the real shared evaluator) and its PostgreSQL writer
(:class:`engine.store.Store`) run in the test process: they read the subscription from the
outbox row the dashboard's save wrote, are fed Avro-encoded trades, and commit alerts and
current results exactly as the Spark driver does -- so the test needs no Spark or Kafka.

Scenario (issue 6, "Proof"): sign up, subscribe a rule, trades satisfy it, the alert
appears live; the tab is closed; more alerts fire; logging in again shows "While you were
away" with exactly the missed alerts and the current results.  Screenshots go to
``docs/img/``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import sqlalchemy as sa
from dash_helpers import PASSWORD

from dashboard.cli import streamlit_command
from engine.core import EngineCore, parse_subscription_change
from engine.store import Store
from ingest.avro import encode_batch
from tidewatch.db.models import Alert, ClientCursor, Outbox, Subscription
from tidewatch.db.session import make_engine

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
RULE = "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 10 SECONDS > 1000"
NAME = "<script>alert('x')</script> big volume"
TIMEOUT_MS = 30_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def dashboard_url(dash_db_url: str, tmp_path: Path) -> Iterator[str]:
    """``streamlit run dashboard/app.py`` on a free 127.0.0.1 port; stopped by PID afterwards."""
    port = _free_port()
    env = dict(os.environ, TIDEWATCH_DATABASE_URL=dash_db_url, TIDEWATCH_DASHBOARD_REFRESH_S="1")
    log = (tmp_path / "streamlit.log").open("wb")
    proc = subprocess.Popen(
        streamlit_command("127.0.0.1", port), env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.read() == b"ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"streamlit did not start: {(tmp_path / 'streamlit.log').read_text()[-2000:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


class MiniEngine:
    """The engine's driver logic and PostgreSQL writer, fed by the test instead of Spark."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.core = EngineCore(pane_ms=1000, allowed_lateness_ms=0, max_future_ms=10**12)
        self.store = Store(make_engine(url))
        self.batch = self.store.last_committed()
        self.outbox_seen = self._max_outbox()
        self.offset = 0

    def _max_outbox(self) -> int:
        with self.store.engine.connect() as c:
            return int(c.execute(sa.select(sa.func.coalesce(sa.func.max(Outbox.id), 0))).scalar_one())

    def changes(self) -> list[Any]:
        with self.store.engine.connect() as c:
            rows = c.execute(
                sa.select(Outbox.id, Outbox.key, Outbox.payload)
                .where(Outbox.id > self.outbox_seen)
                .order_by(Outbox.id)
            ).all()
        if rows:
            self.outbox_seen = rows[-1][0]
        return [parse_subscription_change(k.encode(), json.dumps(p).encode()) for _, k, p in rows]

    def run_batch(self, trades: list[tuple[str, int, int]]) -> int:
        """One micro-batch of ``(symbol, ts, size)`` trades; returns the number of alerts."""
        n = len(trades)
        values = encode_batch(
            "trades",
            {
                "symbol": [t[0] for t in trades],
                "ts": np.array([t[1] for t in trades], np.int64),
                "price": np.full(n, 100.0),
                "size": np.array([t[2] for t in trades], np.int64),
                "side": ["BID"] * n,
                "exchange": ["NASDAQ"] * n,
            },
        ).messages()
        table = pa.table(
            {
                "partition": pa.array([0] * n, pa.int32()),
                "offset": pa.array(np.arange(self.offset, self.offset + n, dtype=np.int64)),
                "value": pa.array(values, pa.binary()),
            }
        )
        self.offset += n
        self.batch += 1
        out = self.core.process(self.batch, {"trades": table}, self.changes())
        metrics = {
            "events_per_s": float(n),
            "batch_ms": 12.0,
            "lag_ms": 250.0,
            "alerts": len(out.alerts),
            "dead_letters": 0,
        }
        assert self.store.commit(out, watermark=self.core.watermark, metrics=metrics)
        return len(out.alerts)


def _sidebar(page: Any, label: str) -> None:
    page.locator('[data-testid="stSidebar"]').get_by_text(label, exact=True).click()


def _login(page: Any, url: str, username: str) -> None:
    page.goto(url, wait_until="networkidle")
    form = page.locator('[data-testid="stForm"]').first
    form.get_by_label("User name").fill(username)
    form.get_by_label("Password", exact=True).fill(PASSWORD)
    form.get_by_role("button", name="Log in").click()
    page.get_by_text(f"Signed in as {username}").wait_for(timeout=TIMEOUT_MS)


def _codes(page: Any) -> list[str]:
    return [c.inner_text() for c in page.locator('[data-testid="stCode"]').all()]


def test_subscribe_alert_disconnect_and_catch_up_in_a_browser(
    dash_db_url: str, dashboard_url: str, browser: Any
) -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    engine = MiniEngine(dash_db_url)
    username = "e2e" + uuid.uuid4().hex[:8]
    dialogs: list[str] = []

    # --- sign up and subscribe ------------------------------------------------------------
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(dashboard_url, wait_until="networkidle")
    page.screenshot(path=str(IMG / "login.png"))
    page.get_by_role("tab", name="Sign up").click()
    form = page.locator('[data-testid="stForm"]').nth(1)
    form.get_by_label("User name").fill(username)
    form.get_by_label("Password", exact=True).fill(PASSWORD)
    form.get_by_label("Password again").fill(PASSWORD)
    form.get_by_role("button", name="Sign up").click()
    page.get_by_text(f"Signed in as {username}").wait_for(timeout=TIMEOUT_MS)

    _sidebar(page, "Subscribe")
    name_box = page.get_by_role("textbox", name="Name", exact=True)
    name_box.fill(NAME)
    name_box.press("Enter")
    rule_box = page.get_by_role("textbox", name="Rule", exact=True)
    rule_box.fill(RULE.replace("SECONDS", "SECONDZ"))
    rule_box.press("Control+Enter")
    page.get_by_text("unexpected 'SECONDZ'").first.wait_for(timeout=TIMEOUT_MS)
    caret = page.locator('[data-testid="stCode"]', has_text="SECONDZ")
    caret.wait_for(timeout=TIMEOUT_MS)
    assert "^" in caret.inner_text(), caret.inner_text()  # the caret under the column
    rule_box.fill(RULE)
    rule_box.press("Control+Enter")
    page.get_by_text("The rule is valid.").wait_for(timeout=TIMEOUT_MS)
    page.get_by_text("Compiled plan (rules explain)").click()
    page.get_by_role("button", name="Subscribe").click()
    page.get_by_text("Subscribed:").wait_for(timeout=TIMEOUT_MS)
    assert page.get_by_text(f"Subscribed: {NAME}.", exact=False).count() == 1  # the name verbatim, not markup
    page.get_by_role("button", name="Pause").wait_for(timeout=TIMEOUT_MS)  # now editing the saved one
    page.get_by_text("Your subscriptions").scroll_into_view_if_needed()
    page.set_viewport_size({"width": 1400, "height": 1700})
    time.sleep(1.0)
    page.screenshot(path=str(IMG / "subscribe.png"))
    page.set_viewport_size({"width": 1400, "height": 1000})
    with engine.store.engine.connect() as c:
        (sub_id,) = c.execute(sa.select(Subscription.id).where(Subscription.owner == username)).one()

    # --- the feed produces trades that satisfy the rule; the alert appears live -------------
    t0 = (int(time.time() * 1000) - 60_000) // 1000 * 1000
    assert engine.run_batch([("AAPL", t0 + 100, 600), ("AAPL", t0 + 200, 600), ("ZZZ", t0 + 3000, 1)]) == 1
    _sidebar(page, "Alerts")
    page.get_by_text("Latest: ENTER AAPL").wait_for(timeout=TIMEOUT_MS)
    page.get_by_text("1 alert(s) shown").wait_for(timeout=TIMEOUT_MS)
    time.sleep(1.5)  # the chart draws
    page.screenshot(path=str(IMG / "alerts.png"), full_page=True)
    with engine.store.engine.connect() as c:
        first_seq = c.execute(
            sa.select(sa.func.max(Alert.seq)).where(Alert.subscription_id == sub_id)
        ).scalar_one()
        cursor = c.execute(
            sa.select(ClientCursor.last_alert_seq).where(ClientCursor.username == username)
        ).scalar_one()
    assert cursor == first_seq  # shown live, so not "new" on the next reconnect

    _sidebar(page, "Key detail")
    page.get_by_role("textbox", name="or type a key").fill("AAPL")
    page.get_by_role("textbox", name="or type a key").press("Enter")
    page.get_by_text("Key: AAPL").wait_for(timeout=TIMEOUT_MS)
    time.sleep(1.0)
    page.screenshot(path=str(IMG / "key_detail.png"), full_page=True)
    _sidebar(page, "Health")
    page.get_by_text("The engine is running").wait_for(timeout=TIMEOUT_MS)
    time.sleep(1.0)
    page.screenshot(path=str(IMG / "health.png"), full_page=True)

    # --- the tab is closed; more alerts fire ------------------------------------------------
    ctx.close()
    assert (
        engine.run_batch([("MSFT", t0 + 20_000, 700), ("MSFT", t0 + 20_100, 700), ("ZZZ", t0 + 25_000, 1)])
        == 2
    )
    with engine.store.engine.connect() as c:
        missed = c.execute(
            sa.select(Alert.kind, Alert.key)
            .where(Alert.subscription_id == sub_id, Alert.seq > cursor)
            .order_by(Alert.seq)
        ).all()
    assert [tuple(m) for m in missed] == [("EXIT", "AAPL"), ("ENTER", "MSFT")]

    # --- back again: "While you were away" lists exactly the missed alerts ------------------
    ctx2 = browser.new_context(viewport={"width": 1400, "height": 1000})
    page2 = ctx2.new_page()
    page2.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    _login(page2, dashboard_url, username)
    page2.get_by_text("2 alert(s) while you were away").wait_for(timeout=TIMEOUT_MS)
    assert page2.get_by_text(f"Subscription: {NAME}").count() == 1
    page2.locator('[data-testid="stCode"]', has_text="MSFT  (since").wait_for(timeout=TIMEOUT_MS)
    codes = _codes(page2)
    listing = [ln.split()[2:] for ln in codes[0].splitlines()]
    assert listing == [["ENTER", "MSFT"], ["EXIT", "AAPL"]]  # newest first, nothing else
    assert codes[1].splitlines()[0].startswith("MSFT  (since ")  # the current result set, at now
    assert len(codes[1].splitlines()) == 1
    page2.screenshot(path=str(IMG / "while_you_were_away.png"), full_page=True)
    with engine.store.engine.connect() as c:
        cursor2 = c.execute(
            sa.select(ClientCursor.last_alert_seq).where(ClientCursor.username == username)
        ).scalar_one()
    assert cursor2 > cursor
    ctx2.close()

    # --- and once more: nothing is shown as new twice ---------------------------------------
    ctx3 = browser.new_context(viewport={"width": 1400, "height": 1000})
    page3 = ctx3.new_page()
    _login(page3, dashboard_url, username)
    page3.get_by_text("alert(s) shown").wait_for(timeout=TIMEOUT_MS)
    assert page3.get_by_text("alert(s) while you were away").count() == 0
    ctx3.close()
    assert dialogs == []  # no script from user text ever ran
