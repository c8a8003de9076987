"""How busy the engine's driver is, on the Health view: ``engine_metrics.driver_cpu_ms``.

The driver is the one part of the engine that adding Spark executors does not scale: it merges
the executors' pane rows, evaluates the shared indexes and delivers the alerts (issue #19).  Its
CPU per batch was only in the benchmarks (``bench/engine_bench.py``'s "driver CPU").  Each
batch's metrics row now carries ``driver_cpu_ms``: the CPU time of the driver's Python process,
all its threads (``time.process_time``), since the batch before's row was made.  The Health view
sums it over the last minute into the share of one core the driver uses and its CPU per event,
so an operator sees the ceiling before adding executors.  NULL for an engine's first batch and
before 0013.

No data changes; no new grant (the roles' grants are per table).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("engine_metrics", sa.Column("driver_cpu_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("engine_metrics", "driver_cpu_ms")
