"""Engines that share a database; dead letters kept until their batch is in Kafka (issue #20).

* ``engine_batches`` is keyed by ``(engine_id, batch_id)`` (was ``batch_id`` alone: a second
  engine on the same database -- a shard, a second deployment -- had its batches skipped as
  committed by the first).  ``alerts`` and ``engine_metrics`` get the same ``engine_id`` column,
  so an engine re-publishes only its own alerts and its metrics are told apart.
* ``engine_dead_letters``: the dead letters of each committed batch, written in the batch's
  transaction, so a batch committed in PostgreSQL whose Kafka transaction never happened is
  re-published with its dead letters too.  The engine deletes them once the batch is in Kafka
  (:class:`engine.sinks.store.Store`); only ``tidewatch_engine`` may read them (they hold the
  records' raw bytes; the dashboard may not read the ``dead-letter`` topic either).

Existing rows get the engine id the engine that wrote them ran with.  PostgreSQL never stored
it, so it is ``default`` -- the default of ``tidewatch engine run --engine-id`` -- unless given:
``alembic -x engine_id=NAME upgrade head``, or ``config.attributes["engine_id"]`` when migrating
programmatically (:func:`tidewatch.db.migrate.alembic_config`).  An engine that ran with another
id and is migrated without it finds no committed batch of its own on restart.  The column keeps
the server default ``'default'``: a row written without an engine id belongs to that engine.
Both ways of adding the column are catalog-only in PostgreSQL >= 11 (no table rewrite, even
for a large ``alerts`` table): the column is added with the existing rows' id as its default,
then the default is changed for new rows.

The downgrade refuses a database holding batches of more than one engine (their batch ids
would collide under the old key).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: engine id of rows written without one (``tidewatch engine run``'s default ``--engine-id``)
DEFAULT_ENGINE_ID = "default"
#: tables that get an ``engine_id`` column
SCOPED = ("engine_batches", "alerts", "engine_metrics")


def existing_engine_id() -> str:
    """The engine id of the rows already there: ``-x engine_id=…``, else the Alembic config's
    attribute ``engine_id``, else :data:`DEFAULT_ENGINE_ID`; letters, digits, ``.``, ``_``, ``-``."""
    got = context.get_x_argument(as_dictionary=True).get("engine_id") or context.config.attributes.get(
        "engine_id"
    )
    got = str(got or DEFAULT_ENGINE_ID)
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", got):
        raise ValueError(f"engine_id {got!r}: letters, digits, '.', '_' and '-' only")
    return got


def upgrade() -> None:
    old = existing_engine_id()  # checked above: a safe literal
    for table in SCOPED:
        # existing rows: the old engine's id; new rows: DEFAULT_ENGINE_ID (both catalog-only)
        op.execute(f"ALTER TABLE {table} ADD COLUMN engine_id text NOT NULL DEFAULT '{old}'")
        op.execute(f"ALTER TABLE {table} ALTER COLUMN engine_id SET DEFAULT '{DEFAULT_ENGINE_ID}'")
    op.drop_constraint("pk_engine_batches", "engine_batches", type_="primary")
    op.create_primary_key("pk_engine_batches", "engine_batches", ["engine_id", "batch_id"])
    op.create_table(
        "engine_dead_letters",
        sa.Column("engine_id", sa.Text(), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("ord", sa.Integer(), nullable=False),
        sa.Column("source_topic", sa.Text(), nullable=False),
        sa.Column("source_partition", sa.Integer(), nullable=False),
        sa.Column("source_offset", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.LargeBinary(), nullable=True),
        sa.Column("value", sa.LargeBinary(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), server_default="", nullable=False),
        sa.Column("event_ts", sa.BigInteger(), nullable=True),
        sa.Column("watermark", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("engine_id", "batch_id", "ord", name=op.f("pk_engine_dead_letters")),
    )
    conn = op.get_bind()
    if conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = 'tidewatch_engine'")).first():
        conn.execute(sa.text("GRANT SELECT, INSERT, DELETE ON engine_dead_letters TO tidewatch_engine"))


def downgrade() -> None:
    conn = op.get_bind()
    ids = [r[0] for r in conn.execute(sa.text("SELECT DISTINCT engine_id FROM engine_batches"))]
    if len(ids) > 1:
        raise RuntimeError(
            f"engine_batches holds the batches of {len(ids)} engines ({', '.join(sorted(ids))}): "
            "their batch ids would collide under the old primary key; delete all but one engine's first"
        )
    op.drop_table("engine_dead_letters")
    op.drop_constraint("pk_engine_batches", "engine_batches", type_="primary")
    op.create_primary_key("pk_engine_batches", "engine_batches", ["batch_id"])
    for table in SCOPED:
        op.drop_column(table, "engine_id")
