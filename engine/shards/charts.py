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

So an answer comes within two batches; an idle engine (Spark runs no batch without new records)
leaves requests to the dashboard's Kafka fallback, which it offers after
``dashboard_chart_wait_s`` (docs/engine.md, "Sharded evaluation").
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from engine.runtime.snapshot_writer import atomic_write
from engine.shards.json_file import read_json
from engine.shards.route import shard_of
from engine.sinks.charts import ChartAnswers, answer_safely

__all__ = ["RequestFile", "ShardCharts", "answer_owned"]

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
    the file the shards read."""

    def __init__(self, answers: ChartAnswers, requests: RequestFile, poll_s: float) -> None:
        self.answers, self.requests, self.poll_s = answers, requests, poll_s
        self._last_poll = 0.0

    def after_batch(self, answered: dict[int, Answer]) -> None:
        """Write the answers the shards gave with a batch; then, when a poll is due, hand the
        pending requests to the next batch's shards (expired ones answered here)."""
        self.answers.write([(rid, got, err) for rid, (got, err) in sorted(answered.items())])
        now = time.monotonic()
        if now - self._last_poll < self.poll_s and not answered:
            return
        self._last_poll = now
        self.requests.write(self.answers.due())
