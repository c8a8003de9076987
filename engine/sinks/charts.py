"""The engine's side of the key page's charts: chart requests read from PostgreSQL, answered
from the state the engine holds.

The dashboard never talks to Spark: it inserts a row into ``chart_requests`` (subscription,
key; :class:`tidewatch.db.models.ChartRequest`) and polls it.  :class:`ChartAnswers` runs a
small thread in the engine process that looks for requests every ``chart_answer_poll_s``
(one indexed ``SELECT``, outside any lock), computes each answer from the evaluator's retained
history (:func:`engine.evaluation.key_series.key_series`, pure) and writes it back
(``answered_at``, ``answered_by`` = the engine id, ``answer`` or ``error``).

**The lock.** The evaluator's state belongs to the thread that evaluates micro-batches.
:attr:`ChartAnswers.lock` is held by that thread while it changes the state
(``EngineApp._evaluate``: around ``_process``) and by the answering thread only while it
*reads* the state (computing the answers; PostgreSQL is read before and written after, without
it).  So answers see the state between two batches, never half a batch; they come also when
the engine is idle (with no new Kafka data Spark runs no batch); and the evaluation thread
pays one uncontended lock per batch, nothing more -- no database round trip is added to a
batch.  An answer takes the lock for the time one key's series needs (measured:
docs/measurements/charts.md).

Requests older than :data:`MAX_AGE_S` are answered ``expired`` (the page stopped waiting);
rows older than :data:`KEEP_S` are deleted.  With several engines on one database the first
engine that holds the subscription answers; one that does not hold it answers
``unknown_subscription`` only when no request of that subscription could be for another engine
(``engine_id`` "default", the single-engine case) -- otherwise it leaves the row.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text

from engine.evaluation.key_series import key_series
from engine.runtime.poll_thread import PollThread
from tidewatch.settings import Settings

log = logging.getLogger("tidewatch.engine")

#: error codes written to ``chart_requests.error`` (the dashboard tells them apart by code)
UNKNOWN_SUBSCRIPTION = "unknown_subscription"  # the engine holds no such rule (not yet, or refused)
NO_STATE = "no_state"  # the engine has not looked any rule up yet
EXPIRED = "expired"  # the request waited longer than MAX_AGE_S
FAILED = "failed"  # computing the answer raised (logged)
ERRORS = (UNKNOWN_SUBSCRIPTION, NO_STATE, EXPIRED, FAILED)
#: a request older than this (seconds) is answered EXPIRED, not computed
MAX_AGE_S = 60
#: answered or not, rows older than this (seconds) are deleted
KEEP_S = 3600
#: requests answered per pass
BATCH = 20


def compute_answer(
    core: Any, subscription_id: str, key: str, pane_ms: int
) -> tuple[dict[str, Any] | None, str | None]:
    """``(answer, None)`` or ``(None, error code)`` for one request, from ``core``
    (:class:`engine.core.EngineCore`: its evaluator's rules and retained history, its
    ``applied_until``).  Reads the state only; call it holding :attr:`ChartAnswers.lock`."""
    ev = core.evaluator
    rule = getattr(ev, "rules", {}).get(subscription_id)
    if rule is None:
        return None, UNKNOWN_SUBSCRIPTION
    until = core.applied_until
    if until is None:
        return None, NO_STATE
    t0 = time.perf_counter()
    series = key_series(ev.retained(rule.plan.stream), rule.plan, key, int(until), pane_ms)
    out = series.to_json()
    out["compute_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    out["pane_ms"] = pane_ms
    out["history_ms"] = getattr(ev, "history_ms", None)
    return out, None


def answer_safely(
    core: Any, rid: int, subscription_id: str, key: str, pane_ms: int
) -> tuple[dict[str, Any] | None, str | None]:
    """:func:`compute_answer`, a request that raises answered ``failed`` (logged): a bad request
    must not stop the engine (the driver's answering thread, or a shard's task)."""
    try:
        return compute_answer(core, subscription_id, key, pane_ms)
    except Exception:
        log.exception("chart request %d (%s, %r) failed", rid, subscription_id, key)
        return None, FAILED


class ChartAnswers:
    """Answers the key page's chart requests (see the module docstring).  ``db``: the engine's
    SQLAlchemy engine (the store's); ``engine_id``: written as ``answered_by``."""

    def __init__(self, db: Engine, settings: Settings, engine_id: str = "default") -> None:
        self.db = db
        self.engine_id = engine_id
        self.pane_ms = int(settings.pane_ms)
        self.poll_s = float(settings.chart_answer_poll_s)
        #: held by the evaluation thread while it changes the state, and here while reading it
        self.lock = threading.Lock()
        self._thread: PollThread | None = None
        self._last_cleanup = 0.0

    def pending(self) -> list[tuple[int, str, str, float]]:
        """``(id, subscription id, key, age in s)`` of the requests not answered yet, oldest first."""
        with self.db.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, subscription_id, key, EXTRACT(EPOCH FROM now() - requested_at) "
                    "FROM chart_requests WHERE answered_at IS NULL ORDER BY requested_at LIMIT :n"
                ),
                {"n": BATCH},
            ).all()
        return [(int(r[0]), str(r[1]), str(r[2]), float(r[3])) for r in rows]

    def answer(self, get_core: Callable[[], Any]) -> int:
        """One pass: answer the pending requests (the state read under :attr:`lock`); how many
        were answered from the state (expired ones besides: :meth:`due`)."""
        todo = self.due()
        if not todo:
            return 0
        with self.lock:
            core = get_core()
            done = [(rid, *answer_safely(core, rid, sid, key, self.pane_ms)) for rid, sid, key in todo]
        return self.write(done)

    def due(self) -> list[tuple[int, str, str]]:
        """The pending requests to answer now, ``(id, subscription id, key)``: those older than
        :data:`MAX_AGE_S` are answered ``expired`` here (and old rows deleted, once a minute)."""
        pending = self.pending()
        self.cleanup()
        self.write([(rid, None, EXPIRED) for rid, _, _, age in pending if age > MAX_AGE_S])
        return [(rid, sid, key) for rid, sid, key, age in pending if age <= MAX_AGE_S]

    def write(self, done: list[tuple[int, dict[str, Any] | None, str | None]]) -> int:
        """Write the answers ``(id, answer, error)``; how many were written.  An
        ``unknown_subscription`` is not written by a named engine (``engine_id`` other than
        "default"): the subscription may be another engine's, and the row is left to it."""
        if self.engine_id != "default":
            done = [d for d in done if d[2] != UNKNOWN_SUBSCRIPTION]
        if not done:
            return 0
        with self.db.begin() as conn:
            for rid, got, err in done:
                conn.execute(
                    text(
                        "UPDATE chart_requests SET answered_at = now(), answered_by = :by, "
                        "answer = CAST(:answer AS jsonb), error = :error "
                        "WHERE id = :id AND answered_at IS NULL"
                    ),
                    {
                        "id": rid,
                        "by": self.engine_id,
                        "answer": None if got is None else json.dumps(got),
                        "error": err,
                    },
                )
        return len(done)

    def cleanup(self) -> None:
        now = time.monotonic()
        if now - self._last_cleanup < 60:
            return
        self._last_cleanup = now
        with self.db.begin() as conn:
            conn.execute(
                text("DELETE FROM chart_requests WHERE requested_at < now() - make_interval(secs => :s)"),
                {"s": KEEP_S},
            )

    # ------------------------------------------------------------------ the thread
    def start(self, get_core: Callable[[], Any]) -> None:
        """Answer requests every ``chart_answer_poll_s`` in a daemon thread until :meth:`stop`;
        ``get_core`` gives the engine's current core (a restart's recovery replaces it)."""
        if self._thread is None:
            self._thread = PollThread(
                "tidewatch-charts", self.poll_s, lambda: self.answer(get_core), "chart requests not answered"
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread (waits for the pass in progress)."""
        t, self._thread = self._thread, None
        if t is not None:
            t.stop()
