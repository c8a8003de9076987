"""How long delivery takes, on the Health view: ``engine_metrics.delivery_ms`` and ``expansion_ms``.

Since 0011 a batch counts as delivered when its PostgreSQL commit (one ``engine_outputs`` row)
and its Kafka transaction are done; its alerts are written into ``alerts`` and ``current_results``
behind that, by a thread of their own (:class:`engine.sinks.deliver.Delivery`).  Neither time
was anywhere but the engine's log: Health's "batch duration" is the evaluation's.  Each batch's
metrics row now also carries the figures of the delivery before it (of the batch before; its
metrics are committed before its own delivery ends): ``delivery_ms``, from that batch's output to
both commits, the wait for the expansion before it included, and ``expansion_ms``, the newest
expansion's own time.  NULL before 0012 and for an engine's first batch.

No data changes; no new grant (the roles' grants are per table).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("delivery_ms", "expansion_ms")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("engine_metrics", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    for name in COLUMNS:
        op.drop_column("engine_metrics", name)
