"""Helpers of the dashboard tests (imported by the test modules and conftest)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from subscriptions.service import SubscriptionService, SubscriptionView
from tidewatch.db.models import Alert, CurrentResult, EngineBatch, EngineMetric

PASSWORD = "correct horse battery"


def unique(prefix: str = "u") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


RULE = "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDS > 1000"


def subscribe(
    svc: SubscriptionService, user: str, name: str = "volume", rule: str = RULE
) -> SubscriptionView:
    return svc.create(user, rule, name=name)


def add_alerts(
    sm: sessionmaker[Session],
    sub_id: uuid.UUID,
    items: list[tuple[str, str]],
    *,
    values: dict[str, Any] | None = None,
    as_of: datetime | None = None,
) -> list[int]:
    """Write alerts ``(key, kind)`` of one subscription in one batch, like the engine; returns their seqs.
    ENTER keys go into ``current_results``, EXIT keys leave it."""
    t = as_of or datetime.now(UTC)
    seqs: list[int] = []
    with sm.begin() as s:
        s.execute(sa.text("LOCK TABLE engine_batches IN EXCLUSIVE MODE"))  # one writer, like the engine
        bid = int(s.scalar(sa.select(sa.func.coalesce(sa.func.max(EngineBatch.batch_id), 0) + 1)) or 1)
        s.add(EngineBatch(batch_id=bid, watermark=t, events=0, alerts=len(items)))
        for key, kind in items:
            aid = f"{sub_id}|{key}|{kind}|{bid}"
            s.add(
                Alert(
                    alert_id=aid,
                    subscription_id=sub_id,
                    key=key,
                    kind=kind,
                    as_of=t,
                    values=values or {},
                    batch_id=bid,
                )
            )
            s.flush()
            seqs.append(int(s.scalar(sa.select(Alert.seq).where(Alert.alert_id == aid)) or 0))
            if kind == "ENTER":
                s.merge(CurrentResult(subscription_id=sub_id, key=key, since=t, values=values or {}))
            else:
                s.execute(
                    sa.delete(CurrentResult).where(
                        CurrentResult.subscription_id == sub_id, CurrentResult.key == key
                    )
                )
    return seqs


def two_batches(now: datetime, older: dict[str, Any], newer: dict[str, Any]) -> list[EngineMetric]:
    """Two ``engine_metrics`` rows 2 s apart, 3 s and 1 s before ``now``: batch 1 at 900 events/s
    over 350 ms (315 events), batch 2 at 1,200 events/s over 420 ms (504 events), each with the
    extra columns given (``driver_cpu_ms`` on the newer one: the Health view's driver load)."""
    return [
        EngineMetric(ts=now - timedelta(seconds=3), batch_id=1, events_per_s=900.0, batch_ms=350.0, **older),
        EngineMetric(ts=now - timedelta(seconds=1), batch_id=2, events_per_s=1200.0, batch_ms=420.0, **newer),
    ]


def add_storm_metrics(
    sm: sessionmaker[Session],
    end: datetime,
    storm_sub: uuid.UUID,
    *,
    calm_per_batch: int = 25,
    storm_per_batch: int = 1000,
    lag_ms: float = 900.0,
) -> None:
    """Engine metrics of every engine deleted, then a batch every 5 s (in time order): a calm quarter hour of
    ``calm_per_batch`` alerts (5/s by default), then the minute up to ``end`` of
    ``storm_per_batch`` (200/s), 90% of them from ``storm_sub`` (the rest from another id)."""
    other = str(uuid.uuid4())
    rows = [
        EngineMetric(
            ts=end - timedelta(seconds=5 * i),
            batch_id=10**7 - i,
            batch_ms=50.0,
            lag_ms=lag_ms,
            alerts=storm_per_batch if i <= 12 else calm_per_batch,
            top_alerts={str(storm_sub): storm_per_batch * 9 // 10, other: 3} if i <= 12 else {other: 20},
        )
        for i in reversed(range(12 * 16 + 1))  # oldest first: ids in time order, as the engine's
    ]
    with sm.begin() as s:
        s.execute(sa.delete(EngineMetric))
        s.add_all(rows)


def produce_trades(bootstrap: str, topic: str, symbols: list[str], ts: list[int], sizes: list[int]) -> None:
    """Trades (Avro, keyed by symbol) written to ``topic``, as the feed writes them."""
    import numpy as np
    from confluent_kafka import Producer

    from tidewatch.wire.avro import encode_batch

    n = len(symbols)
    msgs = encode_batch(
        "trades",
        {
            "symbol": symbols,
            "ts": np.asarray(ts, np.int64),
            "price": np.full(n, 100.0),
            "size": np.asarray(sizes, np.int64),
            "side": ["BID"] * n,
            "exchange": ["NASDAQ"] * n,
        },
    ).messages()
    p = Producer({"bootstrap.servers": bootstrap})
    for sym, m in zip(symbols, msgs, strict=True):
        p.produce(topic, m, sym.encode())
    assert p.flush(30) == 0
