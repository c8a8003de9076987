"""Fixtures of the dashboard tests: a migrated database of their own inside the session's
PostgreSQL container (``pg_url``), users with unique names, alerts written as the engine does;
for the end-to-end tests, their services as processes and chromium (``tests/dashboard/e2e.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from dashboard import auth
from subscriptions.service import SubscriptionService
from tests.dashboard.e2e import ARGS, CHROMIUM, Pipeline
from tests.dashboard.support import PASSWORD, unique
from tidewatch.db import migrate
from tidewatch.db.session import session_factory
from tidewatch.settings import get_settings

DB_NAME = "tidewatch_dashboard_test"


@pytest.fixture(scope="session")
def dash_db_url(pg_url: str) -> str:
    """A database of the dashboard tests alone (other suites share ``pg_url``), migrated to head."""
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{DB_NAME}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{DB_NAME}"'))
    admin.dispose()
    url = sa.engine.make_url(pg_url).set(database=DB_NAME).render_as_string(hide_password=False)
    migrate.upgrade(url)
    return url


@pytest.fixture
def sm(dash_db_url: str) -> sessionmaker[Session]:
    return session_factory(dash_db_url)


@pytest.fixture
def app_env(dash_db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point the settings (read by the Streamlit app under AppTest) at the test database."""
    monkeypatch.setenv("TIDEWATCH_DATABASE_URL", dash_db_url)
    monkeypatch.setenv("TIDEWATCH_DASHBOARD_REFRESH_S", "3600")
    get_settings.cache_clear()
    yield dash_db_url
    get_settings.cache_clear()


@pytest.fixture
def new_user(sm: sessionmaker[Session]) -> Any:
    """``new_user()`` signs a fresh user up and returns its name (password: ``PASSWORD``)."""

    def make(prefix: str = "u") -> str:
        name = unique(prefix)
        auth.sign_up(sm, name, PASSWORD)
        return name

    return make


@pytest.fixture
def svc(sm: sessionmaker[Session]) -> SubscriptionService:
    return SubscriptionService(sm, settings=get_settings())


@pytest.fixture
def pipeline(pg_url: str, kafka_bootstrap: str, tmp_path: Path) -> Iterator[Pipeline]:
    """The end-to-end tests' relay, engine and dashboard processes on a fresh database and topics."""
    p = Pipeline(pg_url, kafka_bootstrap, tmp_path)
    try:
        p.start()
        yield p
    finally:
        p.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    """Debian's chromium, headless, driven by Playwright (no downloaded browser)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()
