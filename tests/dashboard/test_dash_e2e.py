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

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from dashboard.catchup import format_values
from dashboard.cli import streamlit_command
from dashboard.timefmt import clock
from tests.dashboard.support import PASSWORD
from tests.services import create_database, free_port
from tidewatch.db.models import Alert, ClientCursor, CurrentResult, EngineMetric, Subscription
from tidewatch.settings import get_settings

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
AGG = "SUM(size) OVER LAST 10 SECONDS"  # the rule's aggregate, as the engine names it in values
MARKUP_RULE = "<img src=x onerror=alert('rule')> SELECT"
G = 1000  # pane width (ms)
TIMEOUT_MS = 30_000  # a page element to appear
ENGINE_START_S = 150  # Spark's JVM, the connectors and the first batch, on a busy 2-core box
PIPELINE_S = 90  # trades sent -> alert committed


def _wait(cond: Callable[[], Any], timeout: float, what: str, procs: list[Proc] | None = None) -> Any:
    """Poll ``cond`` until it returns something truthy; fail with the services' log tails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        for p in procs or []:
            if p.proc.poll() is not None:
                raise AssertionError(f"{p.name} exited with {p.proc.returncode}:\n{p.tail()}")
        time.sleep(0.3)
    tails = "\n".join(f"--- {p.name}:\n{p.tail()}" for p in procs or [])
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tails}")


class Proc:
    """A service process in its own process group, its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self._out = log.open("ab")
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, n: int = 3000) -> str:
        return self.text()[-n:]

    def stop(self) -> None:
        """SIGTERM to the process group (the engine stops its query and Spark), then SIGKILL to
        whatever of the group is left (a JVM child of a process that already exited, say)."""
        try:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    pass
        except ProcessLookupError:
            pass
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self.proc.poll() is None:
                self.proc.wait(10)
            self._out.close()


class Pipeline:
    """A fresh database, per-run topics, and the relay, engine and dashboard processes."""

    def __init__(self, pg_url: str, bootstrap: str, tmp: Path) -> None:
        from engine.sinks.publish import ensure_topics

        self.run = uuid.uuid4().hex[:8]
        self.bootstrap = bootstrap
        self.tmp = tmp
        self.db_url = create_database(pg_url, "dash_e2e_", migrate=True)
        self.db = sa.create_engine(self.db_url, poolclass=sa.pool.NullPool)
        self.topics = {
            role: f"{role}-e2e-{self.run}"
            for role in ("trades", "packets", "subscriptions", "alerts", "results", "dead-letter")
        }
        settings = get_settings().model_copy(
            update={
                "topic_trades": self.topics["trades"],
                "topic_packets": self.topics["packets"],
                "topic_subscriptions": self.topics["subscriptions"],
                "topic_alerts": self.topics["alerts"],
                "topic_results": self.topics["results"],
                "topic_dead_letter": self.topics["dead-letter"],
                "topic_partitions": 1,
            }
        )
        ensure_topics(bootstrap, settings)
        self.env = dict(
            os.environ,
            TIDEWATCH_DATABASE_URL=self.db_url,
            TIDEWATCH_KAFKA_BOOTSTRAP=bootstrap,
            TIDEWATCH_TOPIC_TRADES=self.topics["trades"],
            TIDEWATCH_TOPIC_PACKETS=self.topics["packets"],
            TIDEWATCH_TOPIC_SUBSCRIPTIONS=self.topics["subscriptions"],
            TIDEWATCH_TOPIC_ALERTS=self.topics["alerts"],
            TIDEWATCH_TOPIC_RESULTS=self.topics["results"],
            TIDEWATCH_TOPIC_DEAD_LETTER=self.topics["dead-letter"],
            TIDEWATCH_TOPIC_PARTITIONS="1",
            TIDEWATCH_PANE_MS=str(G),
            TIDEWATCH_ALLOWED_LATENESS_MS="0",
            TIDEWATCH_SPARK_MASTER="local[2]",
            TIDEWATCH_TRIGGER_SECONDS="0.5",
            TIDEWATCH_CHECKPOINT_DIR=str(tmp / "checkpoint"),
            TIDEWATCH_DASHBOARD_REFRESH_S="1",
            # a busy CI box may take a few seconds per micro-batch; the Health page must still
            # call an engine that keeps up "running"
            TIDEWATCH_ENGINE_BEHIND_LAG_MS="30000",
        )
        self.procs: list[Proc] = []
        self.url = ""

    def _tidewatch(self, name: str, *args: str) -> Proc:
        argv = [sys.executable, "-m", "tidewatch.cli", *args]
        p = Proc(name, argv, self.env, self.tmp / f"{name}.log")
        self.procs.append(p)
        return p

    def start(self) -> None:
        """The engine first (it takes longest to start), then the relay and the dashboard."""
        self.engine = self._tidewatch("engine", "engine", "run", "--engine-id", f"e2e-{self.run}")
        self.relay = self._tidewatch("relay", "subscriptions", "relay")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._start_dashboard()

    def _start_dashboard(self) -> None:
        self.dashboard = Proc(
            "dashboard", streamlit_command("127.0.0.1", self.port), self.env, self.tmp / "dashboard.log"
        )
        self.procs.append(self.dashboard)

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2) as r:
                    return r.read() == b"ok"
            except OSError:
                return False

        _wait(healthy, 90, "the dashboard to serve", self.procs)

    def restart_dashboard(self) -> None:
        """Stop the dashboard process and start a new one on the same address."""
        self.dashboard.stop()
        self.procs.remove(self.dashboard)
        self._start_dashboard()

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.db.dispose()

    def feed(self, trades: list[tuple[str, int, int]]) -> None:
        """Send ``(symbol, ts, size)`` trades with ``tidewatch feed trades --csv`` (the ingest producer)."""
        f = self.tmp / f"trades-{trades[0][1]}.csv"
        lines = ["symbol,ts,price,size,side,exchange"]
        lines += [f"{sym},{ts},100.0,{size},BID,NASDAQ" for sym, ts, size in trades]
        f.write_text("\n".join(lines) + "\n")
        argv = [sys.executable, "-m", "tidewatch.cli", "feed", "trades", "--csv", str(f), "--asap"]
        res = subprocess.run(
            [*argv, "--no-progress"], env=self.env, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stdout + res.stderr

    def alerts(self, sub_id: uuid.UUID) -> list[tuple[int, str, str, int, dict[str, Any], datetime]]:
        """(seq, kind, key, as_of ms, values, as_of) of a subscription's alerts, in seq order."""
        with self.db.connect() as c:
            rows = c.execute(
                sa.select(Alert.seq, Alert.kind, Alert.key, Alert.as_of, Alert.values)
                .where(Alert.subscription_id == sub_id)
                .order_by(Alert.seq)
            ).all()
        return [(r[0], r[1], r[2], round(r[3].timestamp() * 1000), r[4], r[3]) for r in rows]

    def scalar(self, q: Any) -> Any:
        with self.db.connect() as c:
            return c.execute(q).scalar()


@pytest.fixture
def pipeline(pg_url: str, kafka_bootstrap: str, tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(pg_url, kafka_bootstrap, tmp_path)
    try:
        p.start()
        yield p
    finally:
        p.stop()


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


def _watch_dialogs(page: Any, dialogs: list[str]) -> None:
    """Record (and dismiss) every alert / confirm / prompt the page opens: a script from user text."""

    def on_dialog(d: Any) -> None:
        dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", on_dialog)


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


def _table_rows(page: Any, has_text: str) -> list[list[str]]:
    """The cells of the (first) dataframe holding ``has_text``, a list per row (Streamlit's grid
    draws on a canvas; its accessible table holds the cells' text)."""
    table = page.locator('[data-testid="stDataFrame"]', has_text=has_text).first.locator("table")
    rows = [[td.inner_text() for td in tr.locator("td").all()] for tr in table.locator("tr").all()]
    return [r for r in rows if r]


def _wait_rows(
    page: Any,
    has_text: str,
    ok: Callable[[list[list[str]]], bool],
    what: str,
    procs: list[Proc] | None = None,
) -> None:
    """Poll :func:`_table_rows` until ``ok`` holds for them (Streamlit draws a table some time
    after the text around it); fail with the rows last read."""
    last: list[list[list[str]]] = [[]]

    def check() -> bool:
        last[0] = _table_rows(page, has_text)
        return ok(last[0])

    try:
        _wait(check, TIMEOUT_MS / 1000, what, procs)
    except AssertionError as err:
        raise AssertionError(f"{err}; the table's rows last read: {last[0]}") from None


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
    _watch_dialogs(page, dialogs)
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

    _wait(sign_up_tab_open, 30, "the Sign up tab")
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
    _wait(
        lambda: any(active in ln and "is active" in ln for ln in pipeline.engine.text().splitlines()),
        ENGINE_START_S,
        "the engine to apply the subscription (outbox -> relay -> Kafka -> engine)",
        procs,
    )
    t_engine = time.monotonic() - t_start

    # --- the feed sends trades that satisfy the rule; the alert appears live -------------------
    _sidebar(page, "Alerts")  # open before anything fired: the alert must arrive by the auto-refresh
    page.get_by_text("No alerts match yet.").wait_for(timeout=TIMEOUT_MS)
    b1 = int(time.time() * 1000) // G * G - 3 * G
    pipeline.feed([("AAPL", b1 + 100, 600), ("AAPL", b1 + 200, 600), ("ZZZ", b1 + 2 * G, 1)])
    # SUM(size) over (tau - 10 s, tau] exceeds 1000 from the lookup at b1 + 1 s on
    latest = page.get_by_text("Latest: ENTER AAPL")
    _wait(lambda: latest.count() > 0, PIPELINE_S, "the alert on the live Alerts page", procs)
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
    _wait(lambda: pipeline.scalar(cursor_q) == first_seq, 15, "the live page to move the cursor")

    _sidebar(page, "Key detail")
    page.get_by_role("textbox", name="or type a key").fill("AAPL")
    page.get_by_role("textbox", name="or type a key").press("Enter")
    page.get_by_text("Key: AAPL").wait_for(timeout=TIMEOUT_MS)
    # the aggregate over its window, computed by the engine from its state, threshold drawn in
    charts = page.locator('[data-testid="stVegaLiteChart"]')
    _wait(lambda: charts.count() >= 2, TIMEOUT_MS / 1000, "the aggregate chart of AAPL")
    assert page.get_by_text("No trades events of this key").count() == 0
    time.sleep(1.5)
    page.screenshot(path=str(IMG / "key_detail.png"), full_page=True)
    _sidebar(page, "Health")
    page.get_by_text("The engine is running").wait_for(timeout=TIMEOUT_MS)
    assert pipeline.scalar(sa.select(sa.func.count()).select_from(EngineMetric)) >= 1
    time.sleep(1.0)
    page.screenshot(path=str(IMG / "health.png"), full_page=True)
    # the subscription being edited, its compiled plan, and its current result set (AAPL now)
    _sidebar(page, "Subscribe")
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

    _wait(at_login_form, 120, "the reconnected tab to show the login form", procs)
    assert page.get_by_text(f"Signed in as {username}").count() == 0
    assert pipeline.scalar(cursor_q) == first_seq

    # --- the tab is closed; more alerts fire ----------------------------------------------------
    ctx.close()
    b2 = max(b1 + 12 * G, int(time.time() * 1000) // G * G - 3 * G)
    pipeline.feed([("MSFT", b2 + 100, 700), ("MSFT", b2 + 200, 700), ("ZZZ", b2 + 2 * G, 1)])
    # AAPL's trades leave the 10 s window at the lookup b1 + 11 s; MSFT enters at b2 + 1 s
    expect = [("ENTER", "AAPL", b1 + G), ("EXIT", "AAPL", b1 + 11 * G), ("ENTER", "MSFT", b2 + G)]
    _wait(lambda: len(pipeline.alerts(sub_id)) >= 3, PIPELINE_S, "the alerts of the second feed", procs)
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
    _watch_dialogs(page2, dialogs)
    _login(page2, url, username)
    page2.get_by_text("2 alert(s) while you were away").wait_for(timeout=TIMEOUT_MS)
    # a summary first (per subscription entered / left, the busiest keys), the raw log one click away
    page2.locator('[data-testid="stDataFrame"]', has_text="MSFT").first.wait_for(timeout=TIMEOUT_MS)
    _wait_rows(page2, "entered", lambda rows: any(r[0] == NAME for r in rows), "the summary")
    (summary,) = [r for r in _table_rows(page2, "entered") if r[0] == NAME] or [[]]
    assert summary[:4] == [NAME, "active", "1", "1"], summary  # name, state, entered, left
    page2.get_by_text("Raw alert log").click()
    page2.get_by_text(f"Subscription: {NAME}").wait_for(timeout=TIMEOUT_MS)
    assert page2.get_by_text(f"Subscription: {NAME}").count() == 1
    codes = _codes(page2)
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
    _wait_rows(page2, f"{AGG} = 1400", lambda rows: row in rows, "the current-results table")
    page2.screenshot(path=str(IMG / "while_you_were_away.png"), full_page=True)
    _wait(lambda: pipeline.scalar(cursor_q) == log[-1][0], 15, "the cursor to move past what was shown")
    ctx2.close()

    # --- and once more: nothing is shown as new twice ---------------------------------------------
    ctx3 = browser.new_context(viewport={"width": 1400, "height": 1000})
    page3 = ctx3.new_page()
    _watch_dialogs(page3, dialogs)
    _login(page3, url, username)
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
