"""PostgreSQL side of the engine: a batch's alerts and batch id in ONE transaction, expanded behind it.

A micro-batch is committed by inserting (engine id, batch id) into ``engine_batches`` in the
same transaction as its alerts -- ONE ``engine_outputs`` row (migration 0011,
:mod:`engine.sinks.output_block`), expanded into ``alerts`` (primary key: the stable alert id)
and ``current_results`` by :meth:`Store.project` in a transaction of its own that deletes the row
(so once) -- and its dead letters (``engine_dead_letters``); a batch id already present
for this engine means the batch was committed before (a re-run after a crash) and nothing is
written again (docs/ARCHITECTURE.md, "Exactly once, end to end").  Metrics go to
``engine_metrics`` in the same transaction.  Everything keyed by batch id is scoped by the
store's engine id, so engines sharing a database (shards, deployments) each have their own
batches; alerts and metrics carry the engine id too.

A batch committed here whose Kafka transaction never happened is re-published from here after a
restart (:meth:`engine.app.EngineApp.recover`): its alerts (:meth:`Store.alerts_of_batch`), its
dead letters (:meth:`Store.dead_letters_of_batch`) and the results of the subscriptions it
removed (:meth:`Store.removed_of_batch`, from ``engine_batches.removed``: their tombstones) and the
keys whose changes the alert cap withheld (:meth:`Store.withheld_of_batch`, from
``engine_batches.withheld``; their state from :meth:`Store.current_of`).  Dead letters are only kept until then:
see :meth:`Store.commit` for when they are deleted.

The alerts of a batch (thousands while many rules' windows fill) are expanded into the per-alert
tables by :func:`write_direct`: the batch's columns (:class:`engine.sinks.alert_columns.AlertColumns`, shared
with the Kafka transaction) in one ``COPY`` straight into ``alerts`` -- the batch id's row makes
the insert happen at most once, so there is no ``ON CONFLICT`` probe -- and the net change of
every (subscription, key) in a second ``COPY`` applied to ``current_results``.  The paths it
replaced are kept as references: :func:`write_copy` (a staging table, then ``INSERT … SELECT …
ON CONFLICT``; also the fallback when an alert id is already logged) and :func:`_write_unnest`
(array-bound statements) (docs/engine.md, "Alert delivery"; figures in
docs/measurements/engine.md).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, cast

import numpy as np
import psycopg2
import psycopg2.errors
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from sqlalchemy import Connection, Engine, Table, bindparam, delete, func, insert, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as pg_insert

from engine.dead_letter import DeadLetters
from engine.messages import Alert, AlertSeq, BatchOutput
from engine.sinks.alert_columns import AlertColumns, subscription_uuid, values_json
from engine.sinks.alert_columns import uuid_text as _uuid_text
from engine.sinks.output_block import OutputRow, decode, encode, expands
from tidewatch.db.models import (
    DEFAULT_ENGINE_ID,
    CurrentResult,
    EngineBatch,
    EngineDeadLetter,
    EngineMetric,
    EngineOutput,
)
from tidewatch.db.models import Alert as AlertRow

_S = pa.large_string()


def ms_to_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def dt_to_ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


#: the commit's statements, built once (Core over the tables, the values bound at execution): a
#: statement built per batch with ``.values(...)`` cost SQLAlchemy ≈ 0.5 ms of CPU per commit in
#: coercing the values and computing its cache key (docs/measurements/engine.md, "The sharded
#: driver's fixed cost per batch")
_BATCHES = cast(Table, EngineBatch.__table__)
_INSERT_BATCH = (
    pg_insert(_BATCHES)
    .on_conflict_do_nothing(index_elements=[_BATCHES.c.engine_id, _BATCHES.c.batch_id])
    .returning(_BATCHES.c.batch_id)
)
_INSERT_OUTPUT = insert(cast(Table, EngineOutput.__table__))
_INSERT_METRIC = insert(cast(Table, EngineMetric.__table__))
_DEAD_LETTERS = cast(Table, EngineDeadLetter.__table__)
_PRUNE_DEAD = delete(_DEAD_LETTERS).where(
    _DEAD_LETTERS.c.engine_id == bindparam("engine_id"), _DEAD_LETTERS.c.batch_id < bindparam("batch_id")
)


class Store:
    """Engine writes to PostgreSQL (tables from :mod:`tidewatch.db.models`), as the engine
    ``engine_id`` (``--engine-id``; the Kafka transactional id's suffix too)."""

    def __init__(self, engine: Engine, engine_id: str = DEFAULT_ENGINE_ID) -> None:
        self.engine = engine
        self.engine_id = engine_id
        #: dead letters of earlier batches may still be stored (unknown at start: True)
        self._dead_stored = True

    def last_committed(self) -> int:
        """The largest batch id committed by this engine (-1 when none)."""
        with self.engine.connect() as conn:
            v = conn.execute(
                select(func.max(EngineBatch.batch_id)).where(EngineBatch.engine_id == self.engine_id)
            ).scalar()
        return -1 if v is None else int(v)

    def is_committed(self, batch_id: int) -> bool:
        """Whether this engine committed ``batch_id``."""
        with self.engine.connect() as conn:
            return (
                conn.execute(
                    select(EngineBatch.batch_id).where(
                        EngineBatch.engine_id == self.engine_id, EngineBatch.batch_id == batch_id
                    )
                ).first()
                is not None
            )

    def commit(
        self,
        out: BatchOutput,
        *,
        watermark: int | None,
        metrics: dict[str, Any],
        write: Callable[[Connection, BatchOutput, str], None] | None = None,
    ) -> bool:
        """Write one batch's output atomically; False (nothing written) if this engine committed
        it before.

        By default (``write`` None) the batch's alerts, withheld changes and removed
        subscriptions are written as ONE ``engine_outputs`` row
        (:func:`engine.sinks.output_block.encode`; none when there is nothing to expand), which
        :meth:`project` expands into ``alerts`` and ``current_results`` in a transaction of its
        own, behind this one (:class:`engine.sinks.deliver.Delivery`; migration 0011).  A
        ``write`` given writes the alerts and current-result changes inside this transaction
        instead: :func:`write_direct` (the inline path until Nov 30, ``bench/delivery_bench.py``'s
        "inline" side), or the paths it replaced, kept as references of the equivalence test:
        :func:`write_copy` (staging table) and :func:`_write_unnest` (array-bound statements).

        The batch's dead letters are written in the same transaction (:func:`write_dead_letters`,
        one statement), and this engine's dead letters of every *earlier* batch are deleted:
        they are in Kafka by now, because the engine delivers its batches in order, one at a
        time (PostgreSQL commit, then Kafka transaction), and :meth:`EngineApp.recover
        <engine.app.EngineApp.recover>` re-publishes a committed batch missing from Kafka before
        any later batch is committed.  The delete is sent only when there can be something to
        delete (dead letters written since the last delete, or the first commit of this store),
        so a stream without dead letters pays nothing for them.

        The batch's ``engine_metrics`` row holds ``metrics`` (the evaluation's figures) and
        :func:`batch_metrics` (which subscriptions the alerts came from, how many lookups),
        counted here, on the delivery thread, from the columns the alerts' ``COPY`` uses."""
        prune = self._dead_stored
        with self.engine.begin() as conn:
            got = conn.execute(
                _INSERT_BATCH,
                {
                    "engine_id": self.engine_id,
                    "batch_id": out.batch_id,
                    "watermark": None if watermark is None else ms_to_dt(watermark),
                    "events": sum(out.events.values()),
                    "alerts": len(out.alerts),
                    "removed": out.removed_keys,
                    "withheld": withheld_keys(out),
                    "strides": out.strides,
                },
            ).first()
            if got is None:
                return False
            if write is None:  # the batch's alerts as one row, expanded by :meth:`project`
                if expands(out):
                    conn.execute(
                        _INSERT_OUTPUT,
                        {"engine_id": self.engine_id, "batch_id": out.batch_id, **asdict(encode(out))},
                    )
            else:
                write(conn, out, self.engine_id)
            if prune:
                conn.execute(_PRUNE_DEAD, {"engine_id": self.engine_id, "batch_id": out.batch_id})
            write_dead_letters(conn, out.dead, out.batch_id, self.engine_id)
            conn.execute(
                _INSERT_METRIC,
                {"engine_id": self.engine_id, "batch_id": out.batch_id, **(batch_metrics(out) | metrics)},
            )
        self._dead_stored = len(out.dead) > 0
        return True

    def project(self, batch_id: int, out: BatchOutput | None = None) -> bool:
        """Expand this engine's committed batch ``batch_id`` from its ``engine_outputs`` row into
        ``alerts`` and ``current_results`` (:func:`write_direct`) and delete the row, in ONE
        transaction: each batch is expanded exactly once, whoever asks and however often.
        ``out``: the batch's output still in memory (the live path: the row is not read back);
        without it the row is read and decoded (:func:`engine.sinks.output_block.decode`: a
        batch committed before a restart).  False when there is no row (expanded before, or a
        batch with nothing to expand)."""
        o = EngineOutput
        mine = (o.engine_id == self.engine_id) & (o.batch_id == batch_id)
        with self.engine.begin() as conn:
            if out is not None:
                if conn.execute(delete(o).where(mine).returning(o.batch_id)).first() is None:
                    return False
            else:
                got = conn.execute(
                    delete(o)
                    .where(mine)
                    .returning(o.alert_rows, o.alert_items, o.withheld_rows, o.withheld_items, o.removed)
                ).first()
                if got is None:
                    return False
                body = [None if b is None else bytes(b) for b in got[:4]]
                out = decode(batch_id, OutputRow(body[0], body[1], body[2], body[3], list(got[4])))
            write_direct(conn, out, self.engine_id)
        return True

    def unexpanded(self) -> list[int]:
        """This engine's committed batches whose ``engine_outputs`` row is not expanded yet, in order."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(EngineOutput.batch_id)
                .where(EngineOutput.engine_id == self.engine_id)
                .order_by(EngineOutput.batch_id)
            ).all()
        return [int(r[0]) for r in rows]

    def project_pending(self) -> int:
        """Expand every batch :meth:`unexpanded` lists, in batch order (at a restart, before
        anything else reads ``alerts`` or ``current_results``); how many there were."""
        pending = self.unexpanded()
        for b in pending:
            self.project(b)
        return len(pending)

    def dead_letters_of_batch(self, batch_id: int) -> DeadLetters:
        """The dead letters of this engine's committed batch ``batch_id``, in their order (to
        re-publish them after a crash; empty once the batch is known to be in Kafka)."""
        d = EngineDeadLetter
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    d.source_topic, d.source_partition, d.source_offset, d.key, d.value, d.reason,
                    d.detail, d.event_ts, d.watermark,
                )
                .where(d.engine_id == self.engine_id, d.batch_id == batch_id)
                .order_by(d.ord)
            ).all()  # fmt: skip
        out = DeadLetters()
        if rows:
            cols = list(zip(*rows, strict=True))
            out.source_topic, out.reason, out.detail = list(cols[0]), list(cols[5]), list(cols[6])
            out.source_partition, out.source_offset = list(cols[1]), list(cols[2])
            out.key, out.value = [_bytes(b) for b in cols[3]], [_bytes(b) for b in cols[4]]
            out.event_ts, out.watermark = list(cols[7]), list(cols[8])
        return out

    def removed_of_batch(self, batch_id: int) -> dict[str, list[str]]:
        """``{subscription_id: [key, ...]}`` of this engine's committed batch ``batch_id``: the
        result each subscription it removed had (to re-publish their tombstones after a crash)."""
        with self.engine.connect() as conn:
            got = conn.execute(
                select(EngineBatch.removed).where(
                    EngineBatch.engine_id == self.engine_id, EngineBatch.batch_id == batch_id
                )
            ).scalar()
        return {str(sid): [str(k) for k in keys] for sid, keys in (got or {}).items()}

    def strides_of_batch(self, batch_id: int) -> dict[str, int]:
        """``{subscription_id: stride}`` the overload policy used in this engine's committed batch
        ``batch_id`` (``engine_batches.strides``): a replay of the batch uses them again
        (:mod:`engine.overload`)."""
        with self.engine.connect() as conn:
            got = conn.execute(
                select(EngineBatch.strides).where(
                    EngineBatch.engine_id == self.engine_id, EngineBatch.batch_id == batch_id
                )
            ).scalar()
        return {str(sid): int(k) for sid, k in (got or {}).items()}

    def withheld_of_batch(self, batch_id: int) -> dict[str, list[str]]:
        """``{subscription UUID text: [key, ...]}`` of this engine's committed batch ``batch_id``: the
        keys whose changes the alert cap withheld from the alert log (``engine_batches.withheld``;
        their ``results`` records are re-published from ``current_results`` after a crash)."""
        with self.engine.connect() as conn:
            got = conn.execute(
                select(EngineBatch.withheld).where(
                    EngineBatch.engine_id == self.engine_id, EngineBatch.batch_id == batch_id
                )
            ).scalar()
        return {str(sid): [str(k) for k in keys] for sid, keys in (got or {}).items()}

    def current_of(self, keys: dict[str, list[str]]) -> dict[tuple[str, str], tuple[int, dict[str, Any]]]:
        """``current_results`` of ``{subscription: [key, ...]}``: (subscription as given, key) ->
        (since ms, values), for the rows that exist; one statement."""
        if not keys:
            return {}
        pairs = [(_uuid_text(sid), sid, k) for sid, ks in keys.items() for k in ks]
        by_uuid = {u: sid for u, sid, _ in pairs}
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT c.subscription_id::text, c.key, c.since, c.values FROM current_results c "
                    "JOIN unnest(CAST(:sids AS uuid[]), CAST(:keys AS text[])) AS w(sid, key) "
                    "ON c.subscription_id = w.sid AND c.key = w.key"
                ),
                {"sids": [u for u, _, _ in pairs], "keys": [k for _, _, k in pairs]},
            ).all()
        return {(by_uuid[r[0]], r[1]): (dt_to_ms(r[2]), dict(r[3] or {})) for r in rows}

    def alerts_of_batch(self, batch_id: int) -> list[dict[str, Any]]:
        """The alert rows of this engine's committed batch ``batch_id`` (to re-publish them after
        a crash).  An alert another engine logged first (the same id: the same rule on the same
        events) stays that engine's."""
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
                .where(AlertRow.engine_id == self.engine_id, AlertRow.batch_id == batch_id)
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


def batch_metrics(out: BatchOutput) -> dict[str, Any]:
    """The ``engine_metrics`` figures read off a batch's output: ``top_alerts`` (the alerts of its
    top subscriptions, :meth:`AlertColumns.top_subscriptions
    <engine.sinks.alert_columns.AlertColumns.top_subscriptions>`, from the batch's columns --
    built once for both sinks), ``lookups`` (lookup times evaluated) and ``degraded`` (the
    subscriptions whose lookups the overload policy spaced: ``{sid: {"every_ms", "budget_ms"}}``)."""
    top = AlertColumns.of(out.alerts).top_subscriptions() if out.alerts else {}
    return {"top_alerts": top, "lookups": len(out.lookups), "degraded": out.degraded}


# --------------------------------------------------------------------------- writing a batch

#: the batch's alerts staged by COPY: a temporary table per session, emptied by every commit
_STAGE = (
    "SET LOCAL client_min_messages = warning; "  # no NOTICE "already exists" per batch
    "SET LOCAL work_mem = '64MB'; "  # the batch's sorts in memory (the default 4 MB spills them)
    "CREATE TEMP TABLE IF NOT EXISTS tw_alerts_in (ord integer, id text, sid uuid, key text, kind text, "
    "ms bigint, vals jsonb) ON COMMIT DELETE ROWS"
)
_COPY = "COPY tw_alerts_in (ord, id, sid, key, kind, ms, vals) FROM STDIN WITH (FORMAT csv)"
_FROM_STAGE = (
    "INSERT INTO alerts (alert_id, subscription_id, key, kind, as_of, values, batch_id, engine_id) "
    "SELECT id, sid, key, kind, to_timestamp(ms / 1000.0), vals, %(batch)s, %(engine)s FROM tw_alerts_in "
    "ORDER BY ms, ord ON CONFLICT ON CONSTRAINT pk_alerts DO NOTHING; "
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


def _stage_csv(alerts: AlertSeq | list[Alert]) -> bytes:
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


def write_copy(conn: Connection, out: BatchOutput, engine_id: str = DEFAULT_ENGINE_ID) -> None:
    """The path :func:`write_direct` replaced (Nov 23 -- Nov 25), and its fallback when an alert id
    is already logged.  The batch's alerts and current-result changes, in the caller's
    transaction: the alerts go to a temporary table in ONE ``COPY`` (CSV), then two statements in one round trip insert
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
            cur.execute(_FROM_STAGE, {"batch": out.batch_id, "engine": engine_id})
    except psycopg2.Error as err:  # raised as SQLAlchemy's, as its own statements would be
        gone = conn.dialect.is_disconnect(err, raw, None)
        raise sa_exc.DBAPIError.instance(
            "COPY of the batch's alerts", None, err, psycopg2.Error, connection_invalidated=gone,
            dialect=conn.dialect,
        ) from err  # fmt: skip


#: the batch's alerts straight into ``alerts``, in as_of order (``seq`` follows the rows' order)
_COPY_ALERTS = (
    "COPY alerts (alert_id, subscription_id, key, kind, as_of, values, batch_id, engine_id) "
    "FROM STDIN WITH (FORMAT csv)"
)
#: before the alerts' ``COPY``: the temporary table of the net changes (per session, emptied by
#: every commit) for batches whose rows cannot be read back -- made before the savepoint, so that
#: going back to it (an alert id already logged) keeps the table, even in a session's first
#: transaction; a savepoint to go back to; the largest ``seq`` logged (the batch's rows get
#: larger ones)
_NET = (
    "SET LOCAL TimeZone = 'UTC'; "  # the COPYs' timestamps are written without an offset: UTC
    "SET LOCAL work_mem = '64MB'; "  # the net changes' sort in memory
    "SET LOCAL client_min_messages = warning; "
    "CREATE TEMP TABLE IF NOT EXISTS tw_net (sid uuid, key text, kind text, since timestamptz, "
    "vals jsonb) ON COMMIT DELETE ROWS; "
    "SAVEPOINT tw_alerts; "
    "SELECT coalesce(max(seq), 0) FROM alerts"
)
#: the net change of each (subscription, key) read back from the batch's rows just logged (their
#: ``seq`` order is the batch's order when the batch is in ``as_of`` order): its last alert
_FROM_LOGGED = (
    "WITH net AS MATERIALIZED (SELECT DISTINCT ON (subscription_id, key) subscription_id AS sid, key, "
    "kind, as_of, values FROM alerts WHERE seq > %(after)s AND engine_id = %(engine)s "
    "AND batch_id = %(batch)s ORDER BY subscription_id, key, seq DESC), "
    "gone AS (DELETE FROM current_results c USING net "
    "WHERE net.kind = 'EXIT' AND c.subscription_id = net.sid AND c.key = net.key) "
    "INSERT INTO current_results (subscription_id, key, since, values) "
    "SELECT sid, key, as_of, values FROM net WHERE kind = 'ENTER' "
    "ON CONFLICT (subscription_id, key) DO UPDATE SET since = EXCLUDED.since, "
    "values = EXCLUDED.values, updated_at = now(); "
    "RELEASE SAVEPOINT tw_alerts"
)
_COPY_NET = "COPY tw_net (sid, key, kind, since, vals) FROM STDIN WITH (FORMAT csv)"
_FROM_NET = (
    "WITH gone AS (DELETE FROM current_results c USING tw_net n "
    "WHERE n.kind = 'EXIT' AND c.subscription_id = n.sid AND c.key = n.key) "
    "INSERT INTO current_results (subscription_id, key, since, values) "
    "SELECT sid, key, since, vals FROM tw_net WHERE kind = 'ENTER' "
    "ON CONFLICT (subscription_id, key) DO UPDATE SET since = EXCLUDED.since, "
    "values = EXCLUDED.values, updated_at = now()"
)
#: the alerts of a batch whose ``COPY`` met an alert id already logged: as :func:`write_copy` does
_FROM_STAGE_ALERTS = _FROM_STAGE.split("; WITH net")[0]


def _last_of_each(keys: pa.Array) -> np.ndarray:
    """Row numbers of the last row of each distinct value of ``keys`` (in the order of the values'
    first rows, reversed: any order serves)."""
    codes = np.asarray(keys.dictionary_encode().indices, np.int64)
    _, first_from_end = np.unique(codes[::-1], return_index=True)
    out: np.ndarray = len(codes) - 1 - first_from_end
    return out


def withheld_keys(out: BatchOutput) -> dict[str, list[str]]:
    """``{subscription UUID text: [key, ...]}`` of the batch's withheld alerts (the alert cap), each
    key once, sorted: ``engine_batches.withheld``.  Found by Arrow from the withheld alerts'
    columns (kept for :func:`write_direct`); ``{}`` when none."""
    if not out.withheld:
        return {}
    cols = AlertColumns.of(out.withheld, slot="withheld")
    tbl = pa.table({"sid": cols.subscription_uuid_text, "key": cols.key})
    got = tbl.group_by("sid").aggregate([("key", "distinct")])
    return {
        sid: sorted(keys)
        for sid, keys in zip(
            got.column("sid").to_pylist(), got.column("key_distinct").to_pylist(), strict=True
        )
    }


def _csv(tbl: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pacsv.write_csv(tbl, sink, pacsv.WriteOptions(include_header=False, quoting_style="needed"))
    return sink.getvalue().to_pybytes()


def write_direct(conn: Connection, out: BatchOutput, engine_id: str = DEFAULT_ENGINE_ID) -> None:
    """The batch's alerts and current-result changes, in the caller's transaction, with no
    per-alert Python past :class:`~engine.sinks.alert_columns.AlertColumns`: the alerts, sorted
    by ``as_of`` (ties in batch order), go straight into ``alerts`` in ONE ``COPY`` (CSV made by
    Arrow) -- no staging table, no ``ON CONFLICT`` probe: the batch id's row in
    ``engine_batches``, inserted first in the same transaction, already makes the batch's insert
    happen at most once (:meth:`Store.commit`).  The net change of each (subscription, key),
    its last alert, is read back from the rows just logged (they follow the batch's order when the
    batch is in ``as_of`` order, as the engine's are) and applied to ``current_results`` in one
    statement; otherwise (a batch out of ``as_of`` order, or the fallback below) it is found by
    Arrow and sent in a second ``COPY`` to a temporary table.

    An alert id already in ``alerts`` (the same rule on the same events logged by another engine
    id, or twice in one batch) makes the ``COPY`` fail; it is then rolled back to a savepoint
    and the batch's alerts are inserted as :func:`write_copy` does (``ON CONFLICT DO NOTHING``:
    the row written first is kept).  Writes what :func:`write_copy` and :func:`_write_unnest`
    write (tests/engine/sinks/test_store_copy.py): the same rows, timestamps, values JSON and
    ``alerts.seq`` order.

    A capped batch (``out.withheld``, :mod:`engine.cap`): ``alerts`` gets its alerts (kept and
    CAPPED records), ``current_results`` the net change of every (subscription, key) over
    :meth:`~engine.messages.BatchOutput.result_changes` (kept and withheld, no CAPPED record),
    found by Arrow as for a batch out of order: exactly what the batch uncapped gives
    (tests/engine/sinks/test_cap_sinks.py).  :func:`write_copy` and :func:`_write_unnest` take
    uncapped batches only."""
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
            cols = AlertColumns.of(out.alerts)
            n = len(cols)
            # as UTC wall times (Arrow formats them 30x faster than with a time zone): read as
            # UTC by the server (``SET LOCAL TimeZone`` in :data:`_NET`)
            ts = pa.array(cols.as_of, pa.int64()).cast(pa.timestamp("ms"))
            sid, vals = cols.subscription_uuid_text, cols.values_json
            alerts = pa.table(
                {
                    "id": cols.ids, "sid": sid, "key": cols.key, "kind": cols.kind, "as_of": ts,
                    "vals": vals, "batch": pa.repeat(pa.scalar(int(out.batch_id), pa.int64()), n),
                    "engine": pa.repeat(pa.scalar(engine_id, pa.large_string()), n),
                }
            )  # fmt: skip
            in_order = n < 2 or not bool((cols.as_of[1:] < cols.as_of[:-1]).any())
            if not in_order:
                alerts = alerts.take(pa.array(np.argsort(cols.as_of, kind="stable")))
            cur.execute(_NET)
            after = int(cur.fetchone()[0])
            try:
                cur.copy_expert(_COPY_ALERTS, io.BytesIO(_csv(alerts)), size=1 << 20)
                logged = True
            except psycopg2.errors.UniqueViolation:
                cur.execute("ROLLBACK TO SAVEPOINT tw_alerts")
                cur.execute(_STAGE)
                cur.copy_expert(_COPY, io.BytesIO(_stage_csv(out.alerts)), size=1 << 20)
                cur.execute(_FROM_STAGE_ALERTS, {"batch": out.batch_id, "engine": engine_id})
                logged = False
            if logged and in_order and not out.withheld:  # the batch's rows, in its order: read back
                cur.execute(_FROM_LOGGED, {"after": after, "engine": engine_id, "batch": out.batch_id})
                return
            if out.withheld:  # capped: every change (kept and withheld, no CAPPED), by as_of
                cols = AlertColumns.of(out.result_changes(), slot="results")
                ts = pa.array(cols.as_of, pa.int64()).cast(pa.timestamp("ms"))
                sid, vals = cols.subscription_uuid_text, cols.values_json
            last = pa.array(_last_of_each(pc.binary_join_element_wise(sid, cols.key, pa.scalar("|", _S))))
            net = pa.table(
                {"sid": sid.take(last), "key": cols.key.take(last), "kind": cols.kind.take(last),
                 "since": ts.take(last), "vals": vals.take(last)}
            )  # fmt: skip
            cur.copy_expert(_COPY_NET, io.BytesIO(_csv(net)), size=1 << 20)
            cur.execute(_FROM_NET + "; RELEASE SAVEPOINT tw_alerts")
    except psycopg2.Error as err:  # raised as SQLAlchemy's, as its own statements would be
        gone = conn.dialect.is_disconnect(err, raw, None)
        raise sa_exc.DBAPIError.instance(
            "COPY of the batch's alerts", None, err, psycopg2.Error, connection_invalidated=gone,
            dialect=conn.dialect,
        ) from err  # fmt: skip


def _write_unnest(conn: Connection, out: BatchOutput, engine_id: str = DEFAULT_ENGINE_ID) -> None:
    """The alert path before ``COPY``: every column bound as one array (``unnest``), one statement
    per table.  Kept as the reference :func:`write_copy` is tested and benchmarked against."""
    vals = [json.dumps(a.values) for a in out.alerts]  # once: alerts and current results
    if out.alerts:
        # one statement per table, rows bound as arrays (unnest): thousands of alerts per batch
        conn.execute(
            text(
                "INSERT INTO alerts (alert_id, subscription_id, key, kind, as_of, values, batch_id, "
                "engine_id) SELECT a.id, a.sid, a.key, a.kind, to_timestamp(a.ms / 1000.0), "
                "CAST(a.vals AS jsonb), :batch, :engine FROM unnest(CAST(:ids AS text[]), "
                "CAST(:sids AS uuid[]), CAST(:keys AS text[]), "
                "CAST(:kinds AS text[]), CAST(:ms AS bigint[]), CAST(:vals AS text[])) "
                "AS a(id, sid, key, kind, ms, vals) "
                "ORDER BY a.ms ON CONFLICT ON CONSTRAINT pk_alerts DO NOTHING"
            ),
            {
                "batch": out.batch_id,
                "engine": engine_id,
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


# --------------------------------------------------------------------------- dead letters
_DEAD = text(
    "INSERT INTO engine_dead_letters (engine_id, batch_id, ord, source_topic, source_partition, "
    "source_offset, key, value, reason, detail, event_ts, watermark) "
    "SELECT :engine, :batch, d.ord - 1, d.topic, d.part, d.off, d.key, d.value, d.reason, d.detail, d.ts, "
    "d.wm FROM unnest(CAST(:topics AS text[]), CAST(:parts AS integer[]), CAST(:offs AS bigint[]), "
    "CAST(:keys AS bytea[]), CAST(:vals AS bytea[]), CAST(:reasons AS text[]), CAST(:details AS text[]), "
    "CAST(:ts AS bigint[]), CAST(:wms AS bigint[])) WITH ORDINALITY "
    "AS d(topic, part, off, key, value, reason, detail, ts, wm, ord)"
)


def write_dead_letters(conn: Connection, dead: DeadLetters, batch_id: int, engine_id: str) -> None:
    """A batch's dead letters into ``engine_dead_letters`` in the caller's transaction: ONE
    statement, every column bound as an array (``unnest … WITH ORDINALITY`` numbers them in
    their order); nothing is sent when there are none."""
    if not len(dead):
        return
    conn.execute(
        _DEAD,
        {
            "engine": engine_id,
            "batch": batch_id,
            "topics": dead.source_topic,
            "parts": dead.source_partition,
            "offs": dead.source_offset,
            "keys": dead.key,
            "vals": dead.value,
            "reasons": dead.reason,
            "details": dead.detail,
            "ts": [None if t is None else int(t) for t in dead.event_ts],
            "wms": [None if w is None else int(w) for w in dead.watermark],
        },
    )


def _bytes(b: Any) -> bytes | None:
    """A ``bytea`` as read (psycopg2: ``memoryview``) as ``bytes``."""
    return None if b is None else bytes(b)
