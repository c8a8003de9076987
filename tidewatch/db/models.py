"""SQLAlchemy 2 typed models of every Tidewatch table.

Who writes what:

* dashboard / CLI through :mod:`subscriptions.service`: ``users``, ``user_sessions``,
  ``login_attempts``, ``subscriptions``, ``subscription_versions``, ``outbox``,
  ``client_cursors``;
* the outbox relay (:mod:`subscriptions.outbox`): ``outbox.published_at`` and offsets;
* the engine: ``alerts``, ``current_results``, ``engine_batches``, ``engine_metrics``,
  ``engine_dead_letters``, ``engine_outputs`` (a committed batch's alerts as one row, until they
  are expanded into ``alerts`` and ``current_results``) -- idempotent per micro-batch: an alert's primary key is its stable id
  (subscription, key, kind, as_of), and a batch is keyed by (engine id, batch id), so writing the
  same batch twice changes nothing
  (the design brief's "Delivery" semantics; docs/ARCHITECTURE.md, "Exactly once, end to end").

``alerts`` and ``current_results`` carry no foreign key to ``subscriptions`` on purpose:
the engine writes them from its own state and must never fail a batch on a subscription
row (subscriptions are soft-deleted, never removed, so joins still work).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Deterministic constraint names, so Alembic migrations can drop what they create.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

SUBSCRIPTION_STATES = ("active", "paused", "deleted")
#: an alert's kinds: ENTER / EXIT, and CAPPED -- the record saying a subscription's alerts at one
#: lookup time were capped (``engine_alert_cap_per_lookup``; docs/engine.md, "Alert cap")
ALERT_KINDS = ("ENTER", "EXIT", "CAPPED")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSONB, datetime: DateTime(timezone=True)}


def _now() -> Any:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


#: engine id of a row written without one: ``tidewatch engine run``'s default ``--engine-id``
DEFAULT_ENGINE_ID = "default"


def _engine_id(primary_key: bool = False) -> Any:
    return mapped_column(
        Text,
        nullable=False,
        primary_key=primary_key,
        server_default=DEFAULT_ENGINE_ID,
        default=DEFAULT_ENGINE_ID,
    )


# --- users and sessions -------------------------------------------------------------------


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    #: argon2 hash; NULL for a user created from the CLI who has not set a password yet
    password_hash: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class UserSession(Base):
    """A dashboard login; only a hash of the bearer token is stored."""

    __tablename__ = "user_sessions"

    token_hash: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False, index=True
    )
    created_at: Mapped[datetime] = _now()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class LoginAttempt(Base):
    """Every login attempt, for rate limiting by user name and by client address."""

    __tablename__ = "login_attempts"
    __table_args__ = (Index("ix_login_attempts_username_at", "username", "attempted_at"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    username: Mapped[str] = mapped_column(String(64), nullable=False)
    client: Mapped[str | None] = mapped_column(String(128))
    succeeded: Mapped[bool] = mapped_column(Boolean, nullable=False)
    attempted_at: Mapped[datetime] = _now()


# --- subscriptions and their changelog ----------------------------------------------------


class Subscription(Base):
    """A user's standing rule.  ``version`` grows by one with every change."""

    __tablename__ = "subscriptions"
    __table_args__ = (
        CheckConstraint("state IN ('active', 'paused', 'deleted')", name="state"),
        CheckConstraint("version >= 1", name="version_positive"),
        CheckConstraint(
            "staleness_budget_ms IS NULL OR staleness_budget_ms > 0", name="staleness_budget_positive"
        ),
        # a name is unique per owner among the subscriptions that are not deleted
        Index(
            "uq_subscriptions_owner_name_live",
            "owner",
            "name",
            unique=True,
            postgresql_where=text("state <> 'deleted'"),
        ),
        Index("ix_subscriptions_owner_state", "owner", "state"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    owner: Mapped[str] = mapped_column(
        String(64), ForeignKey("users.username", onupdate="CASCADE"), nullable=False
    )
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    rule_text: Mapped[str] = mapped_column(Text, nullable=False)
    plan: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False, server_default="active")
    version: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    #: how far apart (ms) the engine may space this subscription's lookups when it is overloaded
    #: (None: never; docs/engine.md "Overload"; migration 0009)
    staleness_budget_ms: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class SubscriptionVersion(Base):
    """History: one row per (subscription, version), written with the change."""

    __tablename__ = "subscription_versions"
    __table_args__ = (
        CheckConstraint(
            "staleness_budget_ms IS NULL OR staleness_budget_ms > 0", name="staleness_budget_positive"
        ),
    )

    subscription_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("subscriptions.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    change: Mapped[str] = mapped_column(String(16), nullable=False)  # create/update/pause/resume/delete
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    rule_text: Mapped[str] = mapped_column(Text, nullable=False)
    plan: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    changed_by: Mapped[str] = mapped_column(String(64), nullable=False)
    changed_at: Mapped[datetime] = _now()
    staleness_budget_ms: Mapped[int | None] = mapped_column(BigInteger)


class Outbox(Base):
    """Transactional outbox: a row per change, written in the change's transaction.

    The relay publishes unpublished rows in ``id`` order and records where each landed
    (``kafka_partition``, ``kafka_offset``), which its crash recovery relies on.
    """

    __tablename__ = "outbox"
    __table_args__ = (
        Index("ix_outbox_unpublished", "id", postgresql_where=text("published_at IS NULL")),
        Index("ix_outbox_topic_partition_offset", "topic", "kafka_partition", "kafka_offset"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    topic: Mapped[str] = mapped_column(String(249), nullable=False)
    key: Mapped[str] = mapped_column(Text, nullable=False)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    payload_bytes: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _now()
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    kafka_partition: Mapped[int | None] = mapped_column(Integer)
    kafka_offset: Mapped[int | None] = mapped_column(BigInteger)


# --- engine output --------------------------------------------------------------------------


class Alert(Base):
    """The alert log, keyed by what an alert is: (subscription, as_of, key, kind) -- the primary
    key also serves the queries by subscription and time (migration 0010); ``alert_id`` is the
    same identity as text, ``subscription|key|kind|as_of`` (:attr:`engine.messages.Alert.id`)."""

    __tablename__ = "alerts"
    __table_args__ = (CheckConstraint("kind IN ('ENTER', 'EXIT', 'CAPPED')", name="kind"),)

    alert_id: Mapped[str] = mapped_column(Text, nullable=False)
    #: insertion order, for client cursors ("every alert after seq N")
    seq: Mapped[int] = mapped_column(BigInteger, Identity(), unique=True, nullable=False)
    subscription_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    as_of: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(String(6), primary_key=True)
    values: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    batch_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[datetime] = _now()
    #: the engine that wrote it (with ``batch_id``: its batch; it re-publishes only its own)
    engine_id: Mapped[str] = _engine_id()


class CurrentResult(Base):
    """The materialized result set of each subscription (PSoup): keys satisfying it now."""

    __tablename__ = "current_results"

    subscription_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    values: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    updated_at: Mapped[datetime] = _now()


class ClientCursor(Base):
    """Where a user's client stopped reading alerts; on reconnect it gets everything after."""

    __tablename__ = "client_cursors"

    username: Mapped[str] = mapped_column(
        String(64), ForeignKey("users.username", ondelete="CASCADE", onupdate="CASCADE"), primary_key=True
    )
    client_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    last_alert_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    updated_at: Mapped[datetime] = _now()


class EngineBatch(Base):
    """Micro-batches whose output is committed, per engine: a batch id present here for an
    engine id is never applied again by that engine (engines sharing the database -- shards,
    deployments -- each have their own batch ids)."""

    __tablename__ = "engine_batches"

    engine_id: Mapped[str] = _engine_id(primary_key=True)
    batch_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    committed_at: Mapped[datetime] = _now()
    watermark: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    events: Mapped[int | None] = mapped_column(BigInteger)
    alerts: Mapped[int | None] = mapped_column(Integer)
    #: ``{subscription_id: [key, ...]}``: the result each subscription removed in the batch had
    #: (their tombstones on the ``results`` topic, re-published with the batch after a crash)
    removed: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    #: ``{subscription_id: [key, ...]}``: the keys whose changes the batch withheld from the alert log
    #: (the alert cap; their ``results`` records are re-published from ``current_results`` after a crash)
    withheld: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    #: ``{subscription_id: stride}``: the subscriptions the batch looked up only at the lookup
    #: times that are multiples of ``stride`` lookup periods (overload policy, stride > 1; a
    #: replay of the batch makes the same lookups; migration 0009)
    strides: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))


class EngineMetric(Base):
    """One row per micro-batch of engine health figures, for the dashboard."""

    __tablename__ = "engine_metrics"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    ts: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now(), index=True
    )
    batch_id: Mapped[int | None] = mapped_column(BigInteger)
    events_per_s: Mapped[float | None] = mapped_column(Float)
    batch_ms: Mapped[float | None] = mapped_column(Float)
    lag_ms: Mapped[float | None] = mapped_column(Float)
    alerts: Mapped[int | None] = mapped_column(Integer)
    dead_letters: Mapped[int | None] = mapped_column(Integer)
    state_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: ``{reason: count}`` of the batch's dead letters (``dead_letters`` is their total).
    dead_letter_reasons: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    #: ``{subscription id (UUID text): alerts}`` of the batch's (at most) three subscriptions with
    #: the most alerts (``alerts`` is the batch total): who an alert storm comes from (0006)
    top_alerts: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    #: lookup times the batch evaluated (None: written before migration 0006)
    lookups: Mapped[int | None] = mapped_column(Integer)
    #: ``{subscription id: {"every_ms": spacing, "budget_ms": budget}}``: the subscriptions whose
    #: lookups the overload policy spaced at this batch (Health's "degraded"; migration 0009)
    degraded: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    #: the delivery before this batch's (of the batch before: a batch's metrics are committed
    #: before its own delivery ends), ms from its output to both commits, PostgreSQL's and
    #: Kafka's, the wait for the expansion before it included; and the newest expansion's own ms
    #: (into ``alerts`` and ``current_results``, behind the commit: :mod:`engine.sinks.deliver`).
    #: NULL for an engine's first batch and before migration 0012.
    delivery_ms: Mapped[float | None] = mapped_column(Float)
    expansion_ms: Mapped[float | None] = mapped_column(Float)
    #: CPU ms of the engine driver's Python process, all its threads, since the batch before's
    #: row was made: what the Health view turns into the driver's share of a core (migration
    #: 0013; NULL for an engine's first batch and before it)
    driver_cpu_ms: Mapped[float | None] = mapped_column(Float)
    engine_id: Mapped[str] = _engine_id()


class EngineOutput(Base):
    """A committed batch's alerts as ONE row, until they are written into ``alerts`` and
    ``current_results`` (migration 0011; :mod:`engine.sinks.output_block`).  The engine's commit
    writes this row in the batch's transaction -- one row however many alerts -- and a second
    transaction, behind the commit, expands it into the per-alert tables and deletes it
    (:meth:`engine.sinks.store.Store.project`); a row still here after a restart is expanded before
    anything else.  The bodies are Arrow IPC streams (zstd), stored uncompressed by PostgreSQL."""

    __tablename__ = "engine_outputs"

    engine_id: Mapped[str] = mapped_column(Text, primary_key=True)
    batch_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    #: the batch's alerts: one row each (:meth:`engine.sinks.alert_columns.AlertColumns.to_tables`) ...
    alert_rows: Mapped[bytes | None] = mapped_column(LargeBinary)
    #: ... and one row per value entry
    alert_items: Mapped[bytes | None] = mapped_column(LargeBinary)
    #: the changes the alert cap withheld from ``alerts`` (``current_results`` gets them), the same way
    withheld_rows: Mapped[bytes | None] = mapped_column(LargeBinary)
    withheld_items: Mapped[bytes | None] = mapped_column(LargeBinary)
    #: the subscriptions the batch removed (their ``current_results`` rows are deleted)
    removed: Mapped[list[str]] = mapped_column(JSONB, nullable=False, server_default=text("'[]'::jsonb"))
    created_at: Mapped[datetime] = _now()


class EngineDeadLetter(Base):
    """The dead letters of an engine's committed batch (:class:`engine.dead_letter.DeadLetters`,
    in order ``ord``), written in the batch's transaction so that a batch committed here whose
    Kafka transaction never happened is re-published with them; deleted by the engine once the
    batch is in Kafka.  Times in epoch ms (an absurd event time still fits)."""

    __tablename__ = "engine_dead_letters"

    engine_id: Mapped[str] = mapped_column(Text, primary_key=True)
    batch_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    ord: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    source_topic: Mapped[str] = mapped_column(Text, nullable=False)
    source_partition: Mapped[int] = mapped_column(Integer, nullable=False)
    source_offset: Mapped[int] = mapped_column(BigInteger, nullable=False)
    key: Mapped[bytes | None] = mapped_column(LargeBinary)
    value: Mapped[bytes | None] = mapped_column(LargeBinary)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    detail: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    event_ts: Mapped[int | None] = mapped_column(BigInteger)
    watermark: Mapped[int | None] = mapped_column(BigInteger)


__all__ = [
    "ALERT_KINDS",
    "SUBSCRIPTION_STATES",
    "Alert",
    "Base",
    "ClientCursor",
    "CurrentResult",
    "DEFAULT_ENGINE_ID",
    "EngineBatch",
    "EngineDeadLetter",
    "EngineMetric",
    "EngineOutput",
    "LoginAttempt",
    "Outbox",
    "Subscription",
    "SubscriptionVersion",
    "User",
    "UserSession",
]


class ChartRequest(Base):
    """The key page asks the engine for one key's aggregates over a rule's window
    (:mod:`dashboard.views.key_detail`), the engine answers from the state it holds
    (:mod:`engine.sinks.charts`): the dashboard inserts a row and polls it; the engine fills
    ``answered_at`` and ``answer`` (the series, :meth:`engine.evaluation.key_series.KeySeries.to_json`)
    or ``error`` (a code: :data:`engine.sinks.charts.ERRORS`).  Rows older than an hour are
    deleted by the engine."""

    __tablename__ = "chart_requests"
    __table_args__ = (
        # the engine's poll: the requests not answered yet
        Index("ix_chart_requests_pending", "requested_at", postgresql_where=text("answered_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    subscription_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    key: Mapped[str] = mapped_column(Text, nullable=False)
    requested_at: Mapped[datetime] = _now()
    answered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    answered_by: Mapped[str | None] = mapped_column(Text)
    answer: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)
