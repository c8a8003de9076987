"""Per-reason dead-letter counts in ``engine_metrics`` (issue "The Spark engine": counts exposed).

``dead_letter_reasons`` holds ``{reason: count}`` for the batch (``undecodable``, ``invalid``,
``late`` ...); ``dead_letters`` stays the batch total.  No new table, so the grants of 0002
still cover it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "engine_metrics",
        sa.Column(
            "dead_letter_reasons",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("engine_metrics", "dead_letter_reasons")
