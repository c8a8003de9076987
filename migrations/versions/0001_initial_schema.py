"""Initial schema: users and sessions, subscriptions with history and outbox, engine output.

See tidewatch/db/models.py for what each table is for.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("alert_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("subscription_id", sa.UUID(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=5), nullable=False),
        sa.Column("as_of", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "values",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("kind IN ('ENTER', 'EXIT')", name=op.f("ck_alerts_kind")),
        sa.PrimaryKeyConstraint("alert_id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("seq", name=op.f("uq_alerts_seq")),
    )
    op.create_index("ix_alerts_subscription_as_of", "alerts", ["subscription_id", "as_of"], unique=False)
    op.create_table(
        "current_results",
        sa.Column("subscription_id", sa.UUID(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "values",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("subscription_id", "key", name=op.f("pk_current_results")),
    )
    op.create_table(
        "engine_batches",
        sa.Column("batch_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column(
            "committed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("watermark", sa.DateTime(timezone=True), nullable=True),
        sa.Column("events", sa.BigInteger(), nullable=True),
        sa.Column("alerts", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_engine_batches")),
    )
    op.create_table(
        "engine_metrics",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=True),
        sa.Column("events_per_s", sa.Float(), nullable=True),
        sa.Column("batch_ms", sa.Float(), nullable=True),
        sa.Column("lag_ms", sa.Float(), nullable=True),
        sa.Column("alerts", sa.Integer(), nullable=True),
        sa.Column("dead_letters", sa.Integer(), nullable=True),
        sa.Column("state_bytes", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_metrics")),
    )
    op.create_index(op.f("ix_engine_metrics_ts"), "engine_metrics", ["ts"], unique=False)
    op.create_table(
        "login_attempts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("client", sa.String(length=128), nullable=True),
        sa.Column("succeeded", sa.Boolean(), nullable=False),
        sa.Column(
            "attempted_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_login_attempts")),
    )
    op.create_index(
        "ix_login_attempts_username_at", "login_attempts", ["username", "attempted_at"], unique=False
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("topic", sa.String(length=249), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("payload_bytes", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("kafka_partition", sa.Integer(), nullable=True),
        sa.Column("kafka_offset", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
    )
    op.create_index(
        "ix_outbox_topic_partition_offset",
        "outbox",
        ["topic", "kafka_partition", "kafka_offset"],
        unique=False,
    )
    op.create_index(
        "ix_outbox_unpublished",
        "outbox",
        ["id"],
        unique=False,
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("username", name=op.f("uq_users_username")),
    )
    op.create_table(
        "client_cursors",
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("client_id", sa.String(length=128), nullable=False),
        sa.Column("last_alert_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["username"],
            ["users.username"],
            name=op.f("fk_client_cursors_username_users"),
            onupdate="CASCADE",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("username", "client_id", name=op.f("pk_client_cursors")),
    )
    op.create_table(
        "subscriptions",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("rule_text", sa.Text(), nullable=False),
        sa.Column("plan", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("state", sa.String(length=16), server_default="active", nullable=False),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("state IN ('active', 'paused', 'deleted')", name=op.f("ck_subscriptions_state")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_subscriptions_version_positive")),
        sa.ForeignKeyConstraint(
            ["owner"], ["users.username"], name=op.f("fk_subscriptions_owner_users"), onupdate="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_subscriptions")),
    )
    op.create_index("ix_subscriptions_owner_state", "subscriptions", ["owner", "state"], unique=False)
    op.create_index(
        "uq_subscriptions_owner_name_live",
        "subscriptions",
        ["owner", "name"],
        unique=True,
        postgresql_where=sa.text("state <> 'deleted'"),
    )
    op.create_table(
        "user_sessions",
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_user_sessions_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_user_sessions")),
    )
    op.create_index(op.f("ix_user_sessions_user_id"), "user_sessions", ["user_id"], unique=False)
    op.create_table(
        "subscription_versions",
        sa.Column("subscription_id", sa.UUID(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("change", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("rule_text", sa.Text(), nullable=False),
        sa.Column("plan", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("changed_by", sa.String(length=64), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["subscription_id"],
            ["subscriptions.id"],
            name=op.f("fk_subscription_versions_subscription_id_subscriptions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("subscription_id", "version", name=op.f("pk_subscription_versions")),
    )


def downgrade() -> None:
    op.drop_table("subscription_versions")
    op.drop_index(op.f("ix_user_sessions_user_id"), table_name="user_sessions")
    op.drop_table("user_sessions")
    op.drop_index(
        "uq_subscriptions_owner_name_live",
        table_name="subscriptions",
        postgresql_where=sa.text("state <> 'deleted'"),
    )
    op.drop_index("ix_subscriptions_owner_state", table_name="subscriptions")
    op.drop_table("subscriptions")
    op.drop_table("client_cursors")
    op.drop_table("users")
    op.drop_index(
        "ix_outbox_unpublished", table_name="outbox", postgresql_where=sa.text("published_at IS NULL")
    )
    op.drop_index("ix_outbox_topic_partition_offset", table_name="outbox")
    op.drop_table("outbox")
    op.drop_index("ix_login_attempts_username_at", table_name="login_attempts")
    op.drop_table("login_attempts")
    op.drop_index(op.f("ix_engine_metrics_ts"), table_name="engine_metrics")
    op.drop_table("engine_metrics")
    op.drop_table("engine_batches")
    op.drop_table("current_results")
    op.drop_index("ix_alerts_subscription_as_of", table_name="alerts")
    op.drop_table("alerts")
