"""Degraded subscriptions: those whose lookups the engine spaces out under overload, for Health.

When input outruns the engine, its overload policy keeps every event exact but looks the
subscriptions that have a staleness budget (:mod:`subscriptions.budget`) up less often --
loosest budget first, never more than the budget apart -- and says so with each batch's
``engine_metrics.degraded``: ``{subscription id: {"every_ms": spacing of its lookups,
"budget_ms": its budget}}`` (``{}``: none degraded).

The Health view lists the subscriptions of the newest batch's ``degraded``, each with its spacing
against its budget and *since when*: the commit time of the first batch of the unbroken run of
batches, up to the newest, that hold it (:func:`runs`, walked back from the newest batch and
stopped as soon as no run is still open, so a short run reads a few rows).  A run longer than
:data:`LOOKBACK_S` is cut there and said so ("or earlier").  As with the alert-storm warning
(:mod:`dashboard.storm`), a subscription is named only to its owner; the others see "another
user's subscription" and its short id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from dashboard.owners import own_names
from dashboard.storm import short_id
from dashboard.timefmt import utc_text
from subscriptions.budget import budget_text
from tidewatch.db.models import EngineMetric

__all__ = ["LOOKBACK_S", "Degraded", "Degradation", "read", "runs"]

#: how far back (seconds before the newest batch) the start of a run is looked for
LOOKBACK_S = 3600.0


@dataclass(frozen=True)
class Degraded:
    """One subscription the newest batch looked up less often than every lookup time."""

    subscription_id: str
    #: the spacing of its lookups and its budget (ms; None when the engine wrote no number)
    every_ms: float | None
    budget_ms: float | None
    #: commit time of the first batch of its run (the newest batch's when it is the only one)
    since: datetime
    #: the run reaches back past :data:`LOOKBACK_S`: it started at ``since`` or earlier
    since_earlier: bool = False
    #: its name, when the logged-in user owns it (set by :func:`read`)
    name: str | None = None

    @property
    def load(self) -> float:
        """How much of its budget the spacing uses (0 when unknown): the tightest first."""
        if not self.every_ms or not self.budget_ms:
            return 0.0
        return float(self.every_ms) / float(self.budget_ms)

    def text(self, name: str | None) -> str:
        """One line for Health: ``'volume' (1a2b3c4d): looked up every 8 s of its 30 s budget,
        since 2026-11-27 12:00:00 UTC`` (``name``: its name for its owner, None for another
        user's subscription; plain text, to be made safe for Markdown by the caller)."""
        who = f"'{name}'" if name is not None else "another user's subscription"
        if self.every_ms is not None and self.budget_ms is not None:
            how = f"looked up every {budget_text(self.every_ms)} of its {budget_text(self.budget_ms)} budget"
        elif self.budget_ms is not None:
            how = f"looked up less often, within its {budget_text(self.budget_ms)} budget"
        else:
            how = "looked up less often"
        since = utc_text(self.since) + (" or earlier" if self.since_earlier else "")
        return f"{who} ({short_id(self.subscription_id)}): {how}, since {since}"


@dataclass(frozen=True)
class Degradation:
    """The degraded subscriptions of the newest batch (``as_of``: its commit time; None: no
    batch), the user's own first, then the tightest spacing against its budget first."""

    as_of: datetime | None
    items: tuple[Degraded, ...] = ()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value > 0 else None


def runs(rows: Iterable[tuple[datetime, Any]]) -> tuple[list[Degraded], bool]:
    """The newest batch's degraded subscriptions with the start of their runs, from batches
    ``(commit time, degraded)`` **newest first**; and whether a run was still open at the last
    row read (its start may be earlier).  Reading stops at the first batch after which no run
    is open.  Entries that are not objects are taken as ``{}`` (spacing and budget unknown)."""
    it = iter(rows)
    first = next(it, None)
    if first is None or not isinstance(first[1], Mapping) or not first[1]:
        return [], False
    newest: dict[str, Any] = {str(k): v for k, v in first[1].items()}
    since = dict.fromkeys(newest, first[0])
    open_ = set(newest)
    for ts, degraded in it:
        keys = {str(k) for k in degraded} if isinstance(degraded, Mapping) else set()
        open_ &= keys
        if not open_:
            break
        for sid in open_:
            since[sid] = ts
    out = []
    for sid, entry in newest.items():
        e = entry if isinstance(entry, Mapping) else {}
        out.append(
            Degraded(sid, _number(e.get("every_ms")), _number(e.get("budget_ms")), since[sid], sid in open_)
        )
    return out, bool(open_)


def read(s: Session, username: str | None, lookback_s: float = LOOKBACK_S) -> Degradation:
    """The newest batch's degraded subscriptions (see the module docstring), named for
    ``username`` where it owns them."""
    newest = s.scalar(select(func.max(EngineMetric.ts)))
    if newest is None:
        return Degradation(None)
    cutoff = newest - timedelta(seconds=lookback_s)
    rows = s.execute(
        select(EngineMetric.ts, EngineMetric.degraded)
        .where(EngineMetric.ts >= cutoff)
        .order_by(EngineMetric.ts.desc(), EngineMetric.id.desc())
        .execution_options(yield_per=200)
    )
    items, still_open = runs((r[0], r[1]) for r in rows)
    rows.close()
    if still_open and not s.scalar(select(exists().where(EngineMetric.ts < cutoff))):
        # the runs reach the first batch there is: their start is exact
        items = [replace(d, since_earlier=False) for d in items]
    names = own_names(s, username, [d.subscription_id for d in items])
    items = [replace(d, name=names.get(d.subscription_id)) for d in items]
    items.sort(key=lambda d: (d.name is None, -d.load, d.subscription_id))
    return Degradation(newest, tuple(items))
