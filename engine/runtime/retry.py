"""Riding out a PostgreSQL restart: bounded retries of the engine's idempotent batch commit.

The commit of a batch (``engine.sinks.store.Store.commit``) is one transaction keyed by the batch id
(``engine_batches`` primary key, ``ON CONFLICT DO NOTHING``), so running it again after a lost
connection either writes the batch once or finds it written -- never twice.  What is retried:
errors that mean "the server went away or is not accepting connections yet" (SQLAlchemy's
``OperationalError`` / ``InterfaceError``, and any DBAPI error whose connection was invalidated).
Everything else (a constraint or programming error) is raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import exc as sa_exc

log = logging.getLogger("tidewatch.engine")

T = TypeVar("T")


def is_transient_db_error(err: BaseException) -> bool:
    """Whether ``err`` means the database was unreachable (worth retrying the transaction)."""
    if isinstance(err, (sa_exc.OperationalError, sa_exc.InterfaceError)):
        return True
    return isinstance(err, sa_exc.DBAPIError) and bool(err.connection_invalidated)


def retry_transient(
    fn: Callable[[], T],
    what: str,
    *,
    deadline_s: float,
    first_wait_s: float = 0.5,
    max_wait_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``fn()``, retried with exponential backoff while it fails with a transient database error,
    for at most ``deadline_s`` seconds; then the last error is raised."""
    start = clock()
    wait = first_wait_s
    attempt = 1
    while True:
        try:
            return fn()
        except Exception as err:
            if not is_transient_db_error(err):
                raise
            left = deadline_s - (clock() - start)
            if left <= 0:
                log.error(
                    "%s: PostgreSQL still unreachable after %.0f s: giving up (%s)", what, deadline_s, err
                )
                raise
            pause = min(wait, max_wait_s, left)
            log.warning(
                "%s: PostgreSQL unreachable (attempt %d: %s); retrying in %.1f s (%.0f s left)",
                what,
                attempt,
                str(err).splitlines()[0],
                pause,
                left,
            )
            sleep(pause)
            wait *= 2
            attempt += 1
