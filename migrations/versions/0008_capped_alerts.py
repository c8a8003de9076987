"""The alert cap's record in the alert log, and the changes a capped batch withheld.

``engine_alert_cap_per_lookup`` (off by default) caps one subscription's alerts per lookup time:
the first ``cap`` are logged, then ONE record of kind ``CAPPED`` (key ``''``, values
``{"withheld": n, "withheld_enter": e, "withheld_exit": x, "cap": cap}``) says how many were
withheld (docs/engine.md, "Alert cap").  So ``alerts.kind`` also takes ``'CAPPED'`` (widened to
``varchar(6)``), and ``engine_batches.withheld`` holds ``{subscription_id: [key, ...]}``, the
keys whose changes a batch withheld from the alert log: a batch committed here whose Kafka
transaction never happened is re-published with a ``results`` record for each (from
``current_results``), as its alerts are.  ``{}`` for a batch that withheld none (and for the
batches committed before this revision).  No new grant: the engine's role already writes both
tables.  Downgrade: the ``CAPPED`` rows are deleted (the old constraint refuses them).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint(op.f("ck_alerts_kind"), "alerts", type_="check")
    op.alter_column("alerts", "kind", type_=sa.String(6), existing_type=sa.String(5), existing_nullable=False)
    op.create_check_constraint(op.f("ck_alerts_kind"), "alerts", "kind IN ('ENTER', 'EXIT', 'CAPPED')")
    op.add_column(
        "engine_batches",
        sa.Column(
            "withheld",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("engine_batches", "withheld")
    op.execute("DELETE FROM alerts WHERE kind = 'CAPPED'")
    op.drop_constraint(op.f("ck_alerts_kind"), "alerts", type_="check")
    op.alter_column("alerts", "kind", type_=sa.String(5), existing_type=sa.String(6), existing_nullable=False)
    op.create_check_constraint(op.f("ck_alerts_kind"), "alerts", "kind IN ('ENTER', 'EXIT')")
