"""Which subscriptions the logged-in user owns, by id: what the Health view names (an alert
storm's subscription, the degraded ones) and what it shows others only as "another user's
subscription"."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidewatch.db.models import Subscription

__all__ = ["own_names"]


def own_names(s: Session, username: str | None, ids: Iterable[str]) -> dict[str, str]:
    """``{id: name}`` of those of ``ids`` (UUID text; others ignored) that ``username`` owns."""
    uuids = []
    for i in ids:
        try:
            uuids.append(uuid.UUID(i))
        except ValueError:
            continue
    if username is None or not uuids:
        return {}
    rows = s.execute(
        select(Subscription.id, Subscription.name).where(
            Subscription.owner == username, Subscription.id.in_(uuids)
        )
    )
    return {str(r[0]): str(r[1]) for r in rows}
