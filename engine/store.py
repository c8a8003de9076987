"""PostgreSQL side of the engine: the alert log, current results and batch ids in ONE transaction.

A micro-batch is committed by inserting its id into ``engine_batches`` in the same
transaction as its alerts (primary key: the stable alert id) and its changes to
``current_results``; a batch id already present means the batch was committed
before (a re-run after a crash) and nothing is written again (DESIGN.md,
"Delivery").  Metrics go to ``engine_metrics`` in the same transaction.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert

from engine.core import BatchOutput
from tidewatch.db.models import Alert as AlertRow
from tidewatch.db.models import CurrentResult, EngineBatch, EngineMetric

_NS = uuid.UUID("6f1d1c1e-7a0e-4a5e-9a57-7469646577a7")


@lru_cache(maxsize=65536)
def subscription_uuid(sid: str) -> uuid.UUID:
    """The UUID of a subscription id (ids that are not UUIDs map to a stable uuid5); cached:
    a batch's thousands of alerts come from far fewer subscriptions."""
    try:
        return uuid.UUID(sid)
    except ValueError:
        return uuid.uuid5(_NS, sid)


@lru_cache(maxsize=65536)
def _uuid_text(sid: str) -> str:
    return str(subscription_uuid(sid))


def ms_to_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def dt_to_ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


class Store:
    """Engine writes to PostgreSQL (tables from :mod:`tidewatch.db.models`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def last_committed(self) -> int:
        """The largest committed batch id (-1 when none)."""
        with self.engine.connect() as conn:
            v = conn.execute(select(func.max(EngineBatch.batch_id))).scalar()
        return -1 if v is None else int(v)

    def is_committed(self, batch_id: int) -> bool:
        with self.engine.connect() as conn:
            return (
                conn.execute(select(EngineBatch.batch_id).where(EngineBatch.batch_id == batch_id)).first()
                is not None
            )

    def commit(self, out: BatchOutput, *, watermark: int | None, metrics: dict[str, Any]) -> bool:
        """Write one batch's output atomically; False (nothing written) if it was committed before."""
        with self.engine.begin() as conn:
            got = conn.execute(
                pg_insert(EngineBatch)
                .values(
                    batch_id=out.batch_id,
                    watermark=None if watermark is None else ms_to_dt(watermark),
                    events=sum(out.events.values()),
                    alerts=len(out.alerts),
                )
                .on_conflict_do_nothing(index_elements=[EngineBatch.batch_id])
                .returning(EngineBatch.batch_id)
            ).first()
            if got is None:
                return False
            vals = [json.dumps(a.values) for a in out.alerts]  # once: alerts and current results
            if out.alerts:
                # one statement per table, rows bound as arrays (unnest): thousands of alerts per batch
                conn.execute(
                    text(
                        "INSERT INTO alerts (alert_id, subscription_id, key, kind, as_of, values, batch_id) "
                        "SELECT a.id, a.sid, a.key, a.kind, to_timestamp(a.ms / 1000.0), CAST(a.vals AS jsonb), "
                        ":batch FROM unnest(CAST(:ids AS text[]), CAST(:sids AS uuid[]), CAST(:keys AS text[]), "
                        "CAST(:kinds AS text[]), CAST(:ms AS bigint[]), CAST(:vals AS text[])) "
                        "AS a(id, sid, key, kind, ms, vals) "
                        "ORDER BY a.ms ON CONFLICT (alert_id) DO NOTHING"
                    ),
                    {
                        "batch": out.batch_id,
                        "ids": [a.id for a in out.alerts],
                        "sids": [_uuid_text(a.subscription_id) for a in out.alerts],
                        "keys": [a.key for a in out.alerts],
                        "kinds": [a.kind for a in out.alerts],
                        "ms": [a.as_of for a in out.alerts],
                        "vals": vals,
                    },
                )
            for sid in out.removed:
                conn.execute(
                    delete(CurrentResult).where(CurrentResult.subscription_id == subscription_uuid(sid))
                )
            net: dict[tuple[str, str], int] = {}  # (subscription, key) -> its last alert's index
            for i, a in enumerate(out.alerts):
                net[(_uuid_text(a.subscription_id), a.key)] = i
            gone = [k for k, i in net.items() if out.alerts[i].kind == "EXIT"]
            if gone:
                conn.execute(
                    text(
                        "DELETE FROM current_results c USING unnest(CAST(:sids AS uuid[]), CAST(:keys AS text[])) "
                        "AS d(sid, key) WHERE c.subscription_id = d.sid AND c.key = d.key"
                    ),
                    {"sids": [k[0] for k in gone], "keys": [k[1] for k in gone]},
                )
            came = [(k, i) for k, i in net.items() if out.alerts[i].kind == "ENTER"]
            if came:
                conn.execute(
                    text(
                        "INSERT INTO current_results (subscription_id, key, since, values) "
                        "SELECT d.sid, d.key, to_timestamp(d.ms / 1000.0), CAST(d.vals AS jsonb) "
                        "FROM unnest(CAST(:sids AS uuid[]), CAST(:keys AS text[]), CAST(:ms AS bigint[]), "
                        "CAST(:vals AS text[])) AS d(sid, key, ms, vals) "
                        "ON CONFLICT (subscription_id, key) DO UPDATE SET since = EXCLUDED.since, "
                        "values = EXCLUDED.values, updated_at = now()"
                    ),
                    {
                        "sids": [k[0] for k, _ in came],
                        "keys": [k[1] for k, _ in came],
                        "ms": [out.alerts[i].as_of for _, i in came],
                        "vals": [vals[i] for _, i in came],
                    },
                )
            conn.execute(insert(EngineMetric).values(batch_id=out.batch_id, **metrics))
        return True

    def alerts_of_batch(self, batch_id: int) -> list[dict[str, Any]]:
        """The alert rows of one committed batch (to re-publish them after a crash)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    AlertRow.alert_id,
                    AlertRow.subscription_id,
                    AlertRow.key,
                    AlertRow.kind,
                    AlertRow.as_of,
                    AlertRow.values,
                )
                .where(AlertRow.batch_id == batch_id)
                .order_by(AlertRow.seq)
            ).all()
        return [
            {
                "id": r[0],
                "subscription_id": str(r[1]),
                "key": r[2],
                "kind": r[3],
                "as_of": dt_to_ms(r[4]),
                "values": dict(r[5] or {}),
            }
            for r in rows
        ]

    def alert_log(self) -> list[tuple[str, str, str, int]]:
        """(subscription_id, key, kind, as_of ms) of every alert, in as_of, subscription, key order."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(AlertRow.subscription_id, AlertRow.key, AlertRow.kind, AlertRow.as_of).order_by(
                    AlertRow.as_of, AlertRow.subscription_id, AlertRow.key, AlertRow.kind
                )
            ).all()
        return [(str(r[0]), r[1], r[2], dt_to_ms(r[3])) for r in rows]
