"""The alert log keyed by what an alert is: (subscription, as_of, key, kind) -- one index less.

Until 0009, ``alerts`` had three indexes: the primary key on ``alert_id`` (the text
``subscription|key|kind|as_of``), ``ix_alerts_subscription_as_of`` on (subscription_id, as_of),
and the unique index on ``seq``.  ``alert_id`` is a function of (subscription_id, key, kind,
as_of), so the primary key on those columns, led by (subscription_id, as_of), holds the same
uniqueness and serves every query the subscription index served (its prefix): the alert log keeps
one index less per row.  The engine's ``COPY`` of a batch's alerts went from 12.4 to 7.8 µs per
alert on this machine (issue #22; docs/measurements/engine.md, "The alert log with one index
less").  ``alert_id`` stays as a column (the dashboard and the Avro records carry it).

Upgrade and downgrade rebuild the indexes (the table is locked meanwhile); no data changes.  No
new grant.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: the identity of an alert, the subscription's lookup times first (the dashboard's queries)
KEY = ["subscription_id", "as_of", "key", "kind"]


def upgrade() -> None:
    op.drop_constraint(op.f("pk_alerts"), "alerts", type_="primary")
    op.drop_index("ix_alerts_subscription_as_of", table_name="alerts")
    op.create_primary_key(op.f("pk_alerts"), "alerts", KEY)


def downgrade() -> None:
    op.drop_constraint(op.f("pk_alerts"), "alerts", type_="primary")
    op.create_primary_key(op.f("pk_alerts"), "alerts", ["alert_id"])
    op.create_index("ix_alerts_subscription_as_of", "alerts", ["subscription_id", "as_of"], unique=False)
