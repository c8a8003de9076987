"""The key page's charts with shards: chart requests answered by the shard that owns the key.

The driver's engine answers ``chart_requests`` from its core in a thread
(:mod:`engine.sinks.charts`).  With shards the state is in the executors' Python workers, by key,
and PostgreSQL stays the driver's: so the requests go to the shards the way the overload strides
do (:mod:`engine.shards.strides`), through a file of the engine's checkpoint directory.

1. After delivering a batch (at most every ``chart_answer_poll_s``) the driver reads the pending
   requests (:meth:`engine.sinks.charts.ChartAnswers.due`: those older than
   :data:`~engine.sinks.charts.MAX_AGE_S` answered ``expired`` there), and writes the others to
   ``<checkpoint>/tidewatch/chart_requests.json`` (:class:`RequestFile`, replaced whole);
2. in the next batch's task each shard, after its batch (the state between two batches, as the
   driver's engine answers), answers the requests of the keys it owns
   (:func:`answer_owned`, :func:`engine.sinks.charts.answer_safely` on its own core: every
   shard holds every rule and all of its keys' history) in its :class:`~engine.shards.step.ShardMeta`;
3. the driver writes the answers with the batch after (:meth:`ShardCharts.after_batch`).

So an answer comes within two batches.  An idle engine runs no batch (Spark runs one only for
new data): while no batch came for longer than its idle wait, the driver's thread
(:meth:`ShardCharts.start`) looks for requests every ``chart_answer_poll_s`` and, when some wait,
hands them over and writes a tick (:mod:`engine.shards.ticks`) -- Spark runs one batch for it, the
shards answer, and the driver writes the answers as after any batch.  One tick at a time: the
next only after a batch came, or :data:`TICK_RETRY_S` without one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from engine.runtime.poll_thread import PollThread
from engine.runtime.snapshot_writer import atomic_write
from engine.shards.json_file import read_json
from engine.shards.route import shard_of
from engine.shards.ticks import TickDir
from engine.sinks.charts import ChartAnswers, answer_safely

__all__ = ["TICK_RETRY_S", "RequestFile", "ShardCharts", "answer_owned"]

log = logging.getLogger("tidewatch.engine")

#: a tick whose batch has not come after this long (s) is written again
TICK_RETRY_S = 30.0
#: more tick files than this waiting: Spark is not deleting them (warned)
PILED_UP = 100

#: a request: (id, subscription id, key)
Request = tuple[int, str, str]
#: an answer: (the answer's JSON object, None) or (None, an error code)
Answer = tuple[dict[str, Any] | None, str | None]


def _requests(doc: Any) -> list[Request]:
    if not isinstance(doc, list):
        raise ValueError("not a list of requests")
    return [(int(r), str(s), str(k)) for r, s, k in doc]


class RequestFile:
    """The pending chart requests the driver hands the shards (module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def read(self) -> list[Request]:
        return read_json(self.path, "the chart requests file", [], _requests)

    def write(self, requests: list[Request]) -> None:
        """Replace the file's requests (written only when they changed)."""
        if requests == self.read():
            return
        atomic_write(self.path, json.dumps(requests).encode())


def answer_owned(core: Any, shard: int, n: int, requests: list[Request], pane_ms: int) -> dict[int, Answer]:
    """The answers of the requests whose key shard ``shard`` of ``n`` owns, from its ``core``
    (between two batches); a request that fails is answered ``failed`` (logged), never raised."""
    if not requests:
        return {}
    owners = shard_of([k for _, _, k in requests], n).tolist()
    return {
        rid: answer_safely(core, rid, sid, key, pane_ms)
        for (rid, sid, key), owner in zip(requests, owners, strict=True)
        if owner == shard
    }


class ShardCharts:
    """The driver's side (module docstring): ``answers`` is the engine's
    :class:`~engine.sinks.charts.ChartAnswers` (its PostgreSQL reads and writes), ``requests``
    the file the shards read, ``ticks`` where a tick is written for an idle engine (None: none)."""

    def __init__(
        self, answers: ChartAnswers, requests: RequestFile, poll_s: float, ticks: TickDir | None = None
    ) -> None:
        self.answers, self.requests, self.poll_s, self.ticks = answers, requests, poll_s, ticks
        self._last_poll = 0.0
        #: held by the batch's delivery and the idle thread while each hands requests over
        self._lock = threading.Lock()
        self._last_batch = time.monotonic()
        #: a batch is running (:meth:`batch_started` .. :meth:`batch_ended`): not idle
        self._in_batch = False
        #: when the tick waiting for its batch was written (None: none waits)
        self._ticked: float | None = None
        self.ticks_written = 0
        self._thread: PollThread | None = None

    def batch_started(self) -> None:
        """``foreachBatch`` began: the engine is not idle until :meth:`batch_ended` (a batch may
        run longer than the idle wait)."""
        self._in_batch, self._last_batch = True, time.monotonic()

    def batch_ended(self) -> None:
        """``foreachBatch`` returned or raised (a batch run for a tick or not, delivered or
        skipped as committed): the idle wait counts from now, and no tick waits any more."""
        self._in_batch, self._last_batch, self._ticked = False, time.monotonic(), None

    def after_batch(self, answered: dict[int, Answer]) -> None:
        """Write the answers the shards gave with a batch; then, when a poll is due, hand the
        pending requests to the next batch's shards (expired ones answered here)."""
        with self._lock:
            self.answers.write([(rid, got, err) for rid, (got, err) in sorted(answered.items())])
            now = time.monotonic()
            if now - self._last_poll < self.poll_s and not answered:
                return
            self._last_poll = now
            self.requests.write(self.answers.due())

    def poll_idle(self, labels: list[int], idle_s: float) -> bool:
        """One look of the idle thread: when no batch runs or ended in the last ``idle_s`` and no
        tick waits for its batch, the pending requests handed over and a tick written (one row per shard label);
        whether it wrote one."""
        if self.ticks is None:
            return False
        with self._lock:
            now = time.monotonic()
            if self._in_batch or now - self._last_batch < idle_s:
                return False
            if self._ticked is not None and now - self._ticked < TICK_RETRY_S:
                return False
            due = self.answers.due()
            if not due:
                return False
            self.requests.write(due)
            self.ticks.write(labels)
            self._ticked = now
            self.ticks_written += 1
        log.info("%d chart requests wait on an idle stream: a batch is run for them (a tick)", len(due))
        if len(left := self.ticks.pending()) > PILED_UP:
            log.warning(
                "%d tick files in %s: Spark's file source does not delete them", len(left), self.ticks.path
            )
        return True

    def start(self, labels: list[int], idle_s: float) -> None:
        """Look for requests on an idle engine every ``poll_s`` in a daemon thread until
        :meth:`stop` (:meth:`poll_idle`)."""
        if self._thread is None and self.ticks is not None:
            self._thread = PollThread(
                "tidewatch-chart-ticks",
                self.poll_s,
                lambda: self.poll_idle(labels, idle_s),
                "chart requests not handed to the shards",
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread (waits for the look in progress)."""
        t, self._thread = self._thread, None
        if t is not None:
            t.stop()
