"""The engine's event-time clock as pure functions: the watermark's advance and the last lookup.

:class:`engine.core.EngineCore` keeps the clock's state (``part_max``, ``unheard``, the watermark,
``applied_until``) and advances it once per batch with :func:`advance` and the lookups up to
*now*.  Because these are pure, the clock after a batch can be computed before the batch is
evaluated -- from the batch's per-partition event-time maxima alone -- which is what lets the
executors mode pipeline: batch N+1's ``late`` bound and watermark (``BatchParams``) are the
values the core will have after batch N, known as soon as batch N's executor output is merged
(:meth:`engine.core.EngineCore.params_after`).  The definitions are those of docs/engine.md,
"Time and exactness".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Partition = tuple[str, int]  #: (stream, Kafka partition)


@dataclass(frozen=True)
class Step:
    """The clock after one batch: ``wm`` (never below the one before), ``max_ts`` (None: no
    event seen yet, unchanged) and ``unheard`` (a new dict)."""

    wm: int | None
    max_ts: int | None
    unheard: dict[Partition, int]


def advance(
    part_max: Mapping[Partition, int],
    unheard: Mapping[Partition, int],
    wm: int | None,
    delivered: set[Partition],
    waiting: Iterable[Partition] | None,
    *,
    idle_timeout_ms: int,
    lateness_ms: int,
) -> Step:
    """The per-partition watermark with an idle timeout after a batch (deterministic: a replay
    of the same batches decides the same way).  ``part_max``: the largest valid event time of
    every (stream, partition) seen, this batch's included; ``delivered``: the partitions this
    batch had valid events of.

    ``waiting``: the (stream, partition)s with records in Kafka this batch could not read yet
    (written, not yet committed/visible: :meth:`engine.app.EngineApp._waiting`, logged with the
    batch so a replay decides the same way).  A partition no event has come from yet that is
    waiting holds the watermark where it is for one batch with events: records of several
    partitions, even of one Kafka transaction, become visible partition by partition (each
    partition's last stable offset moves when its commit marker is written), so the first batch
    of a backlog may hold one stream's events and not yet the other's -- whose first events
    would otherwise be ``late`` at once.  The next batch reads them.  A partition with nothing
    written (a topic nobody produces to) holds nothing.

    The watermark is ``min(max ts of each active partition) - allowed lateness``, where a
    partition is *active* when it delivered records in this batch or its largest event time is
    within ``idle_timeout_ms`` of the largest one seen.  During a backlog drain Spark's Kafka
    source gives every partition that has data some records in every micro-batch
    (``maxOffsetsPerTrigger`` is prorated), so a lagging partition holds the watermark back
    instead of having its events dead-lettered as ``late``; a partition that has gone quiet
    stops holding it back once the others are ``idle_timeout_ms`` ahead of it.  The watermark
    never decreases."""
    heard = dict(unheard)
    hold = False
    for k in waiting or ():
        if delivered and k not in part_max and not heard.get(k):
            heard[k] = 1
            hold = True
    for k in delivered:
        heard.pop(k, None)
    if not part_max:
        return Step(wm, None, heard)
    top = max(part_max.values())
    if hold:
        return Step(wm, top, heard)
    active = [m for k, m in part_max.items() if k in delivered or top - m <= idle_timeout_ms]
    cand = (min(active) if active else top) - lateness_ms
    return Step(cand if wm is None else max(wm, cand), top, heard)


def merged_maxima(part_max: Mapping[Partition, int], batch: Mapping[Partition, int]) -> dict[Partition, int]:
    """``part_max`` with a batch's per-partition maxima taken in (a new dict)."""
    out = dict(part_max)
    for k, top in batch.items():
        old = out.get(k)
        out[k] = int(top) if old is None else max(old, int(top))
    return out


def last_lookup(applied_until: int, wm: int | None, every_ms: int) -> int:
    """``applied_until`` after a batch's lookups: the core looks up at ``applied_until + L``,
    ``+ 2L``, ... up to *now* (the watermark floored to ``L``), so the last of them, or
    ``applied_until`` when none is due."""
    if wm is None:
        return applied_until
    now = (wm // every_ms) * every_ms
    k = (now - applied_until) // every_ms
    return applied_until + k * every_ms if k >= 1 else applied_until
