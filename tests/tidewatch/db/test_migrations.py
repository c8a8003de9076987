"""Alembic migrations against a real PostgreSQL: upgrade, downgrade, upgrade; schema = models."""

from __future__ import annotations

import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool, text
from sqlalchemy.engine import make_url

from tidewatch.db import migrate
from tidewatch.db.models import Base

pytestmark = pytest.mark.integration

TABLES = {
    "users",
    "user_sessions",
    "login_attempts",
    "subscriptions",
    "subscription_versions",
    "outbox",
    "alerts",
    "current_results",
    "client_cursors",
    "engine_batches",
    "engine_metrics",
}


@pytest.fixture()
def scratch_url(pg_url):
    """A fresh database on the test server (dropped afterwards), so downgrading hurts no one."""
    name = f"tw_migr_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _diff(url: str) -> list:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_is_clean(scratch_url):
    assert migrate.current(scratch_url) is None
    migrate.upgrade(scratch_url)
    assert migrate.current(scratch_url) == migrate.head()
    assert _tables(scratch_url) == TABLES
    assert _diff(scratch_url) == [], "migrations and models disagree"

    migrate.downgrade(scratch_url, "base")
    assert migrate.current(scratch_url) is None
    assert _tables(scratch_url) == set()

    migrate.upgrade(scratch_url)
    assert _tables(scratch_url) == TABLES
    assert _diff(scratch_url) == []


def test_constraints_hold(scratch_url):
    migrate.upgrade(scratch_url)
    engine = create_engine(scratch_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO users (username) VALUES ('u')"))
            ins = (
                "INSERT INTO subscriptions (id, owner, name, rule_text, plan, state) "
                "VALUES (:id, 'u', 'n', 'r', '{}'::jsonb, :state)"
            )
            conn.execute(text(ins), {"id": uuid.uuid4(), "state": "deleted"})
            conn.execute(text(ins), {"id": uuid.uuid4(), "state": "active"})  # deleted ones free the name
        with pytest.raises(Exception, match="uq_subscriptions_owner_name_live"), engine.begin() as conn:
            conn.execute(text(ins), {"id": uuid.uuid4(), "state": "paused"})
        with pytest.raises(Exception, match="ck_subscriptions_state"), engine.begin() as conn:
            conn.execute(text(ins.replace("'n'", "'m'")), {"id": uuid.uuid4(), "state": "zombie"})
        with pytest.raises(Exception, match="ck_alerts_kind"), engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO alerts (alert_id, subscription_id, key, kind, as_of, batch_id) "
                    "VALUES ('a', :s, 'k', 'MAYBE', now(), 1)"
                ),
                {"s": uuid.uuid4()},
            )
    finally:
        engine.dispose()
