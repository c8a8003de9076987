"""The end-to-end dashboard tests' harness: their services as processes, and a page in chromium.

:class:`Pipeline` starts a fresh migrated database, per-run topics, and the relay, engine and
dashboard processes (each in its own process group, its output in a log file, stopped by the
group afterwards); the fixtures ``pipeline`` and ``browser`` in ``conftest.py`` hand it and
Debian's chromium (driven by Playwright) to ``test_dash_e2e.py`` and ``test_dash_first_hour.py``.
The page helpers read what Streamlit draws and poll it, failing with what they last read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dashboard.cli import streamlit_command
from tests.dashboard.support import PASSWORD
from tests.services import create_database, free_port
from tidewatch.db.models import Alert
from tidewatch.settings import get_settings

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
G = 1000  # pane width (ms)
TIMEOUT_MS = 30_000  # a page element to appear
ENGINE_START_S = 150  # Spark's JVM, the connectors and the first batch, on a busy 2-core box
PIPELINE_S = 90  # trades sent -> alert committed


def wait(cond: Callable[[], Any], timeout: float, what: str, procs: list[Proc] | None = None) -> Any:
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

        wait(healthy, 90, "the dashboard to serve", self.procs)

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


def watch_dialogs(page: Any, dialogs: list[str]) -> None:
    """Record (and dismiss) every alert / confirm / prompt the page opens: a script from user text."""

    def on_dialog(d: Any) -> None:
        dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", on_dialog)


def sidebar(page: Any, label: str) -> None:
    page.locator('[data-testid="stSidebar"]').get_by_text(label, exact=True).click()


def login(page: Any, url: str, username: str) -> None:
    page.goto(url, wait_until="networkidle")
    form = page.locator('[data-testid="stForm"]').first
    form.get_by_label("User name").fill(username)
    form.get_by_label("Password", exact=True).fill(PASSWORD)
    form.get_by_role("button", name="Log in").click()
    page.get_by_text(f"Signed in as {username}").wait_for(timeout=TIMEOUT_MS)


def code_blocks(page: Any) -> list[str]:
    return [c.inner_text() for c in page.locator('[data-testid="stCode"]').all()]


def table_rows(page: Any, has_text: str) -> list[list[str]]:
    """The cells of the (first) dataframe holding ``has_text``, a list per row (Streamlit's grid
    draws on a canvas; its accessible table holds the cells' text)."""
    table = page.locator('[data-testid="stDataFrame"]', has_text=has_text).first.locator("table")
    rows = [[td.inner_text() for td in tr.locator("td").all()] for tr in table.locator("tr").all()]
    return [r for r in rows if r]


def wait_rows(
    page: Any,
    has_text: str,
    ok: Callable[[list[list[str]]], bool],
    what: str,
    procs: list[Proc] | None = None,
) -> list[list[str]]:
    """Poll :func:`table_rows` until ``ok`` holds for them (Streamlit draws a table some time
    after the text around it) and return those rows; fail with the rows last read."""
    last: list[list[list[str]]] = [[]]

    def check() -> bool:
        last[0] = table_rows(page, has_text)
        return ok(last[0])

    try:
        wait(check, TIMEOUT_MS / 1000, what, procs)
    except AssertionError as err:
        raise AssertionError(f"{err}; the table's rows last read: {last[0]}") from None
    return last[0]
