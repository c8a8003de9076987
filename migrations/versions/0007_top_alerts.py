"""Which subscriptions a batch's alerts came from (issue #22, alert storms on the Health view).

``engine_metrics.top_alerts`` holds ``{subscription id: alerts}`` for the batch's (at most) three
subscriptions with the most alerts, and ``lookups`` how many lookup times the batch evaluated;
the dashboard's Health view sums ``top_alerts`` over the last minute to name the subscription
behind an alert storm.  New columns of an existing table: the grants of 0002 (the engine
writes ``engine_metrics``, the dashboard reads it) already cover them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "engine_metrics",
        sa.Column(
            "top_alerts",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )
    op.add_column("engine_metrics", sa.Column("lookups", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("engine_metrics", "lookups")
    op.drop_column("engine_metrics", "top_alerts")
