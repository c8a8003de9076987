"""Read-only queries of the dashboard, every one scoped to the logged-in user.

Ownership is enforced in SQL: alerts and current results are reached only through a join
on ``subscriptions.owner = :username`` -- an id of another user's subscription passed as a
filter simply matches nothing.  All values are bound parameters; the key filter escapes
``LIKE`` wildcards, so ``%`` or ``_`` in it match themselves.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from dashboard.catchup import AlertRow, as_values
from tidewatch.db.models import Alert, CurrentResult, EngineBatch, EngineMetric, Subscription
from tidewatch.settings import Settings

MAX_LIMIT = 5000


def escape_like(text: str) -> str:
    """``text`` as a LIKE pattern matching itself (escape character ``\\``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def alerts(
    sessions: sessionmaker[Session],
    username: str,
    *,
    subscription_ids: Sequence[uuid.UUID] | None = None,
    key: str | None = None,
    exact_key: bool = False,
    kinds: Sequence[str] | None = None,
    after_seq: int | None = None,
    limit: int = 200,
) -> list[AlertRow]:
    """The user's alerts, newest first, filtered by subscription, key (substring, or exact),
    kind and ``seq > after_seq``."""
    q = (
        select(Alert, Subscription.name)
        .join(Subscription, Subscription.id == Alert.subscription_id)
        .where(Subscription.owner == username)
    )
    if subscription_ids:
        q = q.where(Alert.subscription_id.in_(list(subscription_ids)))
    if key:
        if exact_key:
            q = q.where(Alert.key == key)
        else:
            q = q.where(Alert.key.ilike("%" + escape_like(key) + "%", escape="\\"))
    if kinds:
        q = q.where(Alert.kind.in_(list(kinds)))
    if after_seq is not None:
        q = q.where(Alert.seq > after_seq)
    q = q.order_by(Alert.seq.desc()).limit(max(1, min(int(limit), MAX_LIMIT)))
    with sessions() as s:
        return [
            AlertRow(a.seq, a.alert_id, a.subscription_id, name, a.key, a.kind, a.as_of, as_values(a.values))
            for a, name in s.execute(q).all()
        ]


def newest_seq(sessions: sessionmaker[Session], username: str) -> int:
    """The largest alert ``seq`` of the user's subscriptions (0 when none)."""
    with sessions() as s:
        v = s.scalar(
            select(func.max(Alert.seq))
            .join(Subscription, Subscription.id == Alert.subscription_id)
            .where(Subscription.owner == username)
        )
    return int(v or 0)


def count_after(sessions: sessionmaker[Session], username: str, seq: int) -> int:
    with sessions() as s:
        v = s.scalar(
            select(func.count())
            .select_from(Alert)
            .join(Subscription, Subscription.id == Alert.subscription_id)
            .where(Subscription.owner == username, Alert.seq > seq)
        )
    return int(v or 0)


@dataclass(frozen=True)
class KeyResult:
    subscription_id: uuid.UUID
    subscription: str
    state: str
    rule_text: str
    plan: dict[str, Any]
    in_result: bool
    since: datetime | None
    values: dict[str, Any]


def key_results(sessions: sessionmaker[Session], username: str, key: str) -> list[KeyResult]:
    """For each of the user's live subscriptions: is ``key`` in its current result, since when."""
    with sessions() as s:
        rows = s.execute(
            select(
                Subscription.id,
                Subscription.name,
                Subscription.state,
                Subscription.rule_text,
                Subscription.plan,
                CurrentResult.since,
                CurrentResult.values,
            )
            .outerjoin(
                CurrentResult,
                (CurrentResult.subscription_id == Subscription.id) & (CurrentResult.key == key),
            )
            .where(Subscription.owner == username, Subscription.state != "deleted")
            .order_by(Subscription.name)
        ).all()
    return [
        KeyResult(r[0], r[1], r[2], r[3], dict(r[4] or {}), r[5] is not None, r[5], as_values(r[6]))
        for r in rows
    ]


def known_keys(sessions: sessionmaker[Session], username: str, limit: int = 500) -> list[str]:
    """Keys that appear in the user's alerts or current results (for the Key detail picker)."""
    with sessions() as s:
        mine = select(Subscription.id).where(Subscription.owner == username).scalar_subquery()
        a = select(Alert.key).where(Alert.subscription_id.in_(mine))
        c = select(CurrentResult.key).where(CurrentResult.subscription_id.in_(mine))
        u = a.union(c).subquery()
        return [str(k) for k in s.scalars(select(u.c.key).order_by(u.c.key).limit(limit))]


# --- health ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Health:
    """Engine status from ``engine_metrics`` / ``engine_batches``."""

    status: str  # "ok" | "behind" | "down" | "unknown"
    banner: str
    last_batch_at: datetime | None
    last_batch_id: int | None
    watermark: datetime | None
    events_per_s: float | None
    batch_ms: float | None
    lag_ms: float | None
    dead_letters_total: int
    dead_letters_recent: int
    series: list[dict[str, Any]]  # recent metric rows, oldest first

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def classify(
    last_at: datetime | None, lag_ms: float | None, now: datetime, settings: Settings
) -> tuple[str, str]:
    """(status, banner) from the time of the last batch and the lag it reported."""
    if last_at is None:
        return "unknown", "The engine has not reported any batch yet: it is not running, or has just started."
    age = (now - last_at).total_seconds()
    if age > settings.engine_down_after_s:
        return (
            "down",
            f"The engine looks down: its last batch was {_ago(age)} ago "
            f"(more than {settings.engine_down_after_s:g} s). Alerts and results are not current.",
        )
    if lag_ms is not None and not math.isnan(lag_ms) and lag_ms > settings.engine_behind_lag_ms:
        return (
            "behind",
            f"The engine is behind: lag {lag_ms / 1000:.1f} s "
            f"(more than {settings.engine_behind_lag_ms / 1000:g} s). Alerts arrive late.",
        )
    return "ok", f"The engine is running: last batch {_ago(age)} ago."


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def health(
    sessions: sessionmaker[Session],
    settings: Settings,
    now: datetime | None = None,
    recent: int = 300,
) -> Health:
    """Engine health: the latest metrics, dead letters, a status and its banner."""
    st = settings
    with sessions() as s:
        db_now = s.scalar(select(func.now()))
        rows = s.execute(select(EngineMetric).order_by(EngineMetric.id.desc()).limit(recent)).scalars().all()
        dl_total = s.scalar(select(func.coalesce(func.sum(EngineMetric.dead_letters), 0)))
        last_batch = s.execute(
            select(EngineBatch.batch_id, EngineBatch.committed_at, EngineBatch.watermark)
            .order_by(EngineBatch.batch_id.desc())
            .limit(1)
        ).first()
    now = now or (db_now if isinstance(db_now, datetime) else datetime.now(UTC))
    latest = rows[0] if rows else None
    last_at = latest.ts if latest is not None else (last_batch[1] if last_batch else None)
    lag = latest.lag_ms if latest is not None else None
    status, banner = classify(last_at, lag, now, st)
    series = [
        {
            "ts": r.ts,
            "batch_id": r.batch_id,
            "events_per_s": r.events_per_s,
            "batch_ms": r.batch_ms,
            "lag_ms": r.lag_ms,
            "dead_letters": r.dead_letters,
            "alerts": r.alerts,
        }
        for r in reversed(rows)
    ]
    return Health(
        status=status,
        banner=banner,
        last_batch_at=last_at,
        last_batch_id=(latest.batch_id if latest is not None else (last_batch[0] if last_batch else None)),
        watermark=last_batch[2] if last_batch else None,
        events_per_s=latest.events_per_s if latest is not None else None,
        batch_ms=latest.batch_ms if latest is not None else None,
        lag_ms=lag,
        dead_letters_total=int(dl_total or 0),
        dead_letters_recent=sum(int(r.dead_letters or 0) for r in rows),
        series=series,
    )
