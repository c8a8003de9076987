"""The subscription service: the one way the dashboard and the CLI change subscriptions.

Every operation is scoped to the calling user: a subscription of another user behaves
exactly like one that does not exist (:class:`NotFound`), so nothing about it leaks.
Rule text is compiled with :func:`subscriptions.compiler.compile_rule` before it is stored
(a :class:`~subscriptions.errors.RuleError` reaches the caller with line and column) and is
only ever bound as a parameter, never interpolated into SQL.

Every change (create, update, pause, resume, delete) bumps the subscription's ``version``
and writes, in the same transaction, a row of ``subscription_versions`` (history) and a
row of ``outbox`` carrying the new state; :mod:`subscriptions.outbox` publishes it to the
compacted ``subscriptions`` topic, keyed by subscription id.  A change that does not
change anything (pausing a paused subscription) writes nothing.

A subscription may have a staleness budget (:mod:`subscriptions.budget`; none by default):
set with :meth:`SubscriptionService.create` or set, changed or cleared with
:meth:`SubscriptionService.update` -- a change of the budget alone is a new version like any
other -- and refused with :class:`~subscriptions.errors.InvalidBudget` outside its range.
"""

from __future__ import annotations

import builtins
import enum
import functools
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from subscriptions.budget import check_budget
from subscriptions.errors import InvalidBudget, RuleError, SubscriptionError
from tidewatch.db.models import Outbox, Subscription, SubscriptionVersion, User
from tidewatch.db.session import session_factory
from tidewatch.settings import Settings

__all__ = [
    "UNCHANGED",
    "InvalidBudget",
    "InvalidName",
    "NameTaken",
    "NotFound",
    "RuleError",
    "SubscriptionError",
    "SubscriptionService",
    "SubscriptionView",
    "change_message",
]

USERNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
NAME_MAX = 128
MESSAGE_SCHEMA = 1


class _Unchanged(enum.Enum):
    UNCHANGED = "unchanged"


#: :meth:`SubscriptionService.update`'s default for the budget: keep it as it is (None clears it)
UNCHANGED = _Unchanged.UNCHANGED


class NotFound(SubscriptionError):
    """No such subscription for this user (it may exist for someone else: we do not say)."""


class NameTaken(SubscriptionError):
    """The user already has a live subscription with that name."""


class InvalidName(SubscriptionError):
    """A user name or subscription name that is not acceptable."""


@dataclass(frozen=True)
class SubscriptionView:
    """A subscription as the service hands it out (detached from any session)."""

    id: uuid.UUID
    owner: str
    name: str
    rule_text: str
    plan: dict[str, Any]
    state: str
    version: int
    created_at: datetime
    updated_at: datetime
    #: how far apart (ms) the engine may space its lookups when overloaded; None: never
    staleness_budget_ms: int | None = None

    @classmethod
    def of(cls, sub: Subscription) -> SubscriptionView:
        return cls(
            id=sub.id,
            owner=sub.owner,
            name=sub.name,
            rule_text=sub.rule_text,
            plan=dict(sub.plan),
            state=sub.state,
            version=sub.version,
            created_at=sub.created_at,
            updated_at=sub.updated_at,
            staleness_budget_ms=sub.staleness_budget_ms,
        )


def change_message(sub: Subscription, change: str, changed_at: datetime) -> dict[str, Any]:
    """The value published to the ``subscriptions`` topic for one change (JSON).

    It carries the whole new state, so the latest record per key (what compaction keeps)
    is enough to rebuild the subscription set; ``version`` lets a consumer drop a replay
    (apply only when ``version`` > the version it holds for ``subscription_id``).
    """
    return {
        "schema": MESSAGE_SCHEMA,
        "subscription_id": str(sub.id),
        "owner": sub.owner,
        "name": sub.name,
        "rule_text": sub.rule_text,
        "plan": sub.plan,
        "state": sub.state,
        "version": sub.version,
        "staleness_budget_ms": sub.staleness_budget_ms,
        "change": change,
        "changed_at": changed_at.isoformat(),
        # the fields engine.messages.parse_subscription_change reads
        "op": _OPS[sub.state],
        "status": sub.state,
        "rule": sub.rule_text,
    }


#: subscription state -> the engine's operation
_OPS = {"active": "upsert", "paused": "pause", "deleted": "delete"}


def _default_compile(text: str, settings: Settings) -> dict[str, Any]:
    from subscriptions.compiler import compile_rule

    plan = compile_rule(text, settings)
    data = plan.to_json()
    return data if isinstance(data, dict) else {"plan": data}


def check_username(username: str) -> str:
    if not isinstance(username, str) or not USERNAME_RE.match(username):
        raise InvalidName(
            "a user name is 1-64 characters: letters, digits and _ . @ - (starting with a letter or digit)"
        )
    return username


def _check_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > NAME_MAX or any(not c.isprintable() for c in name):
        raise InvalidName(f"a subscription name is 1-{NAME_MAX} printable characters")
    return name


class SubscriptionService:
    """Create, update, pause, resume, delete, list and get subscriptions for a user."""

    def __init__(
        self,
        sessions: sessionmaker[Session] | None = None,
        *,
        settings: Settings,
        url: str | None = None,
        topic: str | None = None,
        compile_rule: Callable[[str], dict[str, Any]] | None = None,
    ) -> None:
        self.settings = settings
        self._sessions = sessions or session_factory(url or settings.sqlalchemy_url)
        self.topic = topic or settings.topic_subscriptions
        #: rule text -> its JSON plan (default: :func:`subscriptions.compiler.compile_rule` under
        #: the settings' rule limits)
        self._compile = compile_rule or functools.partial(_default_compile, settings=settings)

    @property
    def sessions(self) -> sessionmaker[Session]:
        """The session factory of the service's database (e.g. for creating the demo account
        with :func:`dashboard.auth.sign_up` next to the service's subscriptions)."""
        return self._sessions

    # --- users --------------------------------------------------------------------------------

    def ensure_user(self, username: str) -> None:
        """Create ``username`` (without a password) if it does not exist; for the CLI."""
        check_username(username)
        with self._sessions.begin() as s:
            s.execute(
                pg_insert(User)
                .values(username=username, password_hash=None)
                .on_conflict_do_nothing(index_elements=[User.username])
            )

    # --- reads --------------------------------------------------------------------------------

    def list(self, user: str, *, include_deleted: bool = False) -> list[SubscriptionView]:
        """The user's subscriptions, oldest first."""
        check_username(user)
        with self._sessions() as s:
            q = select(Subscription).where(Subscription.owner == user)
            if not include_deleted:
                q = q.where(Subscription.state != "deleted")
            q = q.order_by(Subscription.created_at, Subscription.name)
            return [SubscriptionView.of(x) for x in s.scalars(q)]

    def get(self, user: str, ref: str | uuid.UUID) -> SubscriptionView:
        """One of the user's live subscriptions, by id or by name."""
        with self._sessions() as s:
            return SubscriptionView.of(self._find(s, user, ref, lock=False))

    def history(self, user: str, ref: str | uuid.UUID) -> builtins.list[dict[str, Any]]:
        """Every version of one of the user's subscriptions, oldest first."""
        with self._sessions() as s:
            sub = self._find(s, user, ref, lock=False, include_deleted=True)
            rows = s.scalars(
                select(SubscriptionVersion)
                .where(SubscriptionVersion.subscription_id == sub.id)
                .order_by(SubscriptionVersion.version)
            )
            return [
                {
                    "version": r.version,
                    "change": r.change,
                    "name": r.name,
                    "state": r.state,
                    "rule_text": r.rule_text,
                    "staleness_budget_ms": r.staleness_budget_ms,
                    "changed_at": r.changed_at,
                }
                for r in rows
            ]

    # --- changes ------------------------------------------------------------------------------

    def create(
        self,
        user: str,
        rule_text: str,
        name: str | None = None,
        *,
        staleness_budget_ms: int | None = None,
    ) -> SubscriptionView:
        """Compile ``rule_text`` and store it as a new active subscription of ``user``, with a
        staleness budget (ms) when given (:func:`subscriptions.budget.check_budget`)."""
        check_username(user)
        budget = check_budget(staleness_budget_ms, self.settings)
        plan = self._compile_checked(rule_text)
        sub_id = uuid.uuid4()
        name = _check_name(name) if name is not None else f"rule-{sub_id.hex[:8]}"
        with self._sessions.begin() as s:
            if s.scalar(select(User.id).where(User.username == user)) is None:
                raise NotFound(f"no user {user!r}")
            now = self._now(s)
            sub = Subscription(
                id=sub_id,
                owner=user,
                name=name,
                rule_text=rule_text,
                plan=plan,
                state="active",
                version=1,
                staleness_budget_ms=budget,
                created_at=now,
                updated_at=now,
            )
            s.add(sub)
            try:
                s.flush()
            except IntegrityError as exc:
                raise NameTaken(f"you already have a subscription named {name!r}") from exc
            self._record(s, sub, "create", user, now)
            return SubscriptionView.of(sub)

    def update(
        self,
        user: str,
        ref: str | uuid.UUID,
        *,
        rule_text: str | None = None,
        name: str | None = None,
        staleness_budget_ms: int | None | _Unchanged = UNCHANGED,
    ) -> SubscriptionView:
        """Change the rule, the name and/or the staleness budget (ms; None clears it, the
        default :data:`UNCHANGED` keeps it) of one of the user's subscriptions; nothing is
        written when nothing changes."""
        budget = (
            staleness_budget_ms
            if isinstance(staleness_budget_ms, _Unchanged)
            else check_budget(staleness_budget_ms, self.settings)
        )
        plan = self._compile_checked(rule_text) if rule_text is not None else None
        new_name = _check_name(name) if name is not None else None
        with self._sessions.begin() as s:
            sub = self._find(s, user, ref, lock=True)
            if (
                (rule_text is None or rule_text == sub.rule_text)
                and (new_name is None or new_name == sub.name)
                and (budget is UNCHANGED or budget == sub.staleness_budget_ms)
            ):
                return SubscriptionView.of(sub)
            if rule_text is not None and plan is not None:
                sub.rule_text, sub.plan = rule_text, plan
            if new_name is not None:
                sub.name = new_name
            if not isinstance(budget, _Unchanged):
                sub.staleness_budget_ms = budget
            try:
                return self._bump(s, sub, "update", user)
            except IntegrityError as exc:
                raise NameTaken(f"you already have a subscription named {new_name!r}") from exc

    def pause(self, user: str, ref: str | uuid.UUID) -> SubscriptionView:
        """Stop evaluating a subscription (its results are kept); no-op when paused."""
        return self._set_state(user, ref, "paused", "pause")

    def resume(self, user: str, ref: str | uuid.UUID) -> SubscriptionView:
        """Evaluate a paused subscription again; no-op when active."""
        return self._set_state(user, ref, "active", "resume")

    def delete(self, user: str, ref: str | uuid.UUID) -> SubscriptionView:
        """Delete a subscription (kept as history; its name becomes free again)."""
        return self._set_state(user, ref, "deleted", "delete")

    # --- internals ----------------------------------------------------------------------------

    def _compile_checked(self, rule_text: str) -> dict[str, Any]:
        if not isinstance(rule_text, str) or not rule_text.strip():
            raise RuleError("the rule is empty", 1, 1, "", ["SELECT"])
        if len(rule_text) > self.settings.max_rule_chars:
            raise RuleError(
                f"the rule is {len(rule_text)} characters long; the limit is {self.settings.max_rule_chars}",
                1,
                1,
                rule_text.splitlines()[0][:80] if rule_text.splitlines() else "",
            )
        return self._compile(rule_text)

    def _find(
        self, s: Session, user: str, ref: str | uuid.UUID, *, lock: bool, include_deleted: bool = False
    ) -> Subscription:
        check_username(user)
        q = select(Subscription).where(Subscription.owner == user)
        if not include_deleted:
            q = q.where(Subscription.state != "deleted")
        sub_id = _as_uuid(ref)
        if sub_id is not None:
            q = q.where(Subscription.id == sub_id)
        else:
            q = q.where(Subscription.name == str(ref)).order_by(Subscription.updated_at.desc()).limit(1)
        if lock:
            q = q.with_for_update()
        sub = s.scalars(q).first()
        if sub is None:
            raise NotFound(f"you have no subscription {str(ref)!r}")
        return sub

    def _set_state(self, user: str, ref: str | uuid.UUID, state: str, change: str) -> SubscriptionView:
        with self._sessions.begin() as s:
            sub = self._find(s, user, ref, lock=True)
            if sub.state == state:
                return SubscriptionView.of(sub)
            sub.state = state
            return self._bump(s, sub, change, user)

    def _bump(self, s: Session, sub: Subscription, change: str, user: str) -> SubscriptionView:
        now = self._now(s)
        sub.version += 1
        sub.updated_at = now
        s.flush()
        self._record(s, sub, change, user, now)
        return SubscriptionView.of(sub)

    def _record(self, s: Session, sub: Subscription, change: str, user: str, now: datetime) -> None:
        """History row and outbox row for the change, in the caller's transaction."""
        s.add(
            SubscriptionVersion(
                subscription_id=sub.id,
                version=sub.version,
                change=change,
                name=sub.name,
                rule_text=sub.rule_text,
                plan=sub.plan,
                state=sub.state,
                staleness_budget_ms=sub.staleness_budget_ms,
                changed_by=user,
                changed_at=now,
            )
        )
        s.add(Outbox(topic=self.topic, key=str(sub.id), payload=change_message(sub, change, now)))
        s.flush()

    @staticmethod
    def _now(s: Session) -> datetime:
        """The database's transaction time (one clock for every writer)."""
        from sqlalchemy import func

        value = s.scalar(select(func.now()))
        return value if isinstance(value, datetime) else datetime.now(UTC)


def _as_uuid(ref: str | uuid.UUID) -> uuid.UUID | None:
    if isinstance(ref, uuid.UUID):
        return ref
    try:
        return uuid.UUID(str(ref))
    except ValueError:
        return None
