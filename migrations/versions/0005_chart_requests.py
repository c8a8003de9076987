"""Chart requests: the key page asks the engine for a key's aggregates over a rule's window (issue #21).

``chart_requests``: the dashboard inserts (subscription, key) and polls the row; the engine --
which holds the pane state -- answers from the thread that owns that state
(:mod:`engine.sinks.charts`), filling ``answered_at``, ``answered_by`` (its engine id) and
``answer`` (the series as JSON) or ``error`` (a code).  The dashboard never talks to Spark.
Grants (see 0002): the dashboard inserts and reads; the engine reads, answers and deletes old
rows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GRANTS = {
    "tidewatch_dashboard": "SELECT, INSERT",
    "tidewatch_engine": "SELECT, UPDATE, DELETE",
}


def upgrade() -> None:
    op.create_table(
        "chart_requests",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("subscription_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("answered_by", sa.Text(), nullable=True),
        sa.Column("answer", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chart_requests")),
    )
    op.create_index(
        "ix_chart_requests_pending",
        "chart_requests",
        ["requested_at"],
        postgresql_where=sa.text("answered_at IS NULL"),
    )
    conn = op.get_bind()
    for role, privileges in GRANTS.items():
        if conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
            conn.execute(sa.text(f"GRANT {privileges} ON chart_requests TO {role}"))


def downgrade() -> None:
    op.drop_index("ix_chart_requests_pending", table_name="chart_requests")
    op.drop_table("chart_requests")
