"""Engines sharing one database, and a batch's dead letters kept in PostgreSQL (issue #20).

Real PostgreSQL (the embedded server of ``restartable_pg``, a fresh database per test); the
progress marker on the real embedded broker (``restartable_kafka``)."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, create_engine, text

from engine.dead_letter import DeadLetters
from engine.messages import Alert, BatchOutput
from engine.sinks.store import Store
from tests.engine.support import own_topics
from tidewatch.settings import Settings

pytestmark = pytest.mark.integration

T0 = 1_763_900_000_000
METRICS = {"events_per_s": 1.0, "batch_ms": 2.0, "lag_ms": 3.0, "alerts": 1, "dead_letters": 0}
SUB = str(uuid.UUID(int=7))


def _db(settings: Settings) -> Engine:
    from tests.engine.test_engine_integration import fresh_database

    return create_engine(fresh_database(settings.sqlalchemy_url))


def _batch(b: int, key: str, dead: DeadLetters | None = None) -> BatchOutput:
    alert = Alert(SUB, "r", "trades", key, "ENTER", T0 + 1000 * b, {"COUNT(*)": b})
    return BatchOutput(batch_id=b, alerts=[alert], dead=dead or DeadLetters(), events={"trades": 10 + b})


def _dead(n: int, tag: str) -> DeadLetters:
    """``n`` dead letters of every shape the Avro record allows (bytes with NUL and non-UTF-8,
    None key, an event time past any timestamp type, no watermark)."""
    d = DeadLetters()
    keys = [None] + [b"k\x00" + bytes([i]) for i in range(1, n)]
    values = [b"\xff\xfe" + tag.encode() + bytes([i]) for i in range(n)]
    d.add("trades", np.arange(n) % 3, np.arange(n) + 100, keys, values, "undecodable", f"détail {tag}")
    d.add("packets", np.array([5]), np.array([2**40]), [b"ip"], [b"v"], "future", "ahead",
          event_ts=[2**63 - 1], watermark=T0)  # fmt: skip
    return d


def _count(eng: Engine, sql: str, **params: Any) -> int:
    with eng.connect() as conn:
        return int(conn.execute(text(sql), params).scalar() or 0)


def test_two_engines_commit_the_same_batch_ids_and_a_recommit_writes_nothing(
    restartable_pg: Settings,
) -> None:
    eng = _db(restartable_pg)
    a, b = Store(eng, "shard-a"), Store(eng, "shard-b")
    try:
        assert a.last_committed() == b.last_committed() == -1
        for n in range(3):  # the same batch ids, other alerts (other keys: a shard's own)
            assert a.commit(_batch(n, "A"), watermark=T0 + n, metrics=METRICS)
            assert b.commit(_batch(n, "B"), watermark=T0 + n, metrics=METRICS)
        assert a.last_committed() == b.last_committed() == 2
        # each engine expands its own rows only
        assert a.unexpanded() == b.unexpanded() == [0, 1, 2]
        assert a.project_pending() == 3 and b.unexpanded() == [0, 1, 2]
        assert b.project_pending() == 3 and a.unexpanded() == b.unexpanded() == []
        assert all(a.is_committed(n) and b.is_committed(n) for n in range(3))
        assert not a.is_committed(3) and not Store(eng).is_committed(0)  # the "default" engine: none
        assert [r["key"] for r in a.alerts_of_batch(1)] == ["A"]
        assert [r["key"] for r in b.alerts_of_batch(1)] == ["B"]
        q = "SELECT count(*) FROM {} WHERE engine_id = :e"
        for t, per_engine in (("engine_batches", 3), ("alerts", 3), ("engine_metrics", 3)):
            assert (
                _count(eng, q.format(t), e="shard-a") == _count(eng, q.format(t), e="shard-b") == per_engine
            )
        before = {
            t: _count(eng, f"SELECT count(*) FROM {t}")
            for t in ("engine_batches", "alerts", "engine_metrics", "current_results")
        }
        # the same engine commits a batch again (a re-run after a crash): nothing is written
        assert not a.commit(_batch(1, "A-again", _dead(2, "x")), watermark=0, metrics=METRICS)
        assert not b.commit(_batch(2, "B-again"), watermark=0, metrics=METRICS)
        after = {t: _count(eng, f"SELECT count(*) FROM {t}") for t in before}
        assert after == before and a.unexpanded() == b.unexpanded() == []
        assert _count(eng, "SELECT count(*) FROM engine_dead_letters") == 0
        assert [r["key"] for r in a.alerts_of_batch(1)] == ["A"]
        # a third engine starts from scratch on the same database
        c = Store(eng, "shard-c")
        assert c.last_committed() == -1 and c.commit(_batch(0, "C"), watermark=T0, metrics=METRICS)
    finally:
        eng.dispose()


def test_dead_letters_are_stored_with_their_batch_and_deleted_once_a_later_batch_commits(
    restartable_pg: Settings,
) -> None:
    eng = _db(restartable_pg)
    a, b = Store(eng, "e-a"), Store(eng, "e-b")
    try:
        d0 = _dead(4, "zero")
        assert a.commit(_batch(0, "K", d0), watermark=T0, metrics=METRICS)
        assert b.commit(_batch(0, "K2", _dead(2, "other")), watermark=T0, metrics=METRICS)
        got = a.dead_letters_of_batch(0)
        assert got == d0  # every column, in order, bytes as bytes
        assert got.records(5) == d0.records(5)  # the Avro records the republish produces
        assert len(b.dead_letters_of_batch(0)) == 3 and len(a.dead_letters_of_batch(1)) == 0
        assert b.dead_letters_of_batch(0).detail[0] == "détail other"

        # batch 1 of engine a: batch 0 is in Kafka by now, its dead letters go; b's stay
        d1 = _dead(1, "one")
        assert a.commit(_batch(1, "K", d1), watermark=T0, metrics=METRICS)
        assert len(a.dead_letters_of_batch(0)) == 0 and a.dead_letters_of_batch(1) == d1
        assert len(b.dead_letters_of_batch(0)) == 3
        assert a.commit(_batch(2, "K"), watermark=T0, metrics=METRICS)
        assert len(a.dead_letters_of_batch(1)) == 0
        # a batch that fails leaves no dead letter behind (one transaction)
        bad = _batch(3, "K", _dead(2, "bad"))
        # refused inside the transaction, its batch id inserted already (the kind CHECK of alerts)
        bad.alerts = [Alert(SUB, "r", "trades", "K", "MAYBE", T0, {})]
        with pytest.raises(ValueError, match="'MAYBE'"):
            a.commit(bad, watermark=T0, metrics=METRICS)
        assert len(a.dead_letters_of_batch(3)) == 0 and a.last_committed() == 2
        # a new store (a restarted engine) deletes what an earlier run left, at its first commit
        assert _count(eng, "SELECT count(*) FROM engine_dead_letters WHERE engine_id = 'e-a'") == 0
        assert b.commit(_batch(1, "K2"), watermark=T0, metrics=METRICS)  # b had stored some
        assert _count(eng, "SELECT count(*) FROM engine_dead_letters") == 0
        b2 = Store(eng, "e-b")  # a run that stops after this batch, before its next commit
        assert b2.commit(_batch(2, "K2", _dead(1, "b2")), watermark=T0, metrics=METRICS)
        assert len(b2.dead_letters_of_batch(2)) == 2
        b3 = Store(eng, "e-b")  # the next run: its first batch has no dead letters
        assert b3.commit(_batch(3, "K2"), watermark=T0, metrics=METRICS)
        assert _count(eng, "SELECT count(*) FROM engine_dead_letters") == 0
    finally:
        eng.dispose()


def test_progress_markers_of_two_engine_ids_are_their_own(restartable_kafka: Settings) -> None:
    """The Kafka side of the same key: two engines on the same topics, other ids, each sees only
    its own published batches."""
    from engine.sinks import publish

    bootstrap = restartable_kafka.kafka_bootstrap
    assert bootstrap is not None
    run = uuid.uuid4().hex[:6]
    s = own_topics(restartable_kafka, "eng")
    publish.ensure_topics(bootstrap, s)
    pubs = [publish.Publisher(bootstrap, s, f"{name}-{run}") for name in ("one", "two")]
    try:
        assert [p.last_published() for p in pubs] == [-1, -1]
        pubs[0].publish(0, [_batch(0, "K").alerts[0]])
        pubs[0].publish(1, [_batch(1, "K").alerts[0]])
        assert [p.last_published() for p in pubs] == [1, -1]
        pubs[1].publish(0, [_batch(0, "L").alerts[0]])
        assert [p.last_published() for p in pubs] == [1, 0]
    finally:
        for p in pubs:
            p.close()
