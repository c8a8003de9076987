"""Read-only queries of the dashboard, every one scoped to the logged-in user.

Ownership is enforced in SQL: alerts and current results are reached only through a join
on ``subscriptions.owner = :username`` -- an id of another user's subscription passed as a
filter simply matches nothing.  All values are bound parameters; the key filter escapes
``LIKE`` wildcards, so ``%`` or ``_`` in it match themselves.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from dashboard import degraded, per_engine, spans, storm
from dashboard.capped import CAPPED
from dashboard.catchup import AlertRow, as_values, withheld_sum
from dashboard.driver_load import DriverLoad, driver_loads
from dashboard.owners import own_names
from engine import liveness
from tidewatch.db.models import Alert, CurrentResult, EngineBatch, EngineMetric, Subscription
from tidewatch.settings import Settings

MAX_LIMIT = 5000


def escape_like(text: str) -> str:
    """``text`` as a LIKE pattern matching itself (escape character ``\\``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _filtered(
    q: Any,
    username: str,
    *,
    subscription_ids: Sequence[uuid.UUID] | None = None,
    key: str | None = None,
    exact_key: bool = False,
    kinds: Sequence[str] | None = None,
    after_seq: int | None = None,
    upto_seq: int | None = None,
) -> Any:
    """``q`` (a select that joins ``alerts`` to ``subscriptions``) restricted to the user's
    alerts matching the filters: subscription, key (substring, or exact), kind, and
    ``after_seq < seq <= upto_seq``."""
    q = q.where(Subscription.owner == username)
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
    if upto_seq is not None:
        q = q.where(Alert.seq <= upto_seq)
    return q


def alerts(
    sessions: sessionmaker[Session],
    username: str,
    *,
    limit: int = 200,
    **filters: Any,
) -> list[AlertRow]:
    """The user's alerts, newest first, filtered as :func:`_filtered` says (keyword arguments
    ``subscription_ids``, ``key``, ``exact_key``, ``kinds``, ``after_seq``, ``upto_seq``)."""
    q = select(Alert, Subscription.name).join(Subscription, Subscription.id == Alert.subscription_id)
    q = _filtered(q, username, **filters)
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


# --- summaries (aggregated in SQL) --------------------------------------------------------------


@dataclass(frozen=True)
class SubscriptionSummary:
    """One subscription's alerts under a filter: how many keys entered and left its result."""

    subscription_id: uuid.UUID
    name: str
    state: str
    entered: int
    left: int
    keys: int  # distinct keys among those alerts
    first: datetime | None
    last: datetime | None
    #: changes the alert cap withheld from the log (the CAPPED records' counts; dashboard.capped)
    withheld: int = 0

    @property
    def total(self) -> int:
        return self.entered + self.left


def summary_by_subscription(
    sessions: sessionmaker[Session], username: str, **filters: Any
) -> list[SubscriptionSummary]:
    """Per subscription with at least one alert under ``filters`` (those of :func:`alerts`):
    ENTER / EXIT counts, distinct keys, first and last alert time; most alerts first.  One
    ``GROUP BY`` in PostgreSQL."""
    enters = func.count().filter(Alert.kind == "ENTER")
    exits = func.count().filter(Alert.kind == "EXIT")
    q = select(
        Subscription.id,
        Subscription.name,
        Subscription.state,
        enters,
        exits,
        func.count(func.distinct(Alert.key)).filter(Alert.kind != CAPPED),
        func.min(Alert.as_of),
        func.max(Alert.as_of),
        withheld_sum(),
    ).join(Alert, Alert.subscription_id == Subscription.id)
    q = _filtered(q, username, **filters)
    q = q.group_by(Subscription.id, Subscription.name, Subscription.state).order_by(
        func.count().desc(), Subscription.name, Subscription.id
    )
    with sessions() as s:
        return [
            SubscriptionSummary(r[0], r[1], r[2], int(r[3]), int(r[4]), int(r[5]), r[6], r[7], int(r[8]))
            for r in s.execute(q).all()
        ]


@dataclass(frozen=True)
class KeyActivity:
    """A key's alerts in one subscription under a filter (the busiest keys)."""

    key: str
    subscription: str
    entered: int
    left: int
    last: datetime

    @property
    def total(self) -> int:
        return self.entered + self.left


def busiest_keys(
    sessions: sessionmaker[Session], username: str, *, limit: int = 10, **filters: Any
) -> list[KeyActivity]:
    """The ``limit`` (key, subscription) pairs with the most alerts under ``filters``; ties by
    the newest alert, then key."""
    total = func.count()
    q = select(
        Alert.key,
        Subscription.name,
        func.count().filter(Alert.kind == "ENTER"),
        func.count().filter(Alert.kind == "EXIT"),
        func.max(Alert.as_of),
    ).join(Subscription, Subscription.id == Alert.subscription_id)
    q = _filtered(q, username, **filters).where(Alert.kind != CAPPED)  # a CAPPED record is no key's
    q = (
        q.group_by(Alert.key, Subscription.id, Subscription.name)
        .order_by(total.desc(), func.max(Alert.as_of).desc(), Alert.key)
        .limit(max(1, min(int(limit), MAX_LIMIT)))
    )
    with sessions() as s:
        return [KeyActivity(r[0], r[1], int(r[2]), int(r[3]), r[4]) for r in s.execute(q).all()]


#: widths the alert-rate chart buckets by, seconds (the smallest giving at most ``max_buckets``)
BUCKETS_S = (1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400, 7 * 86400)


def bucket_seconds(span_s: float, max_buckets: int = 60) -> int:
    """The smallest width of :data:`BUCKETS_S` that cuts ``span_s`` into at most ``max_buckets``."""
    for b in BUCKETS_S:
        if span_s / b <= max_buckets:
            return b
    return BUCKETS_S[-1]


@dataclass(frozen=True)
class AlertRate:
    """Alerts per bucket of ``bucket_s`` seconds and kind: ``rows`` of (bucket start, kind, count),
    oldest first; buckets without alerts are absent."""

    bucket_s: int
    rows: list[tuple[datetime, str, int]]


def alert_rate(
    sessions: sessionmaker[Session], username: str, *, max_buckets: int = 60, **filters: Any
) -> AlertRate:
    """How many alerts per time bucket (by ``as_of``, UTC) and kind, under ``filters``; the bucket
    width is chosen from the alerts' time span (:func:`bucket_seconds`).  Two queries, both
    aggregated in PostgreSQL."""
    base = select(func.min(Alert.as_of), func.max(Alert.as_of)).join(
        Subscription, Subscription.id == Alert.subscription_id
    )
    with sessions() as s:
        lo, hi = s.execute(_filtered(base, username, **filters)).one()
        if lo is None or hi is None:
            return AlertRate(1, [])
        b = bucket_seconds((hi - lo).total_seconds(), max_buckets)
        start = func.floor(func.extract("epoch", Alert.as_of) / b) * b
        q = select(start.label("b"), Alert.kind, func.count()).join(
            Subscription, Subscription.id == Alert.subscription_id
        )
        q = _filtered(q, username, **filters).group_by("b", Alert.kind).order_by("b", Alert.kind)
        rows = [(datetime.fromtimestamp(float(r[0]), UTC), str(r[1]), int(r[2])) for r in s.execute(q).all()]
    return AlertRate(b, rows)


def live_subscriptions(sessions: sessionmaker[Session], username: str) -> int:
    """How many subscriptions (active or paused) the user has."""
    with sessions() as s:
        v = s.scalar(
            select(func.count())
            .select_from(Subscription)
            .where(Subscription.owner == username, Subscription.state != "deleted")
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
        a = select(Alert.key).where(Alert.subscription_id.in_(mine), Alert.kind != CAPPED)
        c = select(CurrentResult.key).where(CurrentResult.subscription_id.in_(mine))
        u = a.union(c).subquery()
        return [str(k) for k in s.scalars(select(u.c.key).order_by(u.c.key).limit(limit))]


# --- health ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Health:
    """Engine status from ``engine_metrics`` / ``engine_batches`` and the engine's run record.

    ``events_per_s`` is the *input* rate: events per wall-clock second over the last
    :data:`RATE_WINDOW_S` of committed batches (:func:`input_rate`), what the feeds deliver.
    ``capacity_per_s`` is the newest batch's events over its evaluation time: how fast the
    engine could go, not how fast events arrive; with several engines on the database (each its
    ``--engine-id``), the sum of each one's newest batch of the last :data:`RATE_WINDOW_S`.
    ``lag_ms``, ``batch_ms``, ``delivery_ms`` and ``last_batch_at`` are the newest batch's; with
    several engines (``engines``, each one's newest row), the worst of their newest batches: the
    largest lag, batch time and delivery, and the batch of the engine that committed least
    recently (:func:`dashboard.per_engine.worst`).
    ``status`` and ``banner`` (its cause and hint) come from :func:`engine.liveness.judge` (the
    rule of :func:`engine.liveness.verdict`, per engine when there are several), which
    ``tidewatch status`` uses too.

    ``alerts_per_s`` is the alerts the engine committed per wall-clock second over the same
    window (:func:`dashboard.storm.rate_per_s`, from ``engine_metrics``); ``storm`` is set when
    that rate is far above usual (:func:`dashboard.storm.detect`: the rule, the subscription
    behind it -- named only when the user owns it), ``storm_rule`` says the rule in words.
    ``degraded``: the subscriptions the newest batch looked up less often under overload
    (:mod:`dashboard.degraded`; staleness budgets), named only for their owner."""

    status: str  # "ok" | "behind" | "starting" | "down" | "unknown"
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
    #: ranges of Kafka offsets deleted by retention before the engine read them (dead letters
    #: with reason ``lost``, all time): data the alerts could not see
    lost_ranges: int = 0
    capacity_per_s: float | None = None
    cause: str = ""
    hint: str = ""
    #: times the engine was started again after it failed or was killed (its run record)
    restarts: int = 0
    alerts_per_s: float | None = None
    storm: storm.Storm | None = None
    storm_rule: str = ""
    degraded: degraded.Degradation = degraded.Degradation(None)
    #: the newest delivery's ms (both commits) and its alert log's expansion behind it (0012)
    delivery_ms: float | None = None
    expansion_ms: float | None = None
    #: each engine's driver CPU over the last :data:`RATE_WINDOW_S` of batches, busiest first: its
    #: share of a core and where it saturates one (:mod:`dashboard.driver_load`; an engine
    #: without two figures is not in it, 0013)
    drivers: dict[str, DriverLoad] = field(default_factory=dict)
    #: with several engines on the database, each one's newest row (engines in the order of their
    #: ids); the figures above are then the worst of them (:func:`dashboard.per_engine.worst`)
    engines: tuple[per_engine.Newest, ...] = ()

    @property
    def lost_banner(self) -> str | None:
        if not self.lost_ranges:
            return None
        return (
            f"Kafka deleted records before the engine read them ({self.lost_ranges:,} range(s) of "
            "offsets, by the topic's retention): alerts over that time may be missing. The dead-letter "
            "topic has each range (reason 'lost'); raise the topics' retention or keep the engine "
            "running."
        )

    @property
    def ok(self) -> bool:
        return self.status == "ok"


#: span of committed batches the input and alert rates are measured over (seconds before the
#: newest one): the storm rule's window
RATE_WINDOW_S = storm.WINDOW_S
#: span of the Health charts (seconds before the newest metric row): the batches of an earlier
#: run of the engine, hours before, would squeeze the current one into a sliver of the axis
SERIES_WINDOW_S = 15 * 60


def input_rate(
    times_s: Sequence[float], events: Sequence[float], window_s: float = RATE_WINDOW_S
) -> float | None:
    """Events per wall-clock second from batches committed at ``times_s`` (any order) holding
    ``events``: the batches of the last ``window_s`` before the newest one, the oldest of them
    the start of the span (its events arrived before it, so they are not counted), the rest's
    events over the span.  None with fewer than two batches in the window (no span)."""
    rows = spans.recent(times_s, window_s)
    if len(rows) < 2:
        return None
    t = np.asarray(times_s, dtype=np.float64)[rows]
    span = float(t[-1] - t[0])
    if span <= 0:
        return None
    return float(np.nan_to_num(np.asarray(events, dtype=np.float64)[rows[1:]]).sum() / span)


def classify(
    last_at: datetime | None,
    lags_ms: Sequence[float | None],
    now: datetime,
    settings: Settings,
    record: liveness.RunRecord | None = None,
) -> tuple[str, str]:
    """(status, banner) by :func:`engine.liveness.verdict` (the lag series oldest first)."""
    v = liveness.verdict(liveness.Observed(last_at, list(lags_ms), now), settings, record)
    return v.status, v.text


def health(
    sessions: sessionmaker[Session],
    settings: Settings,
    now: datetime | None = None,
    recent: int = 300,
    username: str | None = None,
) -> Health:
    """Engine health: the latest metrics, input and alert rates, dead letters, a status and its
    banner, and an alert storm if there is one (:mod:`dashboard.storm`: the batches of the last
    ``WINDOW_S + BASELINE_S`` seconds of ``engine_metrics``), its subscription named when
    ``username`` owns it."""
    st = settings
    with sessions() as s:
        at, recent_by_engine = liveness.recent_engine_rows(s)
        engines = liveness.observed(at, recent_by_engine)
        newest = [_newest(r[-1]) for r in recent_by_engine.values()]
        rows = s.execute(select(EngineMetric).order_by(EngineMetric.id.desc()).limit(recent)).scalars().all()
        dl_total = s.scalar(select(func.coalesce(func.sum(EngineMetric.dead_letters), 0)))
        lost = s.scalar(
            select(func.coalesce(func.sum(EngineMetric.dead_letter_reasons["lost"].as_integer()), 0))
        )
        last_batch = s.execute(
            select(EngineBatch.batch_id, EngineBatch.committed_at, EngineBatch.watermark)
            .order_by(EngineBatch.committed_at.desc())
            .limit(1)
        ).first()
        since = select(func.max(EngineBatch.committed_at)).scalar_subquery() - timedelta(
            seconds=RATE_WINDOW_S
        )
        recent_batches = s.execute(
            select(func.extract("epoch", EngineBatch.committed_at), EngineBatch.events).where(
                EngineBatch.committed_at >= since
            )
        ).all()
        storm_since = select(func.max(EngineMetric.ts)).scalar_subquery() - timedelta(
            seconds=storm.WINDOW_S + storm.BASELINE_S
        )
        alert_rows = s.execute(
            select(
                func.extract("epoch", EngineMetric.ts), EngineMetric.alerts, EngineMetric.top_alerts
            ).where(EngineMetric.ts >= storm_since)
        ).all()
        times = [float(r[0]) for r in alert_rows]
        found = storm.detect(
            times,
            [r[1] for r in alert_rows],
            [r[2] for r in alert_rows],
            factor=st.storm_factor,
            floor_per_s=st.storm_min_alerts_per_s,
        )
        if found is not None and found.subscription_id is not None and username is not None:
            sid = found.subscription_id
            found = replace(found, subscription_name=own_names(s, username, [sid]).get(sid))
        spaced = degraded.read(s, username)
    # the rows read above, not a third read of engine_metrics
    obs = liveness.overall(now or at, rows, last_batch.committed_at if last_batch else None)
    records = liveness.read_records(st)
    record = liveness.newest_record(records)
    verdict = liveness.judge(obs, engines, st, records)
    latest = rows[0] if rows else None
    top = per_engine.worst(newest)
    shown = [r for r in reversed(rows) if r.ts >= rows[0].ts - timedelta(seconds=SERIES_WINDOW_S)]
    shown_at = [r.ts.timestamp() for r in shown]
    shown_by_engine = per_engine.groups([r.engine_id for r in shown])
    shown_gaps = per_engine.since_row_before(shown_at, shown_by_engine)
    series = [
        {
            "ts": r.ts,
            "engine": r.engine_id,
            "batch_id": r.batch_id,
            "events_per_s": r.events_per_s,
            "batch_ms": r.batch_ms,
            "lag_ms": r.lag_ms,
            "dead_letters": r.dead_letters,
            "alerts": r.alerts,
            "alerts_per_s": per_s,
            "run": run,
        }
        for r, per_s, run in zip(
            shown,
            _per_batch_rate(shown, shown_gaps),
            per_engine.runs(shown_gaps, shown_by_engine, st.engine_down_after_s),
            strict=True,
        )
    ]
    return Health(
        status=verdict.status,
        banner=verdict.text,
        last_batch_at=top.at if len(newest) > 1 and top is not None else obs.last_at,
        last_batch_id=(latest.batch_id if latest is not None else (last_batch[0] if last_batch else None)),
        watermark=last_batch[2] if last_batch else None,
        events_per_s=input_rate([float(r[0]) for r in recent_batches], [r[1] or 0 for r in recent_batches]),
        batch_ms=top.batch_ms if top is not None else None,
        lag_ms=top.lag_ms if top is not None else None,
        delivery_ms=top.delivery_ms if top is not None else None,
        expansion_ms=top.expansion_ms if top is not None else None,
        dead_letters_total=int(dl_total or 0),
        dead_letters_recent=sum(int(r.dead_letters or 0) for r in rows),
        series=series,
        lost_ranges=int(lost or 0),
        capacity_per_s=per_engine.capacity(newest, RATE_WINDOW_S),
        cause=verdict.cause,
        hint=verdict.hint,
        restarts=record.restarts if record is not None else 0,
        alerts_per_s=storm.rate_per_s(times, [r[1] or 0 for r in alert_rows], RATE_WINDOW_S),
        storm=found,
        storm_rule=storm.rule_text(st.storm_factor, st.storm_min_alerts_per_s),
        degraded=spaced,
        drivers=driver_loads(
            [r.engine_id for r in rows],
            [r.ts.timestamp() for r in rows],
            [r.driver_cpu_ms for r in rows],
            [_events(r) for r in rows],
            RATE_WINDOW_S,
        ),
        engines=tuple(newest) if len(newest) > 1 else (),
    )


def _newest(r: EngineMetric) -> per_engine.Newest:
    """An engine's newest metric row as the Health view's top figures read it."""
    return per_engine.Newest(
        engine=r.engine_id,
        at=r.ts,
        lag_ms=r.lag_ms,
        batch_ms=r.batch_ms,
        delivery_ms=r.delivery_ms,
        expansion_ms=r.expansion_ms,
        events_per_s=r.events_per_s,
    )


def _events(r: EngineMetric) -> float | None:
    """A metric row's events: its evaluation rate times its evaluation time (the row has no
    count of its own); None when either is missing."""
    if r.events_per_s is None or r.batch_ms is None:
        return None
    return r.events_per_s * r.batch_ms / 1000


def _per_batch_rate(rows: Sequence[EngineMetric], since_before: np.ndarray) -> list[float | None]:
    """Each metric row's alerts over ``since_before``, the seconds since its engine's row before
    (:func:`dashboard.per_engine.since_row_before`); None for an engine's first row, a missing
    count or no time between."""
    a = np.array([np.nan if r.alerts is None else r.alerts for r in rows], np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(since_before > 0, a / since_before, np.nan)
    return [None if np.isnan(x) else float(x) for x in rate.tolist()]
