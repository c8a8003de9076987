"""Produce column chunks of trades / packets to Kafka: encoded in batches, paced, accounted for.

* **Encoding** is done a chunk at a time by :func:`tidewatch.wire.avro.encode_batch`
  (one Numba pass); the per-message work left in Python is the
  ``Producer.produce`` call itself.
* **Delivery** is checked: the producer is idempotent (``enable.idempotence``:
  acks=all, ordered retries without duplicates), delivery reports are requested
  for failures only (``delivery.report.only.error``) so the success path costs
  nothing, and at the end :meth:`KafkaFeed.close` flushes and counts whatever is
  still unconfirmed -- ``produced = delivered + failed + unconfirmed``; nothing
  is silently lost.
* **Pacing** (:class:`Pacer`): as fast as possible, at the recorded pace of the
  events' ``ts`` times a speed factor, and/or at most ``rate`` events/s.
* **Progress**: a rich progress line with totals and the current rate; Ctrl-C
  is handled by the CLI, which calls :meth:`KafkaFeed.close` for the final count.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ingest.errors import IngestError
from tidewatch.kafka.client import client_config, librdkafka_config
from tidewatch.settings import Settings
from tidewatch.wire.avro import Coded, encode_batch


class ProducerLike(Protocol):
    def produce(self, topic: str, value: bytes | None = ..., key: bytes | None = ...) -> None: ...
    def poll(self, timeout: float = ...) -> int: ...
    def flush(self, timeout: float = ...) -> int: ...
    def __len__(self) -> int: ...


def producer_config(settings: Settings, bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """librdkafka settings for high-rate, loss-free production, as the ``feed`` principal."""
    conf: dict[str, Any] = {
        **librdkafka_config(settings, "feed", bootstrap),
        "enable.idempotence": True,  # acks=all, retries, no duplicates, per-partition order
        "linger.ms": 25,
        "batch.size": 1_000_000,
        "batch.num.messages": 100_000,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "delivery.report.only.error": True,
        "message.timeout.ms": 120_000,
        "client.id": "tidewatch-feed",
    }
    conf.update(overrides)
    return conf


@dataclass
class FeedStats:
    """Running totals of a feed."""

    produced: int = 0
    failed: int = 0
    bytes: int = 0
    bad_input: int = 0
    first_errors: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    unconfirmed: int = 0  # set by close()
    retried_slices: int = 0  # resumable feeds: transactions aborted and sent again
    last_ts: int | None = None

    @property
    def elapsed(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    @property
    def rate(self) -> float:
        return self.produced / self.elapsed

    def delivered(self, in_flight: int) -> int:
        return self.produced - self.failed - in_flight

    def summary(self) -> str:
        delivered = self.produced - self.failed - self.unconfirmed
        return (
            f"produced {self.produced:,}, delivered {delivered:,}, failed {self.failed:,}, "
            f"unconfirmed {self.unconfirmed:,}, bad input lines {self.bad_input:,}, "
            f"{self.bytes / 1e6:,.1f} MB in {self.elapsed:,.1f} s ({self.rate:,.0f} events/s)"
        )


class Pacer:
    """When each event may be sent (``time.monotonic`` seconds), or ``None`` for no limit.

    ``speed``: replay at ``speed`` × the recorded pace of ``ts`` (1.0 = real
    time; ``None`` = as fast as possible).  ``rate``: at most this many events/s.
    ``anchor_ts``: the ``ts`` that maps to the start (default: the first event's).
    ``wall_clock``: ``anchor_ts`` is a time of the wall clock, not "now": an event is due when
    the clock reaches its ``ts`` (``speed`` 1), so events whose time passed while something
    else ran (the demo's history backfill) are sent at once and the stream then keeps to real
    time -- instead of trailing the clock by that delay for ever.
    """

    def __init__(
        self,
        *,
        speed: float | None = None,
        rate: float | None = None,
        anchor_ts: int | None = None,
        wall_clock: bool = False,
    ):
        if speed is not None and speed <= 0:
            raise ValueError("speed must be > 0")
        if rate is not None and rate <= 0:
            raise ValueError("rate must be > 0")
        if wall_clock and anchor_ts is None:
            raise ValueError("wall_clock needs anchor_ts")
        self.speed, self.rate = speed, rate
        self.anchor_ts = anchor_ts
        self.wall0 = time.monotonic()
        if wall_clock:  # the monotonic time at which the wall clock read anchor_ts
            self.wall0 -= time.time() - anchor_ts / 1000.0  # type: ignore[operator]
        self.sent = 0

    @property
    def unlimited(self) -> bool:
        return self.speed is None and self.rate is None

    def targets(self, ts: np.ndarray) -> np.ndarray | None:
        if self.unlimited or len(ts) == 0:
            return None
        out = np.full(len(ts), self.wall0)
        if self.speed is not None:
            if self.anchor_ts is None:
                self.anchor_ts = int(ts[0])
            out = np.maximum(out, self.wall0 + (ts - self.anchor_ts) / 1000.0 / self.speed)
        if self.rate is not None:
            out = np.maximum(out, self.wall0 + (self.sent + np.arange(len(ts))) / self.rate)
        self.sent += len(ts)
        return out


def ensure_topic(
    settings: Settings, bootstrap: str, topic: str, partitions: int | None = None, timeout: float = 30.0
) -> bool:
    """Create ``topic`` if the broker lacks it (the embedded broker does not auto-create); True if created.

    One of Tidewatch's topics is created as the topic spec has it
    (:func:`tidewatch.kafka.topics.topic_spec`), any other (a custom ``--topic``, a test's
    scratch topic) with the streams' defaults and ``partitions`` partitions when given
    (:func:`tidewatch.kafka.topics.stream_topic_spec`)."""
    from confluent_kafka.admin import AdminClient

    from tidewatch.kafka.topics import create_topics, spec_for

    spec = spec_for(topic, settings, partitions or None)
    admin = AdminClient(librdkafka_config(settings, "feed", bootstrap))
    return create_topics(admin, [spec], timeout=timeout)[topic] == "created"


#: How many offsets before the end of each partition ``newest_event_ms`` reads: on a topic written in
#: transactions the last offsets are commit markers, not records.
NEWEST_TAIL = 64


def newest_event_ms(
    settings: Settings, bootstrap: str, topic: str, stream: str, timeout: float = 10.0
) -> int | None:
    """The largest event time (``ts``) among the last committed records of each partition of
    ``topic`` (the last ``NEWEST_TAIL`` offsets, read to the end: a transactional writer leaves
    commit markers there); None if the topic is empty, missing or cannot be read (e.g. a
    principal without read rights).  A restarted demo feed starts its history backfill after it:
    events older than what the engine has already seen would all be late (dead letters)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    from tidewatch.wire.avro import decode

    s = settings
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **client_config(s, "feed"),
            "group.id": "tidewatch-feed-newest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    newest: int | None = None
    try:
        meta = c.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        tails = []
        for part in meta.partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, part), timeout=timeout)
            if hi > lo:
                tails.append(TopicPartition(topic, part, max(lo, hi - NEWEST_TAIL)))
        if not tails:
            return None
        c.assign(tails)
        open_parts = {tp.partition for tp in tails}
        deadline = time.monotonic() + timeout
        while open_parts and time.monotonic() < deadline:
            for m in c.consume(64, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        open_parts.discard(m.partition())
                    continue
                value = m.value()
                if value is None:
                    continue
                try:
                    ts = int(decode(value, stream)["ts"])
                except Exception:  # noqa: BLE001 - not a record of this stream
                    continue
                newest = ts if newest is None else max(newest, ts)
    except KafkaException:
        return None
    finally:
        c.close()
    return newest


def key_table(column: Any) -> tuple[list[bytes], list[int]]:
    """``(distinct keys as UTF-8 bytes, code of each row)`` of a key column."""
    c = Coded.of(column)
    return [v.encode("utf-8") for v in c.values], c.codes.tolist()


class KafkaFeed:
    """Sends column chunks of one stream to one topic."""

    def __init__(
        self,
        stream: str,
        *,
        settings: Settings,
        topic: str | None = None,
        bootstrap: str | None = None,
        key_field: str | None = None,
        producer: ProducerLike | None = None,
        on_progress: Callable[[FeedStats, int], None] | None = None,
        poll_every: int = 2000,
        create_topic: bool = True,
        **conf: Any,
    ) -> None:
        s = settings
        self.stream = stream
        self.topic = topic or s.stream_topic(stream)
        self.key_field = key_field or ("symbol" if stream == "trades" else s.packets_key)
        self.stats = FeedStats()
        self.on_progress = on_progress
        self.poll_every = poll_every
        if producer is None:
            from confluent_kafka import Producer

            bootstrap = bootstrap or s.kafka_bootstrap
            if create_topic:
                ensure_topic(s, bootstrap, self.topic)
            producer = Producer(producer_config(s, bootstrap, on_delivery=self._on_error, **conf))
        self.producer: ProducerLike = producer
        self._last_progress = 0.0
        #: set (e.g. by a SIGINT handler) to stop sending after the current slice
        self.stopping = False

    # delivery reports arrive for failures only (delivery.report.only.error)
    def _on_error(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.stats.failed += 1
            if len(self.stats.first_errors) < 10:
                self.stats.first_errors.append(str(err))

    def in_flight(self) -> int:
        return len(self.producer)

    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress is not None and (force or now - self._last_progress > 0.2):
            self._last_progress = now
            self.on_progress(self.stats, self.in_flight())

    def send(self, columns: Mapping[str, Any], pacer: Pacer | None = None) -> int:
        """Encode and produce one chunk (events in ``ts`` order); returns how many were produced
        (fewer than the chunk's rows only when :attr:`stopping` was set)."""
        enc = encode_batch(self.stream, columns)
        n = len(enc)
        if n == 0:
            return 0
        keys, kcodes = key_table(columns[self.key_field])
        data = enc.buf.tobytes()
        off = enc.offsets.tolist()
        ts = np.asarray(columns["ts"], dtype=np.int64)
        targets = pacer.targets(ts) if pacer is not None else None
        produce, poll, topic = self.producer.produce, self.producer.poll, self.topic
        step = self.poll_every
        i = 0
        while i < n and not self.stopping:
            hi = min(n, i + step)
            if targets is not None:
                now = time.monotonic()
                ready = int(np.searchsorted(targets, now, side="right"))
                if ready <= i:  # nothing due yet: wait (serving callbacks meanwhile)
                    wait = min(float(targets[i]) - now, 0.1)
                    if wait > 0.002:
                        poll(wait)
                    else:
                        time.sleep(max(wait, 0))
                    self._progress()
                    continue
                hi = min(hi, ready)
            j = i
            try:
                for j in range(i, hi):
                    produce(topic, data[off[j] : off[j + 1]], keys[kcodes[j]])
                j = hi
            except BufferError:  # local queue full: let librdkafka drain, then go on from j
                poll(0.05)
            finally:  # counted even when interrupted mid-slice
                self.stats.produced += j - i
                self.stats.bytes += off[j] - off[i]
            i = j
            poll(0)
            self._progress()
        if i:
            self.stats.last_ts = int(ts[i - 1])
        return i

    def close(self, timeout: float = 30.0) -> FeedStats:
        """Flush; whatever is still queued after ``timeout`` s is counted as unconfirmed."""
        deadline = time.monotonic() + timeout
        remaining = self.in_flight()
        while remaining and time.monotonic() < deadline:
            remaining = self.producer.flush(min(1.0, max(deadline - time.monotonic(), 0.0)))
            self._progress()
        self.stats.unconfirmed = remaining
        self._progress(force=True)
        return self.stats


# --------------------------------------------------------------------------- resumable file feeds
def file_identity(path: str | Path, head_bytes: int = 65_536) -> dict[str, Any]:
    """What makes a file "the same file" for a resumed feed: absolute path, size, mtime and
    the SHA-256 of its first ``head_bytes`` bytes."""
    p = Path(path).resolve()
    st = p.stat()
    with open(p, "rb") as fh:
        head = hashlib.sha256(fh.read(head_bytes)).hexdigest()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_sha256": head}


def feed_id(path: str | Path, topic: str) -> str:
    """Stable id of "this file into this topic": names the transactional id, the progress group
    and the default progress file."""
    return hashlib.sha1(f"{Path(path).resolve()}\0{topic}".encode()).hexdigest()[:16]


def default_progress_path(settings: Settings, stream: str, topic: str, path: str | Path) -> Path:
    """``<run_dir>/feed-progress/<stream>-<topic>-<feed id>.json`` (``feed_progress_dir`` overrides the dir)."""
    base = settings.feed_progress_dir or (settings.run_dir / "feed-progress")
    return Path(base) / f"{stream}-{topic}-{feed_id(path, topic)}.json"


def slice_columns(columns: Mapping[str, Any], lo: int, hi: int) -> dict[str, Any]:
    """Rows ``lo:hi`` of a column chunk (``Coded`` columns keep their dictionary)."""
    out: dict[str, Any] = {}
    for k, v in columns.items():
        out[k] = Coded(v.codes[lo:hi], v.values) if isinstance(v, Coded) else v[lo:hi]
    return out


def _rows(columns: Mapping[str, Any]) -> int:
    return len(columns["ts"])


class ProgressMismatch(IngestError, RuntimeError):
    """The progress file describes another file (or another topic) than the one being fed."""


@dataclass
class FeedProgress:
    """The progress file of a resumable feed (JSON, replaced atomically).

    ``run`` names this feed of this file (a new progress file, a new run: deleting the file
    starts over).  ``records`` is how many records of the file (in file order, bad lines not counted)
    are in committed Kafka transactions.  The authoritative copy of that number is
    committed *inside* each transaction (see :class:`TransactionalFeed`); this file
    keeps the file's identity and a readable copy of the count.
    """

    path: Path
    identity: dict[str, Any]
    topic: str
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    records: int = 0
    done: bool = False

    @classmethod
    def open(cls, path: Path, identity: dict[str, Any], topic: str) -> FeedProgress:
        """Load ``path`` (checking it describes this file and topic) or start a new one."""
        if not path.exists():
            new = cls(path, identity, topic)
            new.save()  # the run id must be on disk before the first transaction
            return new
        d = json.loads(path.read_text())
        if d.get("identity") != identity or d.get("topic") != topic:
            raise ProgressMismatch(
                f"{path} records the progress of {d.get('identity', {}).get('path')} "
                f"(size {d.get('identity', {}).get('size')}, into topic {d.get('topic')}), "
                f"not of this file as it is now ({identity['path']}, size {identity['size']}, "
                f"topic {topic}); delete it to feed the file from the start"
            )
        return cls(path, identity, topic, str(d["run"]), int(d.get("records", 0)), bool(d.get("done", False)))

    def save(self) -> None:
        """Write atomically (temporary file, fsync, rename)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        body = {
            "identity": self.identity,
            "topic": self.topic,
            "run": self.run,
            "records": self.records,
            "done": self.done,
        }
        with open(tmp, "w") as fh:
            json.dump(body, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


class TransactionalFeed(KafkaFeed):
    """A file feed that can be killed and resumed with every record on the topic exactly once
    (for consumers reading with ``isolation.level=read_committed``, as the engine does).

    Records go out in Kafka transactions of at most ``commit_every`` records.  Each
    transaction also commits the progress -- the number of records of the file sent so far --
    as the offset of a private consumer group (``tidewatch-feed-<feed id>-<run>``, partition 0 of
    the topic) with ``send_offsets_to_transaction``, so records and progress commit or abort
    together (the engine's progress marker, engine/sinks/publish.py, works the same way).  The
    ``transactional.id`` is fixed per file and topic: a restarted feed's
    ``init_transactions()`` fences a zombie and aborts its open transaction, whose records
    read_committed consumers never see.  On start the feed skips the records the group says
    are committed.  After each commit the progress file is rewritten (atomically); it is a
    readable copy and holds the file's identity, which must match to resume.
    """

    def __init__(
        self,
        stream: str,
        progress: FeedProgress,
        *,
        settings: Settings,
        topic: str | None = None,
        bootstrap: str | None = None,
        commit_every: int | None = None,
        on_progress: Callable[[FeedStats, int], None] | None = None,
    ) -> None:
        from confluent_kafka import Consumer, Producer

        s = settings
        bootstrap = bootstrap or s.kafka_bootstrap
        self.commit_every = commit_every or s.feed_commit_every
        self.progress = progress
        fid = feed_id(progress.identity["path"], progress.topic)
        self.transactional_id = f"tidewatch-feed-{fid}-{progress.run}"
        placeholder: Any = _Unset()  # the transactional producer is made below
        super().__init__(
            stream, settings=s, topic=progress.topic, on_progress=on_progress, producer=placeholder
        )
        ensure_topic(s, bootstrap, self.topic)
        conf = producer_config(
            s,
            bootstrap,
            on_delivery=self._on_error,
            **{"transactional.id": self.transactional_id, "transaction.timeout.ms": 120_000},
        )
        self.producer = Producer(conf)
        self._txn_producer = self.producer
        self._marker = Consumer(
            {
                "bootstrap.servers": bootstrap,
                **client_config(s, "feed"),  # SASL/SCRAM in the scram mode
                "group.id": self.transactional_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self._marker_tp = (self.topic, 0)
        # fences a previous feed of this file and aborts its open transaction
        self._txn_producer.init_transactions(60)  # type: ignore[attr-defined]
        self.acked = self._committed_records()
        if self.acked != progress.records:  # the file lags when killed between commit and rewrite
            progress.records = self.acked
            progress.save()
        #: records of the file seen so far (skipped or sent)
        self.position = 0
        self.skipped = 0
        self._in_txn = False

    def _committed_records(self) -> int:
        from confluent_kafka import KafkaException, TopicPartition

        from tidewatch.kafka.codes import COORDINATOR, error_code

        deadline = time.monotonic() + 120
        while True:
            try:
                got = self._marker.committed([TopicPartition(*self._marker_tp)], timeout=30)[0]
                return max(int(got.offset), 0)
            except KafkaException as exc:
                if error_code(exc) not in COORDINATOR or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def send(self, columns: Mapping[str, Any], pacer: Pacer | None = None) -> int:
        """Skip the records already committed, send the rest in transactions; returns how many were sent."""
        from confluent_kafka import TopicPartition

        n = _rows(columns)
        lo = min(max(self.acked - self.position, 0), n)
        self.skipped += lo
        self.position += lo
        sent = 0
        p: Any = self._txn_producer
        while lo < n and not self.stopping:
            hi = min(n, lo + self.commit_every)
            p.begin_transaction()
            self._in_txn = True
            done = super().send(slice_columns(columns, lo, hi), pacer)
            if done < hi - lo:  # interrupted mid-slice: close() aborts the transaction
                return sent
            end = self.position + done
            offsets = [TopicPartition(*self._marker_tp, end)]
            try:
                self._retry(p.send_offsets_to_transaction, offsets, self._marker.consumer_group_metadata())
                self._retry(p.commit_transaction)
            except _AbortAndRetry:  # e.g. the broker restarted mid-transaction: send the slice again
                self._retry(p.abort_transaction)
                self._in_txn = False
                self.stats.retried_slices += 1
                continue
            self._in_txn = False
            self.acked = self.position = end
            self.progress.records = end
            self.progress.save()
            sent += done
            lo = hi
        return sent

    def _retry(self, call: Callable[..., Any], *args: Any, timeout: float = 120.0) -> None:
        """``call(*args, 10)`` until it succeeds: retriable errors (a broker restarting, a
        coordinator loading) are retried for ``timeout`` s; an error that needs the transaction
        aborted raises :class:`_AbortAndRetry`; others propagate."""
        from confluent_kafka import KafkaException

        from tidewatch.kafka.codes import AUTHORIZATION_FAILED, error_code

        deadline = time.monotonic() + timeout
        while True:
            try:
                call(*args, 10)
                return
            except KafkaException as exc:
                e = exc.args[0] if exc.args else None
                if error_code(e) in AUTHORIZATION_FAILED:
                    raise  # an ACL refuses (kafka_security=scram): sending again cannot help
                if e is not None and e.txn_requires_abort():
                    raise _AbortAndRetry(str(e)) from exc
                if e is None or not e.retriable() or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def close(self, timeout: float = 30.0) -> FeedStats:
        """Abort an unfinished transaction (its records are sent again on resume), then flush."""
        if self._in_txn:
            try:
                self._txn_producer.abort_transaction(timeout)  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - the next init_transactions aborts it anyway
                self.stats.first_errors.append(f"abort: {exc}")
            self._in_txn = False
        stats = super().close(timeout)
        # aborted records were produced but are not on the topic for read_committed readers
        stats.unconfirmed = 0
        self._marker.close()
        return stats

    def finish(self) -> None:
        """Mark the file as completely fed (after the source is exhausted)."""
        self.progress.done = True
        self.progress.save()


class _AbortAndRetry(IngestError):
    """The current transaction must be aborted; its slice is sent again in a new one."""


class _Unset:
    """Placeholder producer while :class:`TransactionalFeed` builds its own."""

    def __len__(self) -> int:
        return 0
