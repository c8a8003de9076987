"""Alembic migrations against a real PostgreSQL: upgrade, downgrade, upgrade; schema = models."""

from __future__ import annotations

import uuid

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool, text

from tests.services import create_database, drop_database
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
    "engine_dead_letters",
    "chart_requests",
    "engine_outputs",
}


@pytest.fixture()
def scratch_url(pg_url):
    """A fresh database on the test server (dropped afterwards), so downgrading hurts no one."""
    url = create_database(pg_url, "tw_migr_")
    try:
        yield url
    finally:
        drop_database(pg_url, url)


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


def _fill_0003(url: str) -> None:
    """Engine output as a database at 0003 holds it: two batches, their alerts and metrics."""
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO engine_batches (batch_id, events, alerts) VALUES (0, 5, 1), (1, 7, 0)")
            )
            conn.execute(
                text(
                    "INSERT INTO alerts (alert_id, subscription_id, key, kind, as_of, batch_id) "
                    "VALUES ('a0', :s, 'K', 'ENTER', now(), 0)"
                ),
                {"s": uuid.uuid4()},
            )
            conn.execute(text("INSERT INTO engine_metrics (batch_id, alerts) VALUES (0, 1), (1, 0)"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("old_id", [None, "deployment-7"])
def test_0004_keys_batches_by_engine_and_keeps_the_rows_there(scratch_url, old_id):
    """Upgrading a database with engine output from 0003: existing rows get the engine id given
    (``-x engine_id=`` / the config attribute), else ``default``; the old engine's store finds its
    batches, another engine commits the same batch ids; the downgrade refuses two engines' rows."""
    from engine.messages import Alert, BatchOutput
    from engine.sinks.store import Store

    migrate.upgrade(scratch_url, "0003")
    _fill_0003(scratch_url)
    cfg = migrate.alembic_config(scratch_url)
    if old_id is not None:
        cfg.attributes["engine_id"] = old_id
    command.upgrade(cfg, "0004")
    command.upgrade(cfg, "head")  # the later migrations add tables of their own (0005: chart_requests)
    old = old_id or "default"
    assert _diff(scratch_url) == [] and _tables(scratch_url) == TABLES
    engine = create_engine(scratch_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            for t in ("engine_batches", "alerts", "engine_metrics"):
                got = conn.execute(text(f"SELECT engine_id, count(*) FROM {t} GROUP BY 1")).all()
                assert got == [(old, 2 if t != "alerts" else 1)], t
        # the dead letters' raw bytes: the engine's role only (where the roles exist: per cluster)
        with engine.connect() as conn:
            roles = set(conn.execute(text("SELECT rolname FROM pg_roles")).scalars())
            priv = "SELECT has_table_privilege(:r, 'engine_dead_letters', :p)"
            if "tidewatch_engine" in roles:
                for p in ("SELECT", "INSERT", "DELETE"):
                    assert conn.execute(text(priv), {"r": "tidewatch_engine", "p": p}).scalar(), p
            for r in {"tidewatch_dashboard", "tidewatch_relay"} & roles:
                assert not conn.execute(text(priv), {"r": r, "p": "SELECT"}).scalar(), r
        pk = inspect(engine).get_pk_constraint("engine_batches")
        assert pk["name"] == "pk_engine_batches" and pk["constrained_columns"] == ["engine_id", "batch_id"]
        mine, other = Store(engine, old), Store(engine, "shard-2")
        assert mine.last_committed() == 1 and [a["key"] for a in mine.alerts_of_batch(0)] == ["K"]
        assert other.last_committed() == -1
        metrics = {"alerts": 1}
        for store in (mine, other):
            out = BatchOutput(
                batch_id=1, alerts=[Alert(str(uuid.uuid4()), "r", "trades", "X", "ENTER", 0, {})]
            )
            assert store.commit(out, watermark=None, metrics=metrics) is (store is other)
            assert store.project_pending() == (store is other)  # its alert into alerts (0011)
        with engine.begin() as conn:  # a row written without an engine id: the default engine's
            conn.execute(text("INSERT INTO engine_batches (batch_id) VALUES (9)"))
            assert conn.execute(text("SELECT engine_id FROM engine_batches WHERE batch_id = 9")).scalar() == (
                "default"
            )
            conn.execute(text("DELETE FROM engine_batches WHERE batch_id = 9"))
        with pytest.raises(RuntimeError, match="batches of 2 engines"):
            migrate.downgrade(scratch_url, "0003")
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM engine_batches WHERE engine_id = 'shard-2'"))
        migrate.downgrade(scratch_url, "0003")
        assert migrate.current(scratch_url) == "0003"
        assert "engine_dead_letters" not in _tables(scratch_url)
        assert inspect(engine).get_pk_constraint("engine_batches")["constrained_columns"] == ["batch_id"]
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM engine_batches")).scalar() == 2
    finally:
        engine.dispose()


def test_0004_refuses_an_engine_id_it_cannot_quote(scratch_url):
    migrate.upgrade(scratch_url, "0003")
    cfg = migrate.alembic_config(scratch_url)
    cfg.attributes["engine_id"] = "x'; DROP TABLE alerts; --"
    with pytest.raises(ValueError, match="letters, digits"):
        command.upgrade(cfg, "head")
    assert migrate.current(scratch_url) == "0003"


def test_0010_keys_alerts_by_subscription_time_key_kind(scratch_url):
    """0010: the alert log's primary key is (subscription_id, as_of, key, kind), the subscription
    index is gone (the key's prefix serves its queries), the rows are kept; the same alert under
    another ``alert_id`` text is refused; the downgrade brings back the key on ``alert_id``."""
    migrate.upgrade(scratch_url, "0009")
    engine = create_engine(scratch_url, poolclass=pool.NullPool)
    sql = (
        "INSERT INTO alerts (alert_id, subscription_id, key, kind, as_of, batch_id) "
        "VALUES (:id, :s, 'K', 'ENTER', '2026-11-28T12:00:00Z', 0)"
    )
    ins = text(sql)
    s1, s2 = uuid.uuid4(), uuid.uuid4()
    try:
        with engine.begin() as conn:
            for s in (s1, s2):
                conn.execute(ins, {"id": f"{s}|K|ENTER|1", "s": s})
        migrate.upgrade(scratch_url)
        insp = inspect(engine)
        pk = insp.get_pk_constraint("alerts")
        assert pk["name"] == "pk_alerts"
        assert pk["constrained_columns"] == ["subscription_id", "as_of", "key", "kind"]
        assert "ix_alerts_subscription_as_of" not in {ix["name"] for ix in insp.get_indexes("alerts")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM alerts")).scalar() == 2
        with pytest.raises(Exception, match="pk_alerts"), engine.begin() as conn:
            conn.execute(ins, {"id": "another text", "s": s1})
        with engine.begin() as conn:  # another kind at the same time is another alert
            conn.execute(text(sql.replace("'ENTER'", "'EXIT'")), {"id": f"{s1}|K|EXIT|1", "s": s1})
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM alerts WHERE kind = 'EXIT'"))
        migrate.downgrade(scratch_url, "0009")
        insp = inspect(engine)
        assert insp.get_pk_constraint("alerts")["constrained_columns"] == ["alert_id"]
        assert "ix_alerts_subscription_as_of" in {ix["name"] for ix in insp.get_indexes("alerts")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM alerts")).scalar() == 2
    finally:
        engine.dispose()


def test_0011_engine_outputs_stored_as_given_and_a_downgrade_refuses_unexpanded_rows(scratch_url):
    """0011: ``engine_outputs`` (a committed batch's alerts as one row) keeps its bodies as given
    (``STORAGE EXTERNAL``: compressed by the engine, not again by the server); a downgrade refuses
    while a row is left (its alerts are in no other table yet) and goes through once it is gone."""
    migrate.upgrade(scratch_url)
    engine = create_engine(scratch_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            storage = conn.execute(
                text(
                    "SELECT attname, attstorage FROM pg_attribute WHERE attrelid = 'engine_outputs'::regclass "
                    "AND atttypid = 'bytea'::regtype ORDER BY attnum"
                )
            ).all()
            conn.execute(
                text("INSERT INTO engine_outputs (engine_id, batch_id, alert_rows) VALUES ('e', 7, :b)"),
                {"b": b"\x00" * 10},
            )
        assert [tuple(r) for r in storage] == [
            (c, "e") for c in ("alert_rows", "alert_items", "withheld_rows", "withheld_items")
        ]
        with pytest.raises(RuntimeError, match="1 committed batches"):
            migrate.downgrade(scratch_url, "0010")
        assert migrate.current(scratch_url) == migrate.head()
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM engine_outputs"))
        migrate.downgrade(scratch_url, "0010")
        assert "engine_outputs" not in _tables(scratch_url)
    finally:
        engine.dispose()
