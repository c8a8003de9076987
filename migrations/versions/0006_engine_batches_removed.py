"""The keys each subscription removed in a batch had in its result (``engine_batches.removed``).

When a subscription is deleted or paused, the engine drops its current results and puts a
tombstone for each of its keys (``subscription|key``) on the compacted ``results`` topic, in the
batch's Kafka transaction.  The keys are written with the batch's row in PostgreSQL, so that a
batch committed there whose Kafka transaction never happened is re-published with its
tombstones (:meth:`engine.app.EngineApp.recover`), as its alerts and dead letters are.  A
``{subscription_id: [key, ...]}`` object; ``{}`` for a batch that removed none (and for the
batches committed before this revision).  No new grant: the engine's role already inserts and
reads ``engine_batches``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "engine_batches",
        sa.Column(
            "removed",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("engine_batches", "removed")
