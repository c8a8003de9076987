"""Offsets lost to retention: found, dead-lettered and counted -- never a silent skip.

Spark's Kafka source runs with ``failOnDataLoss = false`` so that one partition whose oldest
records were deleted by the topic's retention (``retention.ms`` / ``retention.bytes``) before
the engine read them does not stop every stream; Spark then reads from the oldest offset
still there and only logs a warning.  The engine finds such a gap itself: a partition whose
first record in a batch comes after the batch's start offset (or that delivered none although
Spark's end offset moved) is a *candidate* (:func:`gap_candidates`; a gap can also be
transaction markers or aborted records, which read ``read_committed`` skips), and for the
candidates only the broker is asked for the partition's log-start offset
(:func:`lost_ranges`).  Offsets below it that the batch should have covered were deleted:
each lost range becomes one dead letter with reason ``lost`` (its first offset, the count
in the detail), so it reaches the dead-letter topic, the per-reason metrics and the
dashboard's Health view.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.dead_letter import DeadLetters
from engine.sources.offsets import Ends, Ranges

if TYPE_CHECKING:
    from tidewatch.settings import Settings

log = logging.getLogger("tidewatch.engine")


def gap_candidates(
    starts: Ends | None, ends: Ends | None, ranges: Ranges
) -> dict[tuple[str, int], tuple[int, int]]:
    """``{(topic, partition): (start, first offset read or end)}`` of the partitions where the
    batch ``[start, end)`` does not begin with a record at ``start`` (``ranges``: the first and
    last offsets of the records read, :func:`engine.sources.readers.offset_ranges`)."""
    if starts is None or ends is None:
        return {}
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for topic, parts in ends.items():
        for p, end in parts.items():
            start = starts.get(topic, {}).get(p, 0)
            if end <= start:
                continue
            got = ranges.get(topic, {}).get(str(p))
            first = int(got[0]) if got else int(end)
            if first > start:
                out[(topic, p)] = (int(start), first)
    return out


def lost_ranges(
    candidates: dict[tuple[str, int], tuple[int, int]], log_start: dict[tuple[str, int], int]
) -> dict[tuple[str, int], tuple[int, int]]:
    """``{(topic, partition): (first lost, first kept)}``: the offsets of each candidate's gap
    below the partition's log-start offset (``log_start``), i.e. deleted before they were read."""
    out = {}
    for tp, (start, first) in candidates.items():
        kept = log_start.get(tp)
        if kept is not None and kept > start:
            out[tp] = (start, min(kept, first))
    return out


def dead_letters(lost: dict[tuple[str, int], tuple[int, int]], watermark: int | None) -> DeadLetters:
    """One ``lost`` dead letter per lost range (source offset: its first offset)."""
    dead = DeadLetters()
    for (topic, p), (a, b) in sorted(lost.items()):
        dead.add(
            topic,
            np.array([p]),
            np.array([a]),
            [None],
            [None],
            "lost",
            f"offsets {a}..{b - 1} ({b - a} records) of partition {p} were deleted by the topic's "
            "retention before the engine read them",
            None,
            watermark,
        )
    return dead


def batch_lost(
    bootstrap: str,
    settings: Settings,
    batch_id: int,
    starts: Ends | None,
    ends: Ends | None,
    ranges: Ranges,
    watermark: int | None,
) -> DeadLetters | None:
    """The ``lost`` dead letters of batch ``batch_id`` (Spark's ``[starts, ends)``, ``ranges``
    the offsets of the records read): :func:`gap_candidates`, the broker asked for those
    candidates' log-start offsets only (:func:`log_start_offsets`), :func:`lost_ranges`, each
    logged; None when nothing was lost.  Both engines call it (the driver's and the sharded)."""
    cand = gap_candidates(starts, ends, ranges)
    if not cand:
        return None
    lost = lost_ranges(cand, log_start_offsets(bootstrap, settings, sorted(cand)))
    if not lost:
        return None
    dead = dead_letters(lost, watermark)
    for d in dead.detail:
        log.error("batch %d: %s (dead-lettered as lost)", batch_id, d)
    return dead


def log_start_offsets(
    bootstrap: str, settings: Settings, parts: list[tuple[str, int]], timeout_s: float = 10.0
) -> dict[tuple[str, int], int]:
    """The log-start (earliest) offsets of ``parts``, asked of the broker as the ``engine``
    principal (confluent-kafka's ``AdminClient.list_offsets``)."""
    return _list_offsets(bootstrap, settings, parts, "earliest", timeout_s)


def log_end_offsets(
    bootstrap: str, settings: Settings, parts: list[tuple[str, int]], timeout_s: float = 10.0
) -> dict[tuple[str, int], int]:
    """The high watermarks of ``parts`` (every record written, committed or not)."""
    return _list_offsets(bootstrap, settings, parts, "latest", timeout_s)


def topic_partitions(
    bootstrap: str, settings: Settings, topics: list[str], timeout_s: float = 10.0
) -> list[tuple[str, int]]:
    """Every partition of ``topics``, from the cluster's metadata."""
    from confluent_kafka.admin import AdminClient

    from tidewatch.kafka.client import librdkafka_config

    admin: Any = _admin(AdminClient, librdkafka_config(settings, "engine", bootstrap))
    md = admin.list_topics(timeout=timeout_s).topics
    return [(t, int(p)) for t in topics if t in md for p in md[t].partitions]


def partitions_with_records(
    bootstrap: str, settings: Settings, parts: list[tuple[str, int]], timeout_s: float = 10.0
) -> list[tuple[str, int]]:
    """Those of ``parts`` that hold records (the high watermark, counting records not yet
    committed, above the log start offset)."""
    high = log_end_offsets(bootstrap, settings, parts, timeout_s)
    low = log_start_offsets(bootstrap, settings, parts, timeout_s)
    return [k for k in parts if high.get(k, 0) > low.get(k, 0)]


def _list_offsets(
    bootstrap: str, settings: Settings, parts: list[tuple[str, int]], spec: str, timeout_s: float
) -> dict[tuple[str, int], int]:
    """``AdminClient.list_offsets`` of ``parts``; an error Kafka marks retriable (a broker
    restarting, a leader moving) is retried for up to :data:`RETRY_S` seconds."""
    from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from tidewatch.kafka.client import librdkafka_config

    if not parts:
        return {}
    admin: Any = _admin(AdminClient, librdkafka_config(settings, "engine", bootstrap))
    want = OffsetSpec.earliest() if spec == "earliest" else OffsetSpec.latest()
    req = {TopicPartition(t, p): want for t, p in parts}
    level = IsolationLevel.READ_COMMITTED if spec == "earliest" else IsolationLevel.READ_UNCOMMITTED
    deadline = time.monotonic() + RETRY_S
    wait = 0.5
    while True:
        try:
            futs = admin.list_offsets(req, isolation_level=level, request_timeout=timeout_s)
            return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futs.items()}
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = isinstance(err, KafkaError) and (err.retriable() or err.code() in _TRANSIENT)
            if not retriable or time.monotonic() + wait > deadline:
                raise
            log.warning("asking Kafka for %s offsets failed (%s); retrying in %.1f s", spec, err, wait)
            time.sleep(wait)
            wait = min(2 * wait, 5.0)


#: one AdminClient per client configuration, kept for the process: a new client per call paid
#: its connection and metadata on every batch -- 1 s or 3 s of the Spark trigger, now and then,
#: in the live 10,000-rule run (the engine asks for the silent partitions' high watermarks at
#: every batch start); librdkafka reconnects a kept client by itself after a broker restart.
#: The last few configurations only (a process talking to brokers that are gone -- a test
#: session's -- does not keep clients reconnecting to them)
_ADMINS: OrderedDict[tuple[tuple[str, str], ...], Any] = OrderedDict()
_ADMINS_KEPT = 2
_ADMINS_LOCK = threading.Lock()


def _admin(make: Any, conf: dict[str, Any]) -> Any:
    """The process's AdminClient for ``conf`` (made by ``make(conf)`` the first time)."""
    key = tuple(sorted((str(k), repr(v)) for k, v in conf.items()))
    with _ADMINS_LOCK:
        admin = _ADMINS.get(key)
        if admin is None:
            admin = _ADMINS[key] = make(conf)
            while len(_ADMINS) > _ADMINS_KEPT:
                _ADMINS.popitem(last=False)
        _ADMINS.move_to_end(key)
        return admin


def _transient_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(
        {
            KafkaError._TRANSPORT,
            KafkaError._TIMED_OUT,
            KafkaError._ALL_BROKERS_DOWN,
            KafkaError.LEADER_NOT_AVAILABLE,
            KafkaError.NOT_LEADER_FOR_PARTITION,
            KafkaError.REQUEST_TIMED_OUT,
        }
    )


#: seconds a list-offsets request is retried through a broker restart
RETRY_S = 120.0
_TRANSIENT = _transient_codes()
