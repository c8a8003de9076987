"""PostgreSQL least privilege (migration 0002_roles) against a real PostgreSQL.

Each process connects as its own role (tidewatch_engine, tidewatch_dashboard, tidewatch_relay).
Every forbidden action below is tried as that role and must be refused by the server with
``insufficient_privilege`` (SQLSTATE 42501); the allowed work of each process is done through
the real code (the engine's Store, the dashboard's sign-up / login / subscription service) under
its role, so the grants are shown to be enough as well as no more than needed.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import sessionmaker

from tests.services import create_database, drop_database, free_port
from tidewatch.db import migrate
from tidewatch.settings import get_settings

pytestmark = pytest.mark.integration

ROLES = {
    "engine": ("tidewatch_engine", "TIDEWATCH_PG_ENGINE_PASSWORD"),
    "dashboard": ("tidewatch_dashboard", "TIDEWATCH_PG_DASHBOARD_PASSWORD"),
    "relay": ("tidewatch_relay", "TIDEWATCH_PG_RELAY_PASSWORD"),
}


@dataclass(frozen=True)
class RoleDb:
    owner_url: str  # the migrating application role (database owner)
    admin_url: str  # the test server's superuser, on the same database
    urls: dict[str, str]  # process -> its role's URL
    passwords: dict[str, str]


@pytest.fixture(scope="module")
def role_db(pg_url: str) -> Iterator[RoleDb]:
    """A fresh database migrated to head with a password for each role (from the environment)."""
    owner_url = create_database(pg_url, "tw_roles_")
    base = make_url(owner_url)
    passwords = {p: f"{p}-{secrets.token_urlsafe(12)}" for p in ROLES}
    with pytest.MonkeyPatch.context() as mp:
        for proc, (_, env) in ROLES.items():
            mp.setenv(env, passwords[proc])
        get_settings.cache_clear()
        try:
            migrate.upgrade(owner_url)
        finally:
            get_settings.cache_clear()
    urls = {
        proc: base.set(username=role, password=passwords[proc]).render_as_string(hide_password=False)
        for proc, (role, _) in ROLES.items()
    }
    try:
        yield RoleDb(owner_url, owner_url, urls, passwords)
    finally:
        migrate.downgrade(owner_url, "base")
        drop_database(pg_url, owner_url)


def _run(url: str, sql: str, params: dict[str, object] | None = None) -> None:
    eng = create_engine(url, poolclass=pool.NullPool)
    try:
        with eng.begin() as conn:
            conn.execute(text(sql), params or {})
    finally:
        eng.dispose()


SUB = "00000000-0000-0000-0000-000000000001"
INSERT_ALERT = (
    "INSERT INTO alerts (alert_id, subscription_id, key, kind, as_of, batch_id) "
    f"VALUES ('x', '{SUB}', 'k', 'ENTER', now(), 1)"
)
INSERT_RESULT = f"INSERT INTO current_results (subscription_id, key, since) VALUES ('{SUB}', 'k', now())"

#: (process, what it tries) -- every one must be refused with insufficient_privilege
FORBIDDEN: list[tuple[str, str]] = [
    # the engine cannot touch accounts, passwords or sessions, nor subscriptions and the outbox
    ("engine", "SELECT password_hash FROM users"),
    ("engine", "SELECT count(*) FROM users"),
    ("engine", "SELECT token_hash FROM user_sessions"),
    ("engine", "SELECT count(*) FROM login_attempts"),
    ("engine", "INSERT INTO users (username, password_hash) VALUES ('mallory', 'x')"),
    ("engine", "UPDATE users SET password_hash = NULL"),
    ("engine", "DELETE FROM user_sessions"),
    ("engine", "DELETE FROM login_attempts"),
    ("engine", "SELECT rule_text FROM subscriptions"),
    ("engine", "UPDATE subscriptions SET state = 'deleted'"),
    ("engine", "INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}'::jsonb)"),
    ("engine", "SELECT count(*) FROM client_cursors"),
    ("engine", "SELECT version_num FROM alembic_version"),
    ("engine", "TRUNCATE alerts"),
    ("engine", "DROP TABLE alerts"),
    ("engine", "ALTER TABLE alerts ADD COLUMN evil int"),
    ("engine", "CREATE TABLE evil (x int)"),
    ("engine", "ALTER TABLE alerts OWNER TO tidewatch_engine"),
    # the dashboard reads the engine's output but cannot write, change or delete it
    ("dashboard", INSERT_ALERT),
    ("dashboard", "UPDATE alerts SET kind = 'EXIT'"),
    ("dashboard", "DELETE FROM alerts"),
    ("dashboard", "TRUNCATE alerts"),
    ("dashboard", INSERT_RESULT),
    ("dashboard", "UPDATE current_results SET key = 'other'"),
    ("dashboard", "DELETE FROM current_results"),
    ("dashboard", "INSERT INTO engine_batches (batch_id, events, alerts) VALUES (99, 0, 0)"),
    ("dashboard", "DELETE FROM engine_batches"),
    ("dashboard", "DELETE FROM engine_metrics"),
    ("dashboard", "DROP TABLE users"),
    ("dashboard", "CREATE TABLE evil (x int)"),
    ("dashboard", "UPDATE alembic_version SET version_num = '0001'"),
    # the relay: outbox and a read of subscriptions, nothing else
    ("relay", "SELECT password_hash FROM users"),
    ("relay", "SELECT count(*) FROM login_attempts"),
    ("relay", "SELECT count(*) FROM alerts"),
    (
        "relay",
        "INSERT INTO subscriptions (id, owner, name, rule_text, plan, state) "
        f"VALUES ('{SUB}', 'u', 'n', 'r', '{{}}'::jsonb, 'active')",
    ),
    ("relay", "UPDATE subscriptions SET state = 'deleted'"),
    ("relay", "INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}'::jsonb)"),
    ("relay", "DELETE FROM outbox"),
    ("relay", INSERT_ALERT),
    ("relay", "CREATE TABLE evil (x int)"),
]
# no role may become another one
FORBIDDEN += [
    (p, f"SET ROLE {r}")
    for p in ROLES
    for r in ("tidewatch", "tidewatch_engine", "tidewatch_dashboard")
    if not r.endswith(p)
]


@pytest.mark.parametrize(("proc", "sql"), FORBIDDEN, ids=[f"{p}: {s[:48]}" for p, s in FORBIDDEN])
def test_each_forbidden_action_is_refused(role_db: RoleDb, proc: str, sql: str) -> None:
    with pytest.raises(DBAPIError) as info:
        _run(role_db.urls[proc], sql)
    assert getattr(info.value.orig, "pgcode", None) == "42501", info.value  # insufficient_privilege


def test_roles_cannot_create_roles_or_databases(role_db: RoleDb) -> None:
    for proc in ROLES:
        for sql in (
            "CREATE ROLE evil LOGIN SUPERUSER",
            "CREATE DATABASE evil",
            "ALTER ROLE tidewatch_engine SUPERUSER",
        ):
            with pytest.raises(DBAPIError) as info:
                eng = create_engine(role_db.urls[proc], isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
                try:
                    with eng.connect() as conn:
                        conn.execute(text(sql))
                finally:
                    eng.dispose()
            assert info.value.orig.pgcode == "42501"  # type: ignore[union-attr]


def test_a_wrong_password_is_refused_and_the_clear_text_is_not_stored(role_db: RoleDb) -> None:
    bad = make_url(role_db.urls["engine"]).set(password="not-the-password")
    eng = create_engine(bad, poolclass=pool.NullPool)
    with pytest.raises(OperationalError, match="password authentication failed"):
        with eng.connect():
            pass
    eng.dispose()
    admin = create_engine(role_db.admin_url, poolclass=pool.NullPool)
    try:
        with admin.connect() as conn:
            rows: dict[str, str] = dict(
                conn.execute(
                    text("SELECT rolname, rolpassword FROM pg_authid WHERE rolname LIKE 'tidewatch\\_%'")
                ).all()
            )
            flags = conn.execute(
                text(
                    "SELECT bool_or(rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls) "
                    "FROM pg_roles WHERE rolname LIKE 'tidewatch\\_%'"
                )
            ).scalar()
    finally:
        admin.dispose()
    assert set(rows) == {r for r, _ in ROLES.values()}
    for proc, (role, _) in ROLES.items():
        assert rows[role].startswith("SCRAM-SHA-256$"), rows[role]
        assert role_db.passwords[proc] not in rows[role]
    assert flags is False


# ---------------------------------------------------------------- what each role must be able to do
def test_engine_role_commits_a_batch_through_the_real_store(role_db: RoleDb) -> None:
    from engine.messages import Alert, BatchOutput
    from engine.sinks.store import Store
    from tidewatch.db.session import make_db_engine

    eng = make_db_engine(role_db.urls["engine"], poolclass=pool.NullPool)
    try:
        store = Store(eng)
        before = store.last_committed()
        out = BatchOutput(
            batch_id=before + 1,
            alerts=[Alert(SUB, "r", "trades", "AAPL", "ENTER", 1_700_000_000_000, {"COUNT(*)": 3})],
            lookups=[1_700_000_000_000],
            changed={SUB},
            events={"trades": 10},
        )
        metrics = {"events_per_s": 1.0, "batch_ms": 2.0, "lag_ms": 3.0, "alerts": 1, "dead_letters": 0}
        assert store.commit(out, watermark=1_700_000_000_000, metrics=metrics) is True
        assert store.commit(out, watermark=1_700_000_000_000, metrics=metrics) is False  # idempotent
        assert store.last_committed() == before + 1
        # the expansion into alerts and current_results, with the engine role's grants (0011)
        assert store.unexpanded() == [before + 1] and store.project(before + 1)
        assert [a["key"] for a in store.alerts_of_batch(before + 1)] == ["AAPL"]
    finally:
        eng.dispose()


def test_dashboard_role_runs_accounts_subscriptions_and_reads_alerts(role_db: RoleDb) -> None:
    from dashboard.auth import AuthError, RateLimited, login, logout, resolve, sign_up
    from subscriptions.service import SubscriptionService

    eng = create_engine(role_db.urls["dashboard"], poolclass=pool.NullPool)
    sm = sessionmaker(eng)
    try:
        user = f"alice{uuid.uuid4().hex[:6]}"
        sign_up(sm, user, "correct horse battery")
        who = login(sm, user, "correct horse battery", client="test", settings=get_settings())
        assert resolve(sm, who.token) is not None
        svc = SubscriptionService(sm, settings=get_settings())
        view = svc.create(
            user, "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5"
        )
        svc.pause(user, view.id)
        assert [v.state for v in svc.list(user)] == ["paused"]
        with eng.connect() as conn:  # reads of the engine's tables
            for t in ("alerts", "current_results", "engine_batches", "engine_metrics"):
                conn.execute(text(f"SELECT count(*) FROM {t}")).scalar()
        logout(sm, who.token)
        assert resolve(sm, who.token) is None

        # login rate limit (dashboard/auth.py) works under this role: N failures, then refusal
        limit = get_settings().login_max_failures
        for _ in range(limit):
            with pytest.raises(AuthError) as info:
                login(sm, user, "wrong password!", client="attacker", settings=get_settings())
            assert not isinstance(info.value, RateLimited)
        with pytest.raises(RateLimited):
            login(
                sm, user, "correct horse battery", client="attacker", settings=get_settings()
            )  # even the right password
        assert (
            login(sm, user, "correct horse battery", client="elsewhere", settings=get_settings()).user_id
            == who.user_id
        )
    finally:
        eng.dispose()


def test_relay_role_reads_and_marks_the_outbox(role_db: RoleDb) -> None:
    from subscriptions.outbox import pending_count

    _run(
        role_db.owner_url,
        "INSERT INTO outbox (topic, key, payload) VALUES ('subscriptions', 'k', '{}'::jsonb)",
    )
    n = pending_count(role_db.urls["relay"])
    _run(role_db.urls["relay"], "SELECT count(*) FROM subscriptions")
    _run(
        role_db.urls["relay"],
        "UPDATE outbox SET published_at = now(), kafka_partition = 0, kafka_offset = id "
        "WHERE published_at IS NULL",
    )
    assert n >= 1 and pending_count(role_db.urls["relay"]) == 0


def test_downgrade_revokes_and_upgrade_restores(role_db: RoleDb) -> None:
    """Going back below 0002 removes every grant (the roles stay: the cluster may use them)."""
    migrate.downgrade(role_db.owner_url, "0001")
    try:
        with pytest.raises(DBAPIError):
            _run(role_db.urls["engine"], "SELECT count(*) FROM alerts")
    finally:
        env = {e: role_db.passwords[p] for p, (_, e) in ROLES.items()}
        old = {e: os.environ.get(e) for e in env}
        os.environ.update(env)
        get_settings.cache_clear()
        try:
            migrate.upgrade(role_db.owner_url)
        finally:
            for e, v in old.items():
                if v is None:
                    os.environ.pop(e, None)
                else:
                    os.environ[e] = v
            get_settings.cache_clear()
    _run(role_db.urls["engine"], "SELECT count(*) FROM alerts")


# ---------------------------------------------------------------- the embedded stack wires it
def test_embedded_stack_creates_the_roles_and_gives_each_process_its_url() -> None:
    """``tidewatch up``'s PostgreSQL: the superuser creates the roles (the application role has no
    CREATEROLE), 0002 grants, and the engine / dashboard / relay processes get their role's URL."""
    import shutil
    import tempfile
    from pathlib import Path

    from tidewatch.settings import Settings
    from tidewatch.stack import embedded as stack
    from tidewatch.stack import postgres_server as postgres

    port = free_port()
    root = Path(tempfile.mkdtemp(prefix="tidewatch-roles-test-"))
    root.chmod(0o755)
    pw = {p: f"{p}-{secrets.token_urlsafe(9)}" for p in ROLES}
    s = Settings(
        run_dir=root / "run",
        pg_port=port,
        pg_engine_password=pw["engine"],
        pg_dashboard_password=pw["dashboard"],
        pg_relay_password=None,  # not configured: the relay keeps the application role
    )
    if postgres.find_bin_dir(s) is None:
        pytest.fail("PostgreSQL binaries missing: run scripts/setup.sh")
    try:
        postgres.start(s)
        migrate.upgrade(s.sqlalchemy_url)
        owner = create_engine(s.sqlalchemy_url, poolclass=pool.NullPool)
        with owner.connect() as conn:
            creator = conn.execute(
                text("SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user")
            )
            assert creator.scalar() is False
            login: dict[str, bool] = dict(
                conn.execute(
                    text("SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'tidewatch\\_%'")
                ).all()
            )
        owner.dispose()
        assert login == {"tidewatch_engine": True, "tidewatch_dashboard": True, "tidewatch_relay": False}
        envs = {app.name: app.env(s) for app in stack.APPS}
        assert "TIDEWATCH_DATABASE_URL" not in envs["relay"] and "TIDEWATCH_DATABASE_URL" not in envs["feed"]
        for proc in ("engine", "dashboard"):
            url = envs[proc]["TIDEWATCH_DATABASE_URL"]
            assert make_url(url).username == ROLES[proc][0]
            _run(url, "SELECT count(*) FROM alerts")  # both may read the engine's output
        with pytest.raises(DBAPIError):
            _run(envs["engine"]["TIDEWATCH_DATABASE_URL"], "SELECT count(*) FROM users")
        with pytest.raises(DBAPIError):
            _run(envs["dashboard"]["TIDEWATCH_DATABASE_URL"], "DELETE FROM alerts")
    finally:
        postgres.stop(s)
        shutil.rmtree(root, ignore_errors=True)


def test_relay_role_runs_the_real_outbox_relay(role_db: RoleDb, kafka_bootstrap: str) -> None:
    """The relay process's code (subscriptions.outbox.OutboxRelay: advisory lock, recovery read,
    transactional publish, marking) under tidewatch_relay publishes a change the dashboard made."""
    from confluent_kafka.admin import AdminClient

    from subscriptions.outbox import OutboxRelay, pending_count
    from subscriptions.service import SubscriptionService
    from tidewatch.kafka.topics import create_topics, spec_for
    from tidewatch.settings import Settings

    topic = f"subs-roles-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    # the subscriptions topic's spec (one partition, compacted) under a scratch name
    create_topics(admin, [spec_for(topic, Settings(topic_subscriptions=topic))])
    dash = create_engine(role_db.urls["dashboard"], poolclass=pool.NullPool)
    try:
        svc = SubscriptionService(sessionmaker(dash), settings=get_settings(), topic=topic)
        user = f"bob{uuid.uuid4().hex[:6]}"
        svc.ensure_user(user)
        svc.create(user, "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 5")
    finally:
        dash.dispose()
    assert pending_count(role_db.urls["relay"], [topic]) == 1
    with OutboxRelay(topic=topic, bootstrap=kafka_bootstrap, url=role_db.urls["relay"]) as relay:
        assert relay.drain() == 1
    assert pending_count(role_db.urls["relay"], [topic]) == 0
