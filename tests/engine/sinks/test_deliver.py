"""The overlapped delivery (:mod:`engine.sinks.deliver`, issue #22) on real services: the embedded
PostgreSQL of ``restartable_pg`` (a fresh database per test) and the embedded broker of
``restartable_kafka``.  The real :class:`~engine.sinks.store.Store` and
:class:`~engine.sinks.publish.Publisher` steps are wrapped by recorders that note when each one
starts and ends: the Kafka transaction is committed only after PostgreSQL's commit returned (its
records produced before, invisible to ``read_committed`` consumers); a PostgreSQL failure aborts
the transaction; a failed Kafka commit is retried after PostgreSQL committed."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from sqlalchemy import create_engine, text

from engine.dead_letter import DeadLetters
from engine.messages import Alert, BatchOutput
from engine.sinks import publish
from engine.sinks.deliver import Delivery
from engine.sinks.store import Store
from tests.engine.support import own_topics, read_topic
from tidewatch.settings import Settings

pytestmark = pytest.mark.integration

T0 = 1_763_900_000_000
METRICS = {"events_per_s": 1.0, "batch_ms": 2.0, "lag_ms": 3.0, "alerts": 1, "dead_letters": 0}


def _batch(b: int, n: int = 300) -> BatchOutput:
    """``n`` alerts, distinct ids (a (subscription, key) once per lookup time), in ``as_of`` order."""
    subs = [str(uuid.UUID(int=i + 1)) for i in range(7)]
    alerts = [
        Alert(subs[i % 7], f"r{i % 7}", "trades", f"S{i % 50}", "ENTER" if i % 3 else "EXIT",
              T0 + 1_000_000 * b + 1000 * (i // 100), {"COUNT(*)": i})
        for i in range(n)
    ]  # fmt: skip
    return BatchOutput(batch_id=b, alerts=alerts, dead=DeadLetters(), events={"trades": 10 * n})


class _Sinks:
    """A store, a publisher and their delivery, each step of the two wrapped: ``events`` gets
    ``(step, "start" | "end")`` in the order they happened (any thread).  ``pg_commit`` is what
    the recorded PostgreSQL commit calls (the real one unless a test replaces it)."""

    def __init__(self, settings: Settings, db_url: str, run: str) -> None:
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.store = Store(create_engine(db_url), f"deliver-{run}")
        self.publisher = publish.Publisher(settings.kafka_bootstrap or "", settings, f"deliver-{run}")
        self.delivery = Delivery(self.store, self.publisher, db_retry_s=5.0)
        self.pg_commit: Callable[..., Any] = self.store.commit
        self.store.commit = self.recorded("pg.commit", lambda *a, **kw: self.pg_commit(*a, **kw))  # type: ignore[method-assign]
        for step in ("begin", "commit", "abort"):
            real = getattr(self.publisher, step)
            setattr(self.publisher, step, self.recorded(f"kafka.{step}", real))

    def recorded(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            self.note(name, "start")
            try:
                return fn(*args, **kw)
            finally:
                self.note(name, "end")

        return call

    def note(self, step: str, what: str) -> None:
        with self.lock:
            self.events.append((step, what))

    def at(self, step: str, what: str) -> int:
        return self.events.index((step, what))

    def wait_for(self, step: str, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while (step, what) not in self.events:
            assert time.monotonic() < deadline, f"no {step} {what}"
            time.sleep(0.01)

    def close(self) -> None:
        self.delivery.close()
        self.publisher.close()
        self.store.engine.dispose()


@pytest.fixture()
def sinks(restartable_kafka: Settings, restartable_pg: Settings) -> Iterator[_Sinks]:
    from tests.engine.test_engine_integration import fresh_database

    run = uuid.uuid4().hex[:6]
    s = own_topics(restartable_kafka, "dlv", engine_kafka_retry_s=60.0)
    publish.ensure_topics(s.kafka_bootstrap or "", s)
    got = _Sinks(s, fresh_database(restartable_pg.sqlalchemy_url), run)
    try:
        yield got
    finally:
        got.close()


def _alert_ids(s: _Sinks, timeout: float = 20.0, *, expect_open: bool = False) -> list[str]:
    st = s.publisher.settings
    bootstrap = st.kafka_bootstrap or ""
    return [
        a["id"] for a in read_topic(bootstrap, st.topic_alerts, "alerts", timeout, expect_open=expect_open)
    ]


def _pg_batches(s: _Sinks) -> list[int]:
    with s.store.engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT batch_id FROM engine_batches ORDER BY 1"))]


def test_kafka_commits_only_after_postgres_committed_its_records_produced_meanwhile(sinks: _Sinks) -> None:
    """PostgreSQL's commit is held until the Kafka records are produced (the overlap made
    certain): then the open transaction's records are invisible to a ``read_committed`` reader,
    and the Kafka commit starts only after PostgreSQL's commit returned."""
    s = sinks
    real_commit = s.pg_commit
    invisible: list[list[str]] = []

    def held_commit(*args: Any, **kw: Any) -> Any:
        s.wait_for("kafka.begin", "end")
        invisible.append(_alert_ids(s, 3.0, expect_open=True))  # the records are in Kafka, uncommitted
        return real_commit(*args, **kw)

    s.pg_commit = held_commit
    out = _batch(0)
    done = s.delivery.deliver(out, watermark=None, metrics=METRICS)
    assert done.committed
    assert invisible == [[]]
    assert s.at("kafka.begin", "end") < s.at("pg.commit", "end") < s.at("kafka.commit", "start")
    assert "kafka.abort" not in {e for e, _ in s.events}
    assert _pg_batches(s) == [0] and s.publisher.last_published() == 0
    assert sorted(_alert_ids(s)) == sorted(a.id for a in out.alerts)


def test_every_batch_commits_in_postgres_before_kafka(sinks: _Sinks) -> None:
    """Batches delivered in a row (no step held): each one's Kafka commit starts after its
    PostgreSQL commit ended, its records were produced during that commit's run, and each batch
    is in Kafka once.  The PostgreSQL commit (one row since migration 0011: a few ms) waits
    until the producing thread has started, so the test does not depend on which thread the
    machine runs first; a delivery that produced only after the commit would time out here."""
    s = sinks
    batches = [_batch(b, 2000) for b in range(4)]
    real_commit = s.pg_commit

    def after_begin(*args: Any, **kw: Any) -> Any:
        s.wait_for("kafka.begin", "start", timeout=20.0)
        return real_commit(*args, **kw)

    s.pg_commit = after_begin
    for out in batches:
        s.events.clear()
        s.delivery.deliver(out, watermark=None, metrics=METRICS)
        assert s.at("kafka.begin", "start") < s.at("pg.commit", "end") < s.at("kafka.commit", "start")
        assert s.at("kafka.begin", "end") < s.at("kafka.commit", "start")
    assert s.publisher.last_published() == 3 and _pg_batches(s) == [0, 1, 2, 3]
    ids = _alert_ids(s)
    assert len(ids) == len(set(ids)) == sum(len(b.alerts) for b in batches)
    with s.store.engine.connect() as conn:  # each batch's metrics: the delivery before it (0012)
        got = conn.execute(
            text("SELECT batch_id, delivery_ms, expansion_ms FROM engine_metrics ORDER BY batch_id")
        ).all()
    assert [r[0] for r in got] == [0, 1, 2, 3] and got[0][1:] == (None, None)
    assert all(r[1] is not None and r[1] > 0 for r in got[1:])  # batches 0-2's deliveries
    assert got[1][2] is None and all(r[2] is not None and r[2] > 0 for r in got[2:])  # 0's, 1's expansions


class _PgDown(RuntimeError):
    """A PostgreSQL failure that is not retried (not a connection error)."""


def test_a_postgres_failure_aborts_the_kafka_transaction(sinks: _Sinks) -> None:
    """PostgreSQL fails for good: its error is raised, the Kafka transaction (records produced)
    is aborted and never committed; the next batch is delivered on the same producer, and only
    its records are visible."""
    s = sinks
    real_commit = s.pg_commit

    def failing(*_: Any, **__: Any) -> Any:
        s.wait_for("kafka.begin", "end")
        raise _PgDown("refused")

    s.pg_commit = failing
    with pytest.raises(_PgDown):
        s.delivery.deliver(_batch(0), watermark=None, metrics=METRICS)
    assert ("kafka.abort", "end") in s.events and ("kafka.commit", "start") not in s.events
    assert _pg_batches(s) == [] and s.publisher.last_published() == -1

    s.pg_commit = real_commit
    out = _batch(1)
    s.delivery.deliver(out, watermark=None, metrics=METRICS)
    assert _pg_batches(s) == [1] and s.publisher.last_published() == 1
    assert sorted(_alert_ids(s)) == sorted(a.id for a in out.alerts)


def test_a_failed_kafka_commit_is_retried_after_postgres_committed(sinks: _Sinks) -> None:
    """The open transaction's commit fails once (an abortable error): the batch, committed in
    PostgreSQL, is published by the retry (a new producer, the marker checked), once."""
    s = sinks
    real = s.publisher._commit
    calls: list[int] = []

    def flaky(p: Any, marker: Any, batch_id: int, *marking: Any) -> None:
        calls.append(batch_id)
        if len(calls) == 1:  # the open transaction is left as it is: the new producer fences it
            raise KafkaException(KafkaError(KafkaError._STATE, "injected commit failure"))
        real(p, marker, batch_id, *marking)

    s.publisher._commit = flaky  # type: ignore[method-assign,assignment]
    out = _batch(0)
    s.delivery.deliver(out, watermark=None, metrics=METRICS)
    assert calls == [0, 0]
    assert _pg_batches(s) == [0] and s.publisher.last_published() == 0
    ids = _alert_ids(s)
    assert sorted(ids) == sorted(a.id for a in out.alerts)


def test_a_failed_marker_sent_beside_the_records_is_retried_once(sinks: _Sinks) -> None:
    """The progress marker, sent on its own thread while the records are produced, fails once:
    its error reaches the Kafka commit, which retries the whole transaction on a new producer;
    the batch is in Kafka once and the marker is at it."""
    s = sinks
    real = s.publisher._send_marker
    calls: list[int] = []

    def flaky(p: Any, marker: Any, batch_id: int) -> None:
        calls.append(batch_id)
        if len(calls) == 1:
            raise KafkaException(KafkaError(KafkaError._STATE, "injected marker failure"))
        real(p, marker, batch_id)

    s.publisher._send_marker = flaky  # type: ignore[method-assign]
    out = _batch(0)
    s.delivery.deliver(out, watermark=None, metrics=METRICS)
    assert calls == [0, 0]
    assert _pg_batches(s) == [0] and s.publisher.last_published() == 0
    assert sorted(_alert_ids(s)) == sorted(a.id for a in out.alerts)


def _logged(s: _Sinks) -> list[str]:
    with s.store.engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT alert_id FROM alerts ORDER BY seq"))]


def test_the_alert_log_is_expanded_behind_the_commits_at_most_one_batch_behind(sinks: _Sinks) -> None:
    """PostgreSQL's commit writes a batch as one ``engine_outputs`` row; its expansion into
    ``alerts`` runs behind it, and the next delivery waits for it first: after each delivery at
    most that batch is unexpanded; after :meth:`Delivery.settle` every alert is logged once, in
    batch order, the same ids Kafka got."""
    s = sinks
    batches = [_batch(b, 1500) for b in range(4)]
    for out in batches:
        d = s.delivery.deliver(out, watermark=None, metrics=METRICS)
        assert d.committed and s.store.unexpanded() in ([], [out.batch_id])
        assert out.batch_id == 0 or d.expanded_s > 0  # the previous batch's, waited for
    s.delivery.settle()
    assert s.store.unexpanded() == []
    want = [a.id for b in batches for a in sorted(b.alerts, key=lambda a: a.as_of)]
    assert _logged(s) == want
    assert sorted(_alert_ids(s)) == sorted(want)


class _Refused(RuntimeError):
    """An expansion failure that is not retried."""


def test_a_failed_expansion_is_raised_by_the_next_delivery_and_its_row_expanded_at_the_restart(
    sinks: _Sinks,
) -> None:
    """The expansion of batch 0 fails for good: the next delivery commits batch 1 (PostgreSQL,
    then Kafka) and raises it; both rows stay, and the restarted engine's recovery
    (:func:`engine.sinks.deliver.republish_committed`) expands them, in order, once."""
    from engine.sinks.deliver import republish_committed

    s = sinks
    real = s.store.project
    s.store.project = lambda *a, **kw: (_ for _ in ()).throw(_Refused("no"))  # type: ignore[method-assign]
    first = _batch(0)
    assert s.delivery.deliver(first, watermark=None, metrics=METRICS).committed
    with pytest.raises(_Refused):
        s.delivery.deliver(_batch(1), watermark=None, metrics=METRICS)
    assert _pg_batches(s) == [0, 1] and s.publisher.last_published() == 1
    assert s.store.unexpanded() == [0, 1] and _logged(s) == []
    s.store.project = real  # type: ignore[method-assign]
    republish_committed(s.store, s.publisher, s.store.last_committed())  # what recover() runs
    want = [a.id for b in (first, _batch(1)) for a in b.alerts]
    assert s.store.unexpanded() == [] and _logged(s) == want
    republish_committed(s.store, s.publisher, s.store.last_committed())  # a second start: nothing
    assert _logged(s) == want and sorted(_alert_ids(s)) == sorted(want)
