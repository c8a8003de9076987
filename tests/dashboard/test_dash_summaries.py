"""The summaries of the Alerts and "While you were away" pages, aggregated in PostgreSQL:
per subscription entered / left, the busiest keys, alerts per time bucket -- scoped to the
user, filtered like the alert log, and bounded by the catch-up's seq range."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from dashboard import queries
from subscriptions.service import SubscriptionService
from tests.dashboard.support import add_alerts, subscribe

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 25, 8, 0, 0, tzinfo=UTC)


def _fill(sm: sessionmaker[Session], svc: SubscriptionService, user: str) -> tuple[Any, Any, list[int]]:
    s1, s2 = subscribe(svc, user, "volume"), subscribe(svc, user, "momentum")
    seqs = add_alerts(sm, s1.id, [("AAPL", "ENTER"), ("MSFT", "ENTER")], as_of=T0)
    seqs += add_alerts(sm, s1.id, [("AAPL", "EXIT")], as_of=T0 + timedelta(seconds=30))
    seqs += add_alerts(sm, s1.id, [("AAPL", "ENTER")], as_of=T0 + timedelta(seconds=70))
    seqs += add_alerts(sm, s2.id, [("IBM", "ENTER")], as_of=T0 + timedelta(seconds=75))
    return s1, s2, seqs


def test_summary_per_subscription_counts_entered_left_and_keys(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    u = new_user("sum")
    s1, s2, seqs = _fill(sm, svc, u)
    rows = queries.summary_by_subscription(sm, u)
    assert [(r.name, r.entered, r.left, r.keys, r.total) for r in rows] == [
        ("volume", 3, 1, 2, 4),
        ("momentum", 1, 0, 1, 1),
    ]
    assert rows[0].first == T0 and rows[0].last == T0 + timedelta(seconds=70)
    # bounded by a seq range (the catch-up's cursor < seq <= upto) and by the log's filters
    away = queries.summary_by_subscription(sm, u, after_seq=seqs[1], upto_seq=seqs[3])
    assert [(r.name, r.entered, r.left) for r in away] == [("volume", 1, 1)]
    assert [
        (r.name, r.entered) for r in queries.summary_by_subscription(sm, u, kinds=["ENTER"], key="ib")
    ] == [("momentum", 1)]
    assert queries.summary_by_subscription(sm, u, subscription_ids=[s2.id])[0].name == "momentum"


def test_busiest_keys_most_alerts_first(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    u = new_user("busy")
    _fill(sm, svc, u)
    busy = queries.busiest_keys(sm, u, limit=2)
    assert [(k.key, k.subscription, k.entered, k.left) for k in busy] == [
        ("AAPL", "volume", 2, 1),
        ("IBM", "momentum", 1, 0),  # ties: the newest alert first
    ]
    assert [k.key for k in queries.busiest_keys(sm, u, limit=10)] == ["AAPL", "IBM", "MSFT"]


def test_alert_rate_buckets_in_sql(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    u = new_user("rate")
    _fill(sm, svc, u)
    rate = queries.alert_rate(sm, u)
    assert rate.bucket_s == 5  # 75 s of alerts, at most 60 buckets
    assert rate.rows == [
        (T0, "ENTER", 2),
        (T0 + timedelta(seconds=30), "EXIT", 1),
        (T0 + timedelta(seconds=70), "ENTER", 1),
        (T0 + timedelta(seconds=75), "ENTER", 1),
    ]
    coarse = queries.alert_rate(sm, u, max_buckets=1)
    assert coarse.bucket_s == 300 and sum(n for _t, _k, n in coarse.rows) == 5
    assert queries.alert_rate(sm, u, key="nothing-like-this").rows == []


def test_summaries_show_nothing_of_another_user(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    a, b = new_user("sa"), new_user("sb")
    s1, _s2, _ = _fill(sm, svc, a)
    assert queries.summary_by_subscription(sm, b) == []
    assert queries.summary_by_subscription(sm, b, subscription_ids=[s1.id]) == []  # A's id: nothing
    assert queries.busiest_keys(sm, b) == [] and queries.alert_rate(sm, b).rows == []
    assert queries.live_subscriptions(sm, a) == 2 and queries.live_subscriptions(sm, b) == 0
    svc.delete(a, s1.id)
    assert queries.live_subscriptions(sm, a) == 1


def test_bucket_width_follows_the_span() -> None:
    assert queries.bucket_seconds(0) == 1
    assert queries.bucket_seconds(60) == 1
    assert queries.bucket_seconds(61) == 5
    assert queries.bucket_seconds(3600) == 60
    assert queries.bucket_seconds(86400) == 3600  # 15 min would give 96 buckets
    assert queries.bucket_seconds(10**9) == queries.BUCKETS_S[-1]
