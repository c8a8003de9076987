"""A committed batch's alerts as one row: ``engine_outputs`` (issue #22, "Alert storms").

Until 0010 the engine's commit wrote every alert of a batch as a row of ``alerts`` (two indexes)
and applied its changes to ``current_results`` (an upsert per (subscription, key)) in the batch's
transaction: ≈ 13 µs of server work per alert, all of it before the batch counted as delivered.
From 0011 the commit writes the batch's alerts as ONE row of ``engine_outputs`` (Arrow IPC
streams, :mod:`engine.sinks.output_block`) and a second transaction, right behind it, expands
the row into ``alerts`` and ``current_results`` and deletes it in the same transaction
(:meth:`engine.sinks.store.Store.project`), so each batch is expanded exactly once.  A row still
here at a restart is expanded before the engine does anything else.

The bodies are stored as they come (``STORAGE EXTERNAL``: no second compression by the server).
The engine's role reads, inserts and deletes the rows; no other role sees them.  Downgrade
refuses while rows are still there (their alerts are in no other table yet): start the engine at
this revision once to expand them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BODIES = ("alert_rows", "alert_items", "withheld_rows", "withheld_items")


def upgrade() -> None:
    op.create_table(
        "engine_outputs",
        sa.Column("engine_id", sa.Text(), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), autoincrement=False, nullable=False),
        *(sa.Column(c, sa.LargeBinary(), nullable=True) for c in BODIES),
        sa.Column("removed", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("engine_id", "batch_id", name=op.f("pk_engine_outputs")),
    )
    for c in BODIES:  # zstd-compressed by the engine already: not again by the server
        op.execute(f"ALTER TABLE engine_outputs ALTER COLUMN {c} SET STORAGE EXTERNAL")
    conn = op.get_bind()
    if conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = 'tidewatch_engine'")).first():
        conn.execute(sa.text("GRANT SELECT, INSERT, DELETE ON engine_outputs TO tidewatch_engine"))


def downgrade() -> None:
    conn = op.get_bind()
    left = conn.execute(sa.text("SELECT count(*) FROM engine_outputs")).scalar()
    if left:
        raise RuntimeError(
            f"engine_outputs holds {left} committed batches whose alerts are in no other table yet: "
            "start the engine at revision 0011 once (it writes them into alerts), then downgrade"
        )
    op.drop_table("engine_outputs")
