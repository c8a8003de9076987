"""The engine rides out a PostgreSQL outage: its batch commit is retried, and written once."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy import exc as sa_exc

from engine.runtime.retry import is_transient_db_error, retry_transient


def _op_error() -> sa_exc.OperationalError:
    return sa_exc.OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))


def test_transient_errors_are_retried_with_backoff_until_success() -> None:
    calls, sleeps = [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise _op_error()
        return "done"

    assert retry_transient(flaky, "batch 7", deadline_s=60, sleep=sleeps.append) == "done"
    assert len(calls) == 4 and sleeps == [0.5, 1.0, 2.0]


def test_other_errors_are_not_retried() -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key"))

    with pytest.raises(sa_exc.IntegrityError):
        retry_transient(broken, "batch 7", deadline_s=60, sleep=lambda s: None)
    assert calls == [1] and not is_transient_db_error(ValueError("x"))


def test_the_deadline_gives_up_with_the_last_error() -> None:
    t = [0.0]

    def advance(s: float) -> None:
        t[0] += s

    def down() -> None:
        raise _op_error()

    with pytest.raises(sa_exc.OperationalError):
        retry_transient(down, "batch 7", deadline_s=5, sleep=advance, clock=lambda: t[0])
    assert t[0] == pytest.approx(5.0)  # waited exactly up to the deadline, not past it


@pytest.mark.integration
def test_commit_survives_the_server_dropping_every_connection(pg_url: str) -> None:
    """Real PostgreSQL: every backend of the engine's pool is terminated between two batches (what
    a server restart does to a client); the next commit fails once, is retried, lands once."""
    from engine.messages import BatchOutput
    from engine.sinks.store import Store
    from tests.engine.test_engine_integration import fresh_database

    db = fresh_database(pg_url)
    eng = create_engine(db)
    store = Store(eng)
    metrics = {"events_per_s": 1.0, "batch_ms": 1.0, "lag_ms": 0.0, "alerts": 0, "dead_letters": 0}
    assert store.commit(BatchOutput(batch_id=1), watermark=1000, metrics=metrics)
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        killed = conn.execute(
            text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = :d"),
            {"d": eng.url.database},
        ).scalar()
    admin.dispose()
    assert killed and killed >= 1
    attempts = []

    def commit2() -> bool:
        attempts.append(1)
        return store.commit(BatchOutput(batch_id=2), watermark=2000, metrics=metrics)

    assert retry_transient(commit2, "batch 2", deadline_s=30, first_wait_s=0.1)
    assert len(attempts) == 2  # the pooled connection was dead: one failure, then a fresh one
    assert not retry_transient(commit2, "batch 2", deadline_s=30)  # a replay writes nothing again
    with eng.connect() as conn:
        got = conn.execute(text("SELECT array_agg(batch_id ORDER BY batch_id) FROM engine_batches")).scalar()
    assert got == [1, 2]
    eng.dispose()
