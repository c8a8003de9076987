"""Direct ingest for one machine: a librdkafka consumer in the driver instead of Spark's Kafka source.

``engine_source = "direct"`` (``tidewatch engine run --source direct``).  The default,
``"spark"``, reads Kafka with Spark's Kafka source and hands every micro-batch to
:meth:`engine.app.EngineApp.on_batch`; that is the shape that scales with executors on a
cluster (docs/engine.md, "Scale").  On a single small machine the same records cost far more
in Spark's JVM than in a consumer inside the driver: in the 10,000-rule live run
(``bench/engine_bench.py --live``) Spark's JVM spent more CPU reading the records than the whole
evaluation and delivery in the driver, and its read of a micro-batch slowed while alerts stormed
(docs/ARCHITECTURE.md, "Where we departed from the design brief"; the figures in
docs/measurements/engine.md, "Direct ingest on one machine").  This source gives the engine the
same batches -- an Arrow table of
:data:`engine.sources.readers.RECORD_COLUMNS`, the shape of Spark's ``toArrow()`` -- through
:meth:`engine.app.EngineApp.accept`, so decoding, evaluation, output and recovery are the same code.
The records are read by :class:`engine.sources.fetch_consumer.FetchConsumer`, which speaks Kafka's
Fetch API itself and parses the record batches into the Arrow buffers in a Numba kernel (no
allocation per record), or -- with a security protocol, or ``engine_kafka_client='librdkafka'``
-- by :class:`engine.sources.native_consumer.NativeConsumer`, which drives librdkafka and copies its
messages out in Numba kernels (confluent-kafka's ``Message`` objects, one per record, had capped
this source: docs/measurements/engine.md, "The native consumer"); metadata and end offsets go
through a confluent-kafka client of their own.

Exactly once without Spark's checkpoint: before a batch is handed over, the Kafka positions
after it (next offset of every assigned partition) are written to
``<checkpoint>/tidewatch/positions/<batch>.json``, then the app writes the batch's offset log
(``batches/<batch>.json``) as it does for Spark.  On start, :meth:`engine.app.EngineApp.recover`
brings the state to the last committed batch and finishes every logged batch; the source then resumes
from the positions of the newest logged batch, with the next batch id.  A positions file whose
batch has no offset log was never handed over: its records are read again as that batch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from engine.sources.fetch_consumer import FetchConsumer
from engine.sources.native_consumer import (
    ERR_FATAL,
    ERR_PARTITION_EOF,
    OFFSET_BEGINNING,
    Chunk,
    NativeConsumer,
)
from engine.sources.readers import engine_consumer, engine_consumer_config, offset_ranges

if TYPE_CHECKING:
    from tidewatch.settings import Settings

log = logging.getLogger("tidewatch.engine")

#: most messages one ``consume`` call returns (librdkafka's per-call cap is 1,000,000)
CONSUME_CHUNK = 50_000
#: longest a batch waits for a partition that has records but gave none yet
ALIGN_WAIT_S = 5.0


class RecordSink(Protocol):
    """What :class:`DirectSource` needs of the app it feeds (:class:`engine.app.EngineApp`)."""

    bootstrap: str
    settings: Settings
    engine_id: str
    topics: dict[str, str]  # role (trades, packets, subscriptions) -> topic
    state_dir: Path

    def accept(
        self,
        tbl: pa.Table,
        batch_id: int,
        read_s: float,
        ranges: dict[str, dict[str, list[int]]] | None = None,
    ) -> None: ...
    def busy(self) -> bool: ...
    def drain(self, output: bool = False) -> None: ...


def positions_dir(app: RecordSink) -> Path:
    return app.state_dir / "positions"


def resume_point(app: RecordSink) -> tuple[int, dict[str, dict[str, int]]]:
    """(next batch id, ``{topic: {partition: next offset}}``) after the newest logged batch.

    The newest positions file whose batch has an offset log gives the positions; logged
    batches after it (written by Spark's source, or before positions were kept) add their
    ranges.  No log at all: batch 0 from the earliest offsets."""
    logs = app.state_dir / "batches"
    logged = sorted(int(f.stem) for f in logs.glob("*.json")) if logs.exists() else []
    if not logged:
        return 0, {}
    last = logged[-1]
    pos: dict[str, dict[str, int]] = {}
    base = -1
    pdir = positions_dir(app)
    have = sorted((int(f.stem) for f in pdir.glob("*.json")), reverse=True) if pdir.exists() else []
    for b in have:
        if b <= last and (logs / f"{b:012d}.json").exists():
            pos = json.loads((pdir / f"{b:012d}.json").read_text())
            base = b
            break
    for b in logged:
        if b <= base:
            continue
        for topic, parts in json.loads((logs / f"{b:012d}.json").read_text()).items():
            for part, (_, hi) in parts.items():
                t = pos.setdefault(topic, {})
                t[part] = max(t.get(part, 0), int(hi) + 1)
    return last + 1, pos


class DirectSource:
    """Reads ``trades``, ``packets`` and ``subscriptions`` with one librdkafka consumer
    (``read_committed``) and hands batches to a :class:`RecordSink`; looks like a Spark
    ``StreamingQuery`` to its callers (``isActive``, ``exception()``, ``stop()``,
    ``awaitTermination()``).

    A batch is cut when ``trigger_s`` has passed since the previous one and the app's
    evaluation thread is free (records keep arriving into the batch while it is busy), or at
    ``max_records``.  ``available_now``: read up to the end offsets seen at start, then stop.
    """

    def __init__(
        self,
        app: RecordSink,
        trigger_s: float,
        max_records: int | None = None,
        available_now: bool = False,
    ) -> None:
        self.app = app
        self.trigger_s = float(trigger_s)
        self.max_records = int(max_records or 1_000_000)
        self.available_now = available_now
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tidewatch-direct-source", daemon=True)
        #: partition -> the end offset librdkafka last reported reaching (partition EOF)
        self._eof: dict[tuple[str, int], int] = {}
        #: partition -> the offset it was sought back to, until that record is read again
        self._expect: dict[tuple[str, int], int] = {}
        self._parts: list[tuple[str, int]] = []
        self._meta: Any = None  # a confluent-kafka consumer for metadata and end offsets
        self.batch_id, self.positions = resume_point(app)
        self.name = f"tidewatch-engine-{app.engine_id} (direct)"

    # ------------------------------------------------------------------ query-like interface
    def start(self) -> DirectSource:
        self._thread.start()
        return self

    @property
    def isActive(self) -> bool:  # noqa: N802 - the name of Spark's StreamingQuery property
        return self._thread.is_alive()

    def exception(self) -> BaseException | None:
        return self._error

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def awaitTermination(self, timeout: float | None = None) -> bool:  # noqa: N802 - Spark's name
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ reading
    def _consumer(self) -> NativeConsumer | FetchConsumer:
        """The Fetch-API consumer (``engine_kafka_client`` 'fetch', plaintext listeners), else
        the librdkafka one."""
        conf = engine_consumer_config(
            self.app.bootstrap,
            self.app.settings,
            f"tidewatch-engine-{self.app.engine_id}",
            **{
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,  # tells a partition that is at its end from a slow one
                # a fetch the broker holds for new data delays a seek (below) by as long
                "fetch.wait.max.ms": 50,
                "fetch.max.bytes": 64 << 20,
                "max.partition.fetch.bytes": 16 << 20,
            },
        )
        plaintext = str(conf.get("security.protocol", "plaintext")).lower() == "plaintext"
        if getattr(self.app.settings, "engine_kafka_client", "fetch") == "fetch" and plaintext:
            return FetchConsumer(conf)
        return NativeConsumer(
            {
                **conf,
                "queued.max.messages.kbytes": 64 << 10,
                # prefetch up to a whole batch per partition (the default, 100,000 records,
                # slowed the read of a backlog: bench/kafka_consume_probe.py, figures in
                # docs/measurements/engine.md), and when the queue is full, fetch again soon
                # rather than after librdkafka's 1 s
                "queued.min.messages": 1_000_000,
                "fetch.queue.backoff.ms": 20,
            }
        )

    def _partitions(self) -> list[tuple[str, int]]:
        """Every partition of the app's topics."""
        md = self._meta.list_topics(timeout=30)
        out: list[tuple[str, int]] = []
        for topic in self.app.topics.values():
            t = md.topics.get(topic)
            if t is None or t.error is not None:
                raise RuntimeError(f"topic {topic} is not in Kafka ({t.error if t else 'missing'})")
            out.extend((topic, p) for p in sorted(t.partitions))
        return out

    def _end_offset(self, topic: str, part: int, timeout_s: float) -> int:
        """The end offset of a partition asked of the broker now (``read_committed``: the last
        stable offset).  Asked through a client of its own: on the consumer's connection the
        request would queue behind fetch responses of up to ``fetch.max.bytes``, once per batch
        while a backlog is read (docs/measurements/engine.md, "The native consumer")."""
        from confluent_kafka import KafkaException, TopicPartition

        give_up = time.monotonic() + float(getattr(self.app.settings, "engine_kafka_retry_s", 300.0))
        while True:  # a broker restart: ask again until engine_kafka_retry_s has passed
            try:
                return int(
                    self._meta.get_watermark_offsets(
                        TopicPartition(topic, part), timeout=timeout_s, cached=False
                    )[1]
                )
            except KafkaException as exc:
                if time.monotonic() >= give_up or self._stop.is_set():
                    raise
                log.warning("end offset of %s[%d]: %s; asking again in 1 s", topic, part, exc)
                time.sleep(1.0)

    def _next(self, topic: str, part: int) -> int:
        return self.positions.get(topic, {}).get(str(part), 0)

    def _end_offsets(self) -> dict[tuple[str, int], int]:
        """End offsets (``read_committed``: the last stable offset) of every partition read."""
        return {(t, p): self._end_offset(t, p, 30) for t, p in self._parts}

    def _run(self) -> None:
        c: NativeConsumer | FetchConsumer | None = None
        try:
            # metadata and end offsets, through a client of its own (see _end_offset)
            self._meta = engine_consumer(
                self.app.bootstrap, self.app.settings, f"tidewatch-engine-{self.app.engine_id}"
            )
            self._parts = parts = self._partitions()
            c = self._consumer()
            c.assign(
                [
                    (t, p, self._next(t, p) if str(p) in self.positions.get(t, {}) else OFFSET_BEGINNING)
                    for t, p in parts
                ]
            )
            end = self._end_offsets() if self.available_now else None
            log.info(
                "direct Kafka source: %d partitions of %s from batch %d",
                len(parts), ", ".join(self.app.topics.values()), self.batch_id,
            )  # fmt: skip
            t_cut = time.monotonic()
            while not self._stop.is_set():
                if end is not None and self._reached(end):
                    break
                tables, t_read = self._read_batch(c, t_cut, end)
                if not tables:
                    t_cut = time.monotonic()
                    continue
                t0 = time.perf_counter()
                tbl = pa.concat_tables(tables)
                ranges = offset_ranges(tbl)
                for topic, ps in ranges.items():
                    for part, (_, hi) in ps.items():
                        self.positions.setdefault(topic, {})[part] = hi + 1
                self._hand_over(tbl, ranges, t_read + time.perf_counter() - t0)
                t_cut = time.monotonic()
            self.app.drain(output=True)
        except BaseException as exc:  # surfaced through exception(), as a StreamingQuery does
            self._error = exc
            log.exception("direct Kafka source stopped")
        finally:
            if c is not None:
                c.close()
            if self._meta is not None:
                self._meta.close()

    def _read_batch(
        self, c: NativeConsumer | FetchConsumer, t_cut: float, end: dict[tuple[str, int], int] | None
    ) -> tuple[list[pa.Table], float]:
        """The records of the next batch (Arrow tables, arrival order), and the seconds spent
        reading them.

        Cut when ``trigger_s`` has passed since ``t_cut`` and the evaluation thread is free, or
        at ``max_records`` -- but not before every partition that has records now has given
        some (for at most :data:`ALIGN_WAIT_S` more; past ``max_records`` only those partitions'
        records join, and the others are sought back to their first record not taken, so the
        positions logged with this batch stay exact).  That is what the engine's per-partition
        watermark needs (:meth:`engine.core.EngineCore._advance_watermark`): Spark's source
        prorates ``maxOffsetsPerTrigger`` over the partitions that have data, while one
        consumer's queue may hold a whole fetch of one partition before the next one's, and a
        batch without a lagging partition would move the watermark past its records."""
        tables: list[pa.Table] = []
        count = 0
        seen: set[tuple[str, int]] = set()
        rewind: dict[tuple[str, int], int] = {}  # partition -> first offset read past a full batch
        t_read = 0.0
        give_up = None
        while not self._stop.is_set():
            full = count >= self.max_records
            left = t_cut + self.trigger_s - time.monotonic()
            if full or (left <= 0 and count and not self.app.busy()):
                missing = self._lagging(seen)
                if not missing:
                    break
                now = time.monotonic()
                give_up = give_up or now + ALIGN_WAIT_S
                if now >= give_up:
                    log.warning(
                        "partitions %s still have records but gave none in %.0f s; the batch goes without them",
                        missing, ALIGN_WAIT_S,
                    )  # fmt: skip
                    break
            t0 = time.perf_counter()
            waiting = give_up is not None  # for lagging partitions: look again soon
            chunk = c.consume(CONSUME_CHUNK if full else min(CONSUME_CHUNK, self.max_records - count),
                              0.02 if waiting else min(max(left, 0.02), 0.5))  # fmt: skip
            keep = self._take(chunk, full, seen, rewind)
            if keep is not None:
                tbl = chunk.table()
                tbl = tbl if len(keep) == len(chunk) else tbl.take(pa.array(keep, pa.int64()))
                tables.append(tbl)
                count += tbl.num_rows
            t_read += time.perf_counter() - t0
            if end is not None and not len(chunk) and not chunk.errors and self._reached(end):
                break  # available_now: everything up to the end offsets seen at start is read
        for (t, p), off in rewind.items():  # librdkafka drops what it fetched past ``off``
            c.seek(t, p, off)
            self._eof.pop((t, p), None)  # the end it reported was reached by records not taken
            self._expect[(t, p)] = off  # anything else of it still queued from before is stale
        return tables, t_read

    def _take(
        self,
        chunk: Chunk,
        full: bool,
        seen: set[tuple[str, int]],
        rewind: dict[tuple[str, int], int],
    ) -> np.ndarray | None:
        """Which of a chunk's records join the batch (indexes, arrival order; None: none), per
        partition: after a seek back, only from the offset sought on (``_expect``); once the
        batch is full, only partitions not in it yet, and the first offset of any other is
        kept in ``rewind`` to be read again (a partition not in the batch yet joins with its
        first record).  Partition EOF events are noted in ``_eof``."""
        expect = self._expect
        resolved: dict[tuple[str, int], int] = {}  # sought-back partition -> row where it resumed
        keep = []
        if len(chunk):
            code = chunk.topic.astype(np.int64) << 32 | chunk.partition.astype(np.int64)
            for k in np.unique(code):
                rows = np.flatnonzero(code == k)
                tp = (chunk.topics[int(k >> 32)], int(k & 0xFFFFFFFF))
                first = 0
                if tp in expect:
                    hit = np.flatnonzero(chunk.offset[rows] == expect[tp])
                    if not len(hit):
                        continue  # all stale
                    first = int(hit[0])
                    del expect[tp]
                    resolved[tp] = int(rows[first])
                if full:  # over the cap: a lagging partition joins with one record
                    take = 0 if tp in seen else 1
                    if first + take < len(rows):
                        rewind.setdefault(tp, int(chunk.offset[rows[first + take]]))
                    rows = rows[: first + take]
                if first < len(rows):
                    keep.append(rows[first:])
                    seen.add(tp)  # each partition once per chunk: the checks above saw seen as it was
        for e in chunk.errors:
            tp = (e.topic or "", e.partition)
            if e.code == ERR_PARTITION_EOF:
                # an EOF queued before the record sought back to is stale
                if tp not in expect and (tp not in resolved or resolved[tp] < e.position):
                    self._eof[tp] = e.offset
            elif e.code == ERR_FATAL:
                raise RuntimeError(f"Kafka consumer: {e.message}")
            else:
                log.warning("Kafka consumer: %s", e.message)
        if not keep:
            return None
        return np.sort(np.concatenate(keep))

    def _reached(self, end: dict[tuple[str, int], int]) -> bool:
        """Every partition has been read up to ``end`` (handed over, or librdkafka's partition
        EOF at or past it: a transaction marker at the end has no record to hand over)."""
        return all(max(self._next(t, p), self._eof.get((t, p), -1)) >= hi for (t, p), hi in end.items())

    def _lagging(self, seen: set[tuple[str, int]]) -> list[tuple[str, int]]:
        """Partitions not in the batch that have records now: their end offset (the last
        stable offset, ``read_committed``), asked of the broker, is past both the position
        after the records handed over and the end librdkafka last reported (its partition EOF
        skips transaction markers)."""
        out = []
        for t, p in self._parts:
            if (t, p) in seen:
                continue
            hi = self._end_offset(t, p, 10)
            if hi > max(self._next(t, p), self._eof.get((t, p), -1)):
                out.append((t, p))
        return out

    def _hand_over(self, tbl: pa.Table, ranges: dict[str, dict[str, list[int]]], read_s: float) -> None:
        from engine.runtime.snapshot_writer import atomic_write

        b = self.batch_id
        atomic_write(positions_dir(self.app) / f"{b:012d}.json", json.dumps(self.positions).encode())
        self.app.accept(tbl, b, read_s, ranges)
        self.batch_id = b + 1
        for old in sorted(positions_dir(self.app).glob("*.json"))[:-3]:  # the newest three are enough
            old.unlink(missing_ok=True)
