""" "While you were away": what a returning client missed, and its cursor (PSoup).

PSoup (Chandrasekaran & Franklin 2002, sections 1 and 3) separates *computing* the
results of standing queries from *delivering* them: results are materialized while the
client is gone, and a client that comes back -- closed tab, lost network, next day --
asks for them on its own schedule.  Tidewatch materializes two things for that
(the design brief's "Delivery" semantics; docs/dashboard.md, "While you were away"): the
alert log (``alerts``, every ENTER/EXIT with a stable id and an insertion sequence ``seq``) and
the current result set of each subscription (``current_results``, the keys satisfying the rule
with its window at the engine's now).

Each client keeps a cursor, ``client_cursors.last_alert_seq`` per (user, client).  On
reconnect the client is shown

* every alert of the user's subscriptions with ``cursor < seq <= upto``, grouped by
  subscription with ENTER / EXIT counts, where ``upto`` is the largest such ``seq`` in one
  REPEATABLE READ snapshot (the counts, the lists and the current results are read in
  that same snapshot, so they agree with each other), and
* the current result set of each of its live subscriptions, as of the engine's watermark.

The cursor moves only through :func:`acknowledge`, which the page calls *after* the
panel was rendered, and only forward (``GREATEST``), to the ``upto`` of what was shown:

* nothing missed -- an alert committed after the snapshot has ``seq > upto`` and is in
  the next catch-up;
* nothing shown as new twice -- everything shown has ``seq <= upto <= cursor`` afterwards.

This relies on ``seq`` order being commit order, which holds because the engine driver
is the only writer of ``alerts`` and commits one micro-batch at a time
(:mod:`engine.sinks.store`).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Numeric, cast, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session, sessionmaker

from dashboard.capped import CAPPED
from tidewatch.db.models import Alert, ClientCursor, CurrentResult, EngineBatch, Subscription

#: alerts listed per subscription (the counts are always complete)
PER_GROUP_LIMIT = 50
#: what is shown for an alert or result without recorded values
NO_VALUES = "\u2014"
#: how an aggregate without a value is shown (as ``tidewatch alerts`` shows it)
NULL = "NULL"
#: what :data:`NULL` means, for a page that shows one (docs/rules.md, "NULLs arise only ...")
NULL_MEANS = (
    "NULL: an AVG, MIN, MAX, FIRST or LAST over a window with no events in it, or a division by zero."
)
_MAX_VALUE_ITEMS = 12
_MAX_VALUE_CHARS = 80


def withheld_sum() -> Any:
    """SQL: the sum of the CAPPED records' ``withheld`` counts among the rows aggregated (0 when
    none): the changes the alert cap kept out of the log (:mod:`dashboard.capped`)."""
    withheld = cast(Alert.values["withheld"].astext, Numeric)
    return func.coalesce(func.sum(withheld).filter(Alert.kind == CAPPED), 0)


def as_values(raw: object) -> dict[str, Any]:
    """The ``values`` JSON of an alert / current result as a dict: ``None`` (JSON null) and
    empty arrays or strings are ``{}``; anything else that is not an object is kept under
    ``"value"`` rather than lost."""
    if raw is None or (isinstance(raw, list | tuple | str) and not raw):
        return {}
    if isinstance(raw, dict):
        return {str(k): v for k, v in raw.items()}
    return {"value": raw}


def _format_value(v: object) -> str:
    if v is None:
        return NULL
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.6g}"
    return _clip(v)


def _clip(v: object) -> str:
    """Text on one line, cut to ``_MAX_VALUE_CHARS``."""
    text = " ".join(str(v).splitlines())
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 1] + "\u2026"


def format_values(values: object) -> str:
    """The values that made an alert fire, as one line of plain text, ``aggregate = value`` sorted by
    aggregate; :data:`NO_VALUES` when nothing was recorded.  Numbers are shown compactly (an
    integral float as an integer, others with 6 significant digits); long text and long lists
    of aggregates are cut, so a malformed row cannot blow up the page."""
    items = sorted(as_values(values).items())
    if not items:
        return NO_VALUES
    shown = [f"{_clip(k)} = {_format_value(v)}" for k, v in items[:_MAX_VALUE_ITEMS]]
    if len(items) > _MAX_VALUE_ITEMS:
        shown.append(f"\u2026 ({len(items) - _MAX_VALUE_ITEMS} more)")
    return ", ".join(shown)


@dataclass(frozen=True)
class AlertRow:
    seq: int
    alert_id: str
    subscription_id: uuid.UUID
    subscription: str
    key: str
    kind: str
    as_of: datetime
    values: dict[str, Any]


@dataclass
class AwayGroup:
    """The alerts one subscription produced while the client was away."""

    subscription_id: uuid.UUID
    name: str
    state: str
    enters: int
    exits: int
    alerts: list[AlertRow] = field(default_factory=list)  # newest first, at most PER_GROUP_LIMIT
    #: CAPPED records (lookups whose alerts the cap cut short) and the changes they withheld
    capped: int = 0
    withheld: int = 0

    @property
    def total(self) -> int:
        """Rows of the alert log: ENTERs, EXITs and CAPPED records."""
        return self.enters + self.exits + self.capped


@dataclass(frozen=True)
class ResultRow:
    key: str
    since: datetime
    values: dict[str, Any]


@dataclass
class CurrentSet:
    """A subscription's current result set (keys satisfying it at the engine's now)."""

    subscription_id: uuid.UUID
    name: str
    state: str
    rows: list[ResultRow] = field(default_factory=list)


@dataclass
class Catchup:
    username: str
    client_id: str
    cursor: int
    upto: int
    groups: list[AwayGroup]
    current: list[CurrentSet]
    engine_as_of: datetime | None

    @property
    def total(self) -> int:
        return sum(g.total for g in self.groups)

    @property
    def has_news(self) -> bool:
        return self.upto > self.cursor


def get_cursor(s: Session, username: str, client_id: str) -> int:
    """The client's cursor; a client seen for the first time starts where the user's other
    clients got to (what the user has already seen elsewhere), or at 0."""
    own = s.scalar(
        select(ClientCursor.last_alert_seq).where(
            ClientCursor.username == username, ClientCursor.client_id == client_id
        )
    )
    if own is not None:
        return int(own)
    other = s.scalar(select(func.max(ClientCursor.last_alert_seq)).where(ClientCursor.username == username))
    return int(other or 0)


def catch_up(
    sessions: sessionmaker[Session], username: str, client_id: str, per_group: int = PER_GROUP_LIMIT
) -> Catchup:
    """What ``username``'s client ``client_id`` missed, and the current results (one snapshot)."""
    with sessions() as s:
        s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        cursor = get_cursor(s, username, client_id)
        mine = select(Subscription.id).where(Subscription.owner == username).scalar_subquery()
        upto = s.scalar(
            select(func.max(Alert.seq)).where(Alert.subscription_id.in_(mine), Alert.seq > cursor)
        )
        upto = int(upto) if upto is not None else cursor
        groups: list[AwayGroup] = []
        if upto > cursor:
            counts = s.execute(
                select(
                    Subscription.id,
                    Subscription.name,
                    Subscription.state,
                    func.count().filter(Alert.kind == "ENTER"),
                    func.count().filter(Alert.kind == "EXIT"),
                    func.count().filter(Alert.kind == CAPPED),
                    withheld_sum(),
                )
                .join(Alert, Alert.subscription_id == Subscription.id)
                .where(Subscription.owner == username, Alert.seq > cursor, Alert.seq <= upto)
                .group_by(Subscription.id, Subscription.name, Subscription.state)
                .order_by(Subscription.name, Subscription.id)
            ).all()
            by_id = {
                r[0]: AwayGroup(r[0], r[1], r[2], int(r[3]), int(r[4]), capped=int(r[5]), withheld=int(r[6]))
                for r in counts
            }
            rn = (
                func.row_number()
                .over(partition_by=Alert.subscription_id, order_by=Alert.seq.desc())
                .label("rn")
            )
            ranked = (
                select(Alert, Subscription.name.label("sub_name"), rn)
                .join(Subscription, Subscription.id == Alert.subscription_id)
                .where(Subscription.owner == username, Alert.seq > cursor, Alert.seq <= upto)
                .subquery()
            )
            rows = s.execute(
                select(ranked).where(ranked.c.rn <= per_group).order_by(ranked.c.seq.desc())
            ).mappings()
            for r in rows:
                by_id[r["subscription_id"]].alerts.append(
                    AlertRow(
                        r["seq"],
                        r["alert_id"],
                        r["subscription_id"],
                        r["sub_name"],
                        r["key"],
                        r["kind"],
                        r["as_of"],
                        as_values(r["values"]),
                    )
                )
            groups = list(by_id.values())
        current = current_sets(s, username)
        as_of = s.scalar(select(func.max(EngineBatch.watermark)))
    return Catchup(username, client_id, cursor, upto, groups, current, as_of)


def current_sets(s: Session, username: str) -> list[CurrentSet]:
    """Current result sets of the user's live (active or paused) subscriptions."""
    subs = s.execute(
        select(Subscription.id, Subscription.name, Subscription.state)
        .where(Subscription.owner == username, Subscription.state != "deleted")
        .order_by(Subscription.name, Subscription.id)
    ).all()
    out = {r[0]: CurrentSet(r[0], r[1], r[2]) for r in subs}
    if out:
        rows = s.execute(
            select(
                CurrentResult.subscription_id, CurrentResult.key, CurrentResult.since, CurrentResult.values
            )
            .where(CurrentResult.subscription_id.in_(list(out)))
            .order_by(CurrentResult.subscription_id, CurrentResult.key)
        ).all()
        for sid, key, since, values in rows:
            out[sid].rows.append(ResultRow(key, since, as_values(values)))
    return list(out.values())


def acknowledge(sessions: sessionmaker[Session], username: str, client_id: str, upto: int) -> int:
    """Move the client's cursor forward to ``upto`` (never back); returns the cursor now stored."""
    with sessions.begin() as s:
        stmt = pg_insert(ClientCursor).values(username=username, client_id=client_id, last_alert_seq=upto)
        upsert = stmt.on_conflict_do_update(
            index_elements=[ClientCursor.username, ClientCursor.client_id],
            set_={
                "last_alert_seq": func.greatest(ClientCursor.last_alert_seq, stmt.excluded.last_alert_seq),
                "updated_at": func.now(),
            },
        ).returning(ClientCursor.last_alert_seq)
        return int(s.execute(upsert).scalar_one())


def ensure_cursor(sessions: sessionmaker[Session], username: str, client_id: str) -> int:
    """Create the client's cursor row if missing (at :func:`get_cursor`'s starting point)."""
    with sessions() as s:
        start = get_cursor(s, username, client_id)
    return acknowledge(sessions, username, client_id, start)
