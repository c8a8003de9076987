"""Staleness budgets: overload by policy (issue "Alert storms", docs/engine.md "Overload").

A subscription may declare a staleness budget (``subscriptions.staleness_budget_ms``, NULL: none,
the default): when input outruns the engine, the engine spaces that subscription's lookups, in
budget order, up to the budget, before latency grows for every subscription (Aurora's QoS,
Golab's re-evaluation period).  Every event is still applied exactly; only the lookup times of
the degraded subscriptions are fewer.  ``subscription_versions`` keeps the budget with each
version.

``engine_batches.strides`` records, with the batch's commit, ``{subscription_id: stride}`` for
the subscriptions the batch looked up only at lookup times that are multiples of ``stride``
lookup periods (stride > 1; ``{}``: every subscription at every lookup time), so a replay of the
batch after a restart makes the same lookups as the first run (never the controller's new
decision).  ``engine_metrics.degraded`` is ``{subscription_id: {"every_ms": spacing,
"budget_ms": budget}}`` for the Health view.  No new grant: the roles already read and write
these tables.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _jsonb(table: str, column: str) -> None:
    op.add_column(
        table,
        sa.Column(
            column,
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )


def upgrade() -> None:
    for table in ("subscriptions", "subscription_versions"):
        op.add_column(table, sa.Column("staleness_budget_ms", sa.BigInteger(), nullable=True))
        op.create_check_constraint(
            op.f(f"ck_{table}_staleness_budget_positive"),
            table,
            "staleness_budget_ms IS NULL OR staleness_budget_ms > 0",
        )
    _jsonb("engine_batches", "strides")
    _jsonb("engine_metrics", "degraded")


def downgrade() -> None:
    op.drop_column("engine_metrics", "degraded")
    op.drop_column("engine_batches", "strides")
    for table in ("subscription_versions", "subscriptions"):
        op.drop_constraint(op.f(f"ck_{table}_staleness_budget_positive"), table, type_="check")
        op.drop_column(table, "staleness_budget_ms")
