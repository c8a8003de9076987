"""Produce column chunks of trades / packets to Kafka: encoded in batches, paced, accounted for.

* **Encoding** is done a chunk at a time by :func:`ingest.avro.encode_batch`
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

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ingest.avro import Coded, encode_batch
from tidewatch.settings import get_settings


class ProducerLike(Protocol):
    def produce(self, topic: str, value: bytes | None = ..., key: bytes | None = ...) -> None: ...
    def poll(self, timeout: float = ...) -> int: ...
    def flush(self, timeout: float = ...) -> int: ...
    def __len__(self) -> int: ...


def producer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """librdkafka settings for high-rate, loss-free production."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
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
    ``anchor_ts``: the ``ts`` that maps to the start (default: the first event's;
    with ``anchor_ts=now_ms`` a live stream is sent when the wall clock reaches
    each event's ``ts``).
    """

    def __init__(
        self, *, speed: float | None = None, rate: float | None = None, anchor_ts: int | None = None
    ):
        if speed is not None and speed <= 0:
            raise ValueError("speed must be > 0")
        if rate is not None and rate <= 0:
            raise ValueError("rate must be > 0")
        self.speed, self.rate = speed, rate
        self.anchor_ts = anchor_ts
        self.wall0 = time.monotonic()
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


def ensure_topic(bootstrap: str, topic: str, partitions: int | None = None, timeout: float = 30.0) -> bool:
    """Create ``topic`` if the broker lacks it (the embedded broker does not auto-create); True if created."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=timeout).topics:
        return False
    n = partitions or get_settings().topic_partitions
    fut = admin.create_topics(
        [NewTopic(topic, num_partitions=n, replication_factor=1)], operation_timeout=timeout
    )[topic]
    try:
        fut.result(timeout=timeout)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise
        return False
    return True


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
        topic: str | None = None,
        bootstrap: str | None = None,
        key_field: str | None = None,
        producer: ProducerLike | None = None,
        on_progress: Callable[[FeedStats, int], None] | None = None,
        poll_every: int = 2000,
        create_topic: bool = True,
        **conf: Any,
    ) -> None:
        s = get_settings()
        self.stream = stream
        self.topic = topic or {"trades": s.topic_trades, "packets": s.topic_packets}[stream]
        self.key_field = key_field or ("symbol" if stream == "trades" else s.packets_key)
        self.stats = FeedStats()
        self.on_progress = on_progress
        self.poll_every = poll_every
        if producer is None:
            from confluent_kafka import Producer

            bootstrap = bootstrap or s.kafka_bootstrap
            if create_topic:
                ensure_topic(bootstrap, self.topic)
            producer = Producer(producer_config(bootstrap, on_delivery=self._on_error, **conf))
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
