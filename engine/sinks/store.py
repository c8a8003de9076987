"""PostgreSQL side of the engine: the alert log, current results and batch ids in ONE transaction.

A micro-batch is committed by inserting its id into ``engine_batches`` in the same
transaction as its alerts (primary key: the stable alert id) and its changes to
``current_results``; a batch id already present means the batch was committed
before (a re-run after a crash) and nothing is written again (docs/ARCHITECTURE.md,
"Exactly once, end to end").  Metrics go to ``engine_metrics`` in the same transaction.

The alerts of a batch (thousands while many rules' windows fill) are written by
:func:`write_copy`: one ``COPY`` of the batch (CSV made by Arrow) into a temporary table of the
session, then ``INSERT … SELECT`` into ``alerts`` and the net change of every (subscription, key)
into ``current_results`` -- the rows the array-bound statements of :func:`_write_unnest` wrote,
for less (docs/engine.md, "Alert delivery: COPY and one Avro kernel"; figures in
docs/measurements/engine.md).
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import numpy as np
import psycopg2
import pyarrow as pa
import pyarrow.csv as pacsv
from sqlalchemy import Connection, Engine, delete, func, insert, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as pg_insert

from engine.messages import Alert, BatchOutput
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

    def commit(
        self,
        out: BatchOutput,
        *,
        watermark: int | None,
        metrics: dict[str, Any],
        write: Callable[[Connection, BatchOutput], None] | None = None,
    ) -> bool:
        """Write one batch's output atomically; False (nothing written) if it was committed before.

        ``write`` writes the alerts and the current-result changes inside the transaction:
        :func:`write_copy` (the default) or :func:`_write_unnest`, the array-bound statements it
        replaced (kept as the reference of the equivalence test and ``bench/delivery_bench.py``)."""
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
            (write or write_copy)(conn, out)
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


# --------------------------------------------------------------------------- writing a batch
def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps`` with its defaults, minus its per-call set-up (the C encoder made once): an
    alert's values are encoded once per alert, thousands of times per batch.  Falls back to
    ``json.dumps`` where the C encoder is missing or does not give the same text."""
    import json.encoder as je

    make = getattr(je, "c_make_encoder", None)
    if make is None:
        return json.dumps
    try:
        enc = make(
            None, je.JSONEncoder().default, je.encode_basestring_ascii, None, ": ", ", ", False, False, True
        )
        probe = {'a\u00e9\\"': 1.5, "b": None, "c": 3, "d": float("nan"), "e": 1e-7}
        if "".join(enc(probe, 0)) != json.dumps(probe):
            return json.dumps
    except TypeError:  # another signature
        return json.dumps
    return lambda obj: "".join(enc(obj, 0))


values_json = _json_encoder()

#: the batch's alerts staged by COPY: a temporary table per session, emptied by every commit
_STAGE = (
    "SET LOCAL client_min_messages = warning; "  # no NOTICE "already exists" per batch
    "SET LOCAL work_mem = '64MB'; "  # the batch's sorts in memory (the default 4 MB spills them)
    "CREATE TEMP TABLE IF NOT EXISTS tw_alerts_in (ord integer, id text, sid uuid, key text, kind text, "
    "ms bigint, vals jsonb) ON COMMIT DELETE ROWS"
)
_COPY = "COPY tw_alerts_in (ord, id, sid, key, kind, ms, vals) FROM STDIN WITH (FORMAT csv)"
_FROM_STAGE = (
    "INSERT INTO alerts (alert_id, subscription_id, key, kind, as_of, values, batch_id) "
    "SELECT id, sid, key, kind, to_timestamp(ms / 1000.0), vals, %(batch)s FROM tw_alerts_in "
    "ORDER BY ms, ord ON CONFLICT (alert_id) DO NOTHING; "
    # the net change of each (subscription, key): its last alert; EXITs delete, ENTERs upsert
    # (one row per (subscription, key): the two never touch the same row)
    "WITH net AS MATERIALIZED (SELECT DISTINCT ON (sid, key) sid, key, kind, ms, vals FROM tw_alerts_in "
    "ORDER BY sid, key, ord DESC), "
    "gone AS (DELETE FROM current_results c USING net "
    "WHERE net.kind = 'EXIT' AND c.subscription_id = net.sid AND c.key = net.key) "
    "INSERT INTO current_results (subscription_id, key, since, values) "
    "SELECT sid, key, to_timestamp(ms / 1000.0), vals FROM net WHERE kind = 'ENTER' "
    "ON CONFLICT (subscription_id, key) DO UPDATE SET since = EXCLUDED.since, "
    "values = EXCLUDED.values, updated_at = now()"
)


def _stage_csv(alerts: list[Alert]) -> bytes:
    """The alerts as the CSV of :data:`_COPY`: columns read by comprehensions, written by Arrow's
    CSV writer (every string quoted, so an empty key stays an empty string, not NULL)."""
    n = len(alerts)
    tbl = pa.table(
        {
            "ord": np.arange(n, dtype=np.int32),
            "id": pa.array([a.id for a in alerts], pa.string()),
            "sid": pa.array([_uuid_text(a.subscription_id) for a in alerts], pa.string()),
            "key": pa.array([a.key for a in alerts], pa.string()),
            "kind": pa.array([a.kind for a in alerts], pa.string()),
            "ms": pa.array([a.as_of for a in alerts], pa.int64()),
            "vals": pa.array([values_json(a.values) for a in alerts], pa.string()),
        }
    )
    sink = pa.BufferOutputStream()
    pacsv.write_csv(tbl, sink, pacsv.WriteOptions(include_header=False, quoting_style="needed"))
    return sink.getvalue().to_pybytes()


def write_copy(conn: Connection, out: BatchOutput) -> None:
    """The batch's alerts and current-result changes, in the caller's transaction: the alerts go
    to a temporary table in ONE ``COPY`` (CSV), then two statements in one round trip insert
    them into ``alerts`` (``ON CONFLICT DO NOTHING``: an alert id written before is kept) and
    apply each (subscription, key)'s last change to ``current_results``.

    Writes what :func:`_write_unnest` writes (tests/engine/sinks/test_store_copy.py): the same columns,
    ``to_timestamp(ms / 1000.0)`` timestamps computed by the server, the same JSON text of the
    values; ``alerts.seq`` in ``as_of`` order, ties in batch order."""
    raw: Any = conn.connection.dbapi_connection  # psycopg2's own: COPY is not in the DB-API
    try:
        with raw.cursor() as cur:
            if out.removed:
                cur.execute(
                    "DELETE FROM current_results WHERE subscription_id = ANY(%s::uuid[])",
                    ([_uuid_text(sid) for sid in out.removed],),
                )
            if not out.alerts:
                return
            data = _stage_csv(out.alerts)
            cur.execute(_STAGE)
            cur.copy_expert(_COPY, io.BytesIO(data), size=1 << 20)
            cur.execute(_FROM_STAGE, {"batch": out.batch_id})
    except psycopg2.Error as err:  # raised as SQLAlchemy's, as its own statements would be
        gone = conn.dialect.is_disconnect(err, raw, None)
        raise sa_exc.DBAPIError.instance(
            "COPY of the batch's alerts", None, err, psycopg2.Error, connection_invalidated=gone,
            dialect=conn.dialect,
        ) from err  # fmt: skip


def _write_unnest(conn: Connection, out: BatchOutput) -> None:
    """The alert path before ``COPY``: every column bound as one array (``unnest``), one statement
    per table.  Kept as the reference :func:`write_copy` is tested and benchmarked against."""
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
        conn.execute(delete(CurrentResult).where(CurrentResult.subscription_id == subscription_uuid(sid)))
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
