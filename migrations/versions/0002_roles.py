"""Least-privilege PostgreSQL roles: one per process (issue "Reliability and security").

* ``tidewatch_engine`` -- writes the engine's output (``alerts``, ``current_results``,
  ``engine_batches``, ``engine_metrics``); no access at all to accounts (``users``,
  ``user_sessions``, ``login_attempts``) or to subscriptions, outbox and cursors (the engine
  learns subscriptions from Kafka).
* ``tidewatch_dashboard`` -- manages accounts, sessions, login attempts, subscriptions (with
  their history and outbox rows) and client cursors; only *reads* the engine's tables, so it
  cannot write or delete an alert or a current result.
* ``tidewatch_relay`` -- the outbox relay: reads and marks ``outbox`` rows, reads
  ``subscriptions``; nothing else.

The application role that runs the migrations (the database owner) keeps everything and is
what the CLI and ``tidewatch up``'s seeding use.  Passwords come from the settings
(``TIDEWATCH_PG_ENGINE_PASSWORD`` ...; never from the repository): a role without one is created
``NOLOGIN`` (its grants are still in place, ready for a password later); an existing role with no
password configured is left as it is.  Roles are per cluster, so creating them needs CREATEROLE
(the embedded stack grants it to the application role; a container's superuser has it); without
it, roles that do not exist yet are skipped with a warning -- nothing is opened.

A later migration that adds a table must grant it here-style (see ``GRANTS``) to the roles that
need it; by default none of these roles can read a new table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("alembic.runtime.migration")

ENGINE_TABLES = ("alerts", "current_results", "engine_batches", "engine_metrics")
ACCOUNT_TABLES = ("users", "user_sessions", "login_attempts")
DASHBOARD_TABLES = (*ACCOUNT_TABLES, "subscriptions", "subscription_versions", "outbox", "client_cursors")

#: role -> [(privileges, tables)]; everything not listed is refused
GRANTS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "tidewatch_engine": [("SELECT, INSERT, UPDATE, DELETE", ENGINE_TABLES)],
    "tidewatch_dashboard": [
        ("SELECT, INSERT, UPDATE, DELETE", DASHBOARD_TABLES),
        ("SELECT", ENGINE_TABLES),
    ],
    "tidewatch_relay": [("SELECT, UPDATE", ("outbox",)), ("SELECT", ("subscriptions",))],
}
#: role -> settings field holding its password
PASSWORD_FIELDS = {
    "tidewatch_engine": "pg_engine_password",
    "tidewatch_dashboard": "pg_dashboard_password",
    "tidewatch_relay": "pg_relay_password",
}


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _passwords() -> dict[str, str | None]:
    from tidewatch.settings import get_settings

    s = get_settings()
    return {role: getattr(s, field) for role, field in PASSWORD_FIELDS.items()}


def _set_password(conn: sa.Connection, role: str, password: str) -> None:
    """``ALTER ROLE .. LOGIN PASSWORD`` with a SCRAM-SHA-256 verifier computed here (psycopg2's
    ``encrypt_password``), so the clear text never reaches the server nor its statement log.

    The statement is built by the server's ``format(%I, %L)`` and run through the DB-API cursor
    without parameters (a verifier holds ``:`` and ``%``, which bind-parameter parsing would take)."""
    raw = conn.connection.dbapi_connection
    assert raw is not None
    try:
        from psycopg2.extensions import encrypt_password

        secret = encrypt_password(password, role, raw, "scram-sha-256")
    except (ImportError, TypeError):  # another driver: the server hashes it (password_encryption)
        secret = password
    stmt = conn.execute(
        sa.text("SELECT format('ALTER ROLE %I LOGIN PASSWORD %L', CAST(:r AS text), CAST(:p AS text))"),
        {"r": role, "p": secret},
    ).scalar()
    assert isinstance(stmt, str)
    cur = raw.cursor()
    try:
        cur.execute(stmt)
    finally:
        cur.close()


def upgrade() -> None:
    conn = op.get_bind()
    can_create = bool(
        conn.execute(
            sa.text("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")
        ).scalar()
    )
    dbname = conn.execute(sa.text("SELECT current_database()")).scalar()
    assert isinstance(dbname, str)
    for role, password in _passwords().items():
        exists = conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
        if exists is None and not can_create:
            log.warning(
                "role %s does not exist and %s may not create roles: skipped", role, "the migrating role"
            )
            continue
        if exists is None:
            login = "LOGIN" if password else "NOLOGIN"
            conn.execute(
                sa.text(f"CREATE ROLE {_q(role)} {login} NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT")
            )
        if password and can_create:
            _set_password(conn, role, password)
        conn.execute(sa.text(f"GRANT CONNECT ON DATABASE {_q(dbname)} TO {_q(role)}"))
        conn.execute(sa.text(f"GRANT USAGE ON SCHEMA public TO {_q(role)}"))
        conn.execute(sa.text(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {_q(role)}"))
        for privileges, tables in GRANTS[role]:
            conn.execute(sa.text(f"GRANT {privileges} ON {', '.join(_q(t) for t in tables)} TO {_q(role)}"))


def downgrade() -> None:
    conn = op.get_bind()
    dbname = conn.execute(sa.text("SELECT current_database()")).scalar()
    assert isinstance(dbname, str)
    for role in GRANTS:
        if conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first() is None:
            continue
        conn.execute(sa.text(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {_q(role)}"))
        conn.execute(sa.text(f"REVOKE USAGE ON SCHEMA public FROM {_q(role)}"))
        conn.execute(sa.text(f"REVOKE CONNECT ON DATABASE {_q(dbname)} FROM {_q(role)}"))
        # the role may still hold grants in another database of the cluster: then it stays
        conn.execute(
            sa.text(
                f"DO $$ BEGIN DROP ROLE {_q(role)}; "
                "EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege THEN NULL; END $$"
            )
        )
