"""Kafka's fetch protocol, read by the engine itself: record batches straight into Arrow columns.

The direct source's librdkafka consumer (:mod:`engine.sources.native_consumer`) hands records over
without a Python object each, but librdkafka itself still makes one message (an allocated
``rd_kafka_op_t``) per record in its fetch thread, queues it, and frees it when the engine has
copied it: at 10 rules, most of the engine process's CPU per event (``bench/engine_bench.py``;
docs/engine.md "The fetch consumer", the figures in docs/measurements/engine.md).  This consumer
speaks the Fetch API (v4, the oldest a Kafka 4 broker serves; ``isolation_level`` since v4) on a
socket of its own to each partition leader and parses the v2 record batches of the response in
one Numba kernel, with no per-record allocation:

* a batch's header is read in Python (one per producer batch: thousands of records); LZ4 and
  gzip bodies are decompressed whole;
* ``read_committed`` drops the batches of aborted transactions exactly as Kafka's Java consumer
  does (``CompletedFetch.nextFetchedRecord``): the response lists the aborted transactions of
  the range (producer id, first offset); a producer's transactional batches are skipped from
  that first offset until its ABORT control batch; control batches are never handed over;
* the kernel walks the records of the kept batches (varint framing of the v2 format) and the
  keys and values are copied once, into the buffers of two Arrow ``large_binary`` columns.

The interface is :class:`engine.sources.native_consumer.NativeConsumer`'s (``assign``, ``seek``,
``consume`` -> :class:`~engine.sources.native_consumer.Chunk`, ``close``), partition EOF events
included, so :class:`engine.sources.direct.DirectSource` takes either.  Metadata (partition
leaders) and the offsets ``OFFSET_BEGINNING`` resolves to come from a confluent-kafka client,
which also validates the configuration.  Plaintext listeners only: with ``security.protocol``
set to anything else the engine keeps the librdkafka consumer
(``engine.sources.readers.engine_consumer``).
"""

from __future__ import annotations

import gzip
import socket
import struct
import time
from typing import Any

import numba as nb
import numpy as np
import pyarrow as pa

from engine.sources.native_consumer import (
    ERR_PARTITION_EOF,
    OFFSET_BEGINNING,
    Chunk,
    ConsumeError,
    NativeConsumerError,
    _binary,
)
from tidewatch.wire.avro import zigzag_varint

#: Kafka API key and the version spoken (Fetch v4: isolation level, last stable offset and the
#: aborted transactions of the range; no fetch sessions)
API_FETCH, FETCH_VERSION = 1, 4
#: librdkafka's ``RD_KAFKA_OFFSET_END``
OFFSET_END = -1
#: Kafka error codes handled here (``org.apache.kafka.common.protocol.Errors``)
ERR_OFFSET_OUT_OF_RANGE = 1
RETRIABLE = {3, 5, 6, 7, 74, 75}  # unknown partition, no leader, not leader, timeout, epochs
#: record batch (magic 2) header: the fields after baseOffset/batchLength/leaderEpoch/magic/crc
_BATCH = struct.Struct(">hiqqqhii")
BATCH_HEADER = 61
ATTR_CODEC, ATTR_LOG_APPEND_TIME, ATTR_TRANSACTIONAL, ATTR_CONTROL = 0x07, 0x08, 0x10, 0x20
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class FetchConsumerError(NativeConsumerError):
    """A setting this consumer cannot serve, or a broker answer it cannot read."""


# ---------------------------------------------------------------------------- kernels
@nb.njit(cache=True, nogil=True)
def _records(  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    data, seg_start, seg_end, seg_base, seg_ts, seg_lat, seg_min, off, ts, kst, kln, vst, vln, rseg
):
    """Walk the records of every segment (one batch's records, decompressed); records below the
    segment's fetch offset are skipped.  Returns how many were written, or -1 - segment for a
    segment whose framing is broken."""
    n = 0
    for s in range(seg_start.shape[0]):
        p = seg_start[s]
        e = seg_end[s]
        while p < e:
            length, p = zigzag_varint(data, p, e)
            nxt = p + length
            if p < 0 or length <= 0 or nxt > e:
                return -1 - s
            p += 1  # record attributes (unused)
            tdelta, p = zigzag_varint(data, p, nxt)
            if p < 0:
                return -1 - s
            odelta, p = zigzag_varint(data, p, nxt)
            if p < 0:
                return -1 - s
            klen, p = zigzag_varint(data, p, nxt)
            if p < 0:
                return -1 - s
            ks = p
            if klen > 0:
                p += klen
            vlen, p = zigzag_varint(data, p, nxt)
            if p < 0:
                return -1 - s
            vs = p
            if vlen > 0:
                p += vlen
            if p > nxt:
                return -1 - s
            o = seg_base[s] + odelta
            if o >= seg_min[s]:
                off[n] = o
                ts[n] = seg_lat[s] if seg_lat[s] >= 0 else seg_ts[s] + tdelta
                kst[n] = ks
                kln[n] = klen
                vst[n] = vs
                vln[n] = vlen
                rseg[n] = s
                n += 1
            p = nxt  # headers skipped
    return n


@nb.njit(cache=True, nogil=True)
def _gather(data, start, length, offs, valid):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Copy ``data[start:start + length]`` of every row into one buffer (length -1: null)."""
    n = start.shape[0]
    tot = 0
    offs[0] = 0
    for i in range(n):
        if length[i] > 0:
            tot += length[i]
        offs[i + 1] = tot
        valid[i] = length[i] >= 0
    out = np.empty(tot, np.uint8)
    for i in range(n):
        a = start[i]
        o = offs[i]
        for j in range(offs[i + 1] - o):
            out[o + j] = data[a + j]
    return out


@nb.njit(cache=True, nogil=True)
def _views(data, start, length, v8, valid):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Arrow ``binary_view`` structs of ``data[start:start + length]`` (length -1: null) in
    ``v8`` (16 zeroed bytes per row): the size, then the bytes inline up to 12, else a 4-byte
    prefix, buffer 0 and the offset.  Returns the number of nulls."""
    v32 = v8.view(np.int32)
    nulls = 0
    for i in range(start.shape[0]):
        n = length[i]
        a = start[i]
        b = 16 * i
        valid[i] = n >= 0
        if n < 0:
            nulls += 1
            continue
        v32[4 * i] = n
        if n <= 12:
            for j in range(n):
                v8[b + 4 + j] = data[a + j]
        else:
            for j in range(4):
                v8[b + 4 + j] = data[a + j]
            v32[4 * i + 3] = a
    return nulls


def _large_binary(data: np.ndarray, start: np.ndarray, length: np.ndarray) -> pa.Array:
    """``data[start:start + length]`` of every row as an Arrow ``large_binary`` column: views
    into ``data`` written by a kernel, then copied once by Arrow's cast (a third of the time of
    a byte loop in Numba; offsets in views are int32, so ``data`` stays under 2 GB)."""
    n = len(start)
    valid = np.empty(n, np.uint8)
    if len(data) >= 2**31:
        offs = np.empty(n + 1, np.int64)
        return _binary(n, offs, _gather(data, start, length, offs, valid), valid)
    v8 = np.zeros(16 * n, np.uint8)
    nulls = int(_views(data, start, length, v8, valid))
    bitmap = pa.py_buffer(np.packbits(valid.view(np.bool_), bitorder="little")) if nulls else None
    views = pa.Array.from_buffers(
        pa.binary_view(), n, [bitmap, pa.py_buffer(v8), pa.py_buffer(data)], null_count=nulls
    )
    return views.cast(pa.large_binary())


# ---------------------------------------------------------------------------- wire helpers
def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


class _Reader:
    """Big-endian fields of a response, in order."""

    def __init__(self, buf: memoryview, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, fmt: struct.Struct) -> tuple[Any, ...]:
        v = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return v

    def int16(self) -> int:
        return int(self.take(_I16)[0])

    def int32(self) -> int:
        return int(self.take(_I32)[0])

    def int64(self) -> int:
        return int(self.take(_I64)[0])

    def string(self) -> str:
        n = self.int16()
        s = bytes(self.buf[self.pos : self.pos + n]).decode()
        self.pos += n
        return s


_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


def _decompress(codec: int, body: memoryview) -> bytes:
    if codec == 3:
        import lz4.frame

        return bytes(lz4.frame.decompress(body))
    if codec == 1:
        return gzip.decompress(body)
    raise FetchConsumerError(
        f"record batch compressed with {CODECS.get(codec, codec)}: this consumer reads none, gzip "
        "and lz4; set TIDEWATCH_ENGINE_KAFKA_CLIENT=librdkafka to read it with librdkafka"
    )


class _Connection:
    """One socket to one broker: size-prefixed requests and responses (API version fixed)."""

    def __init__(self, host: str, port: int, client_id: str, timeout_s: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.client_id = _str(client_id)
        self.corr = 0
        self.buf = bytearray(1 << 20)

    def request(self, api: int, version: int, body: bytes, timeout_s: float) -> memoryview:
        self.corr += 1
        head = struct.pack(">hhi", api, version, self.corr) + self.client_id
        msg = head + body
        self.sock.settimeout(timeout_s)
        self.sock.sendall(struct.pack(">i", len(msg)) + msg)
        size = struct.unpack(">i", self._read(4))[0]
        if len(self.buf) < size:
            self.buf = bytearray(max(size, 2 * len(self.buf)))
        view = memoryview(self.buf)[:size]
        got = 0
        while got < size:
            k = self.sock.recv_into(view[got:], size - got)
            if not k:
                raise ConnectionError("broker closed the connection")
            got += k
        corr = struct.unpack_from(">i", view, 0)[0]
        if corr != self.corr:
            raise ConnectionError(f"response {corr} to request {self.corr}")
        return view[4:]

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            k = self.sock.recv(n - len(out))
            if not k:
                raise ConnectionError("broker closed the connection")
            out += k
        return out

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------------------- the consumer
class FetchConsumer:
    """Manual assignment, no group, no commits; ``consume`` fetches when nothing is buffered.

    ``config``: the confluent-kafka/librdkafka settings the engine uses for its consumer;
    ``bootstrap.servers``, ``isolation.level``, ``fetch.max.bytes``,
    ``max.partition.fetch.bytes``, ``fetch.wait.max.ms``, ``enable.partition.eof``,
    ``auto.offset.reset`` and ``client.id`` are read here.  One thread uses it at a time."""

    def __init__(self, config: dict[str, Any]) -> None:
        from confluent_kafka import Consumer, KafkaException

        proto = str(config.get("security.protocol", "plaintext")).lower()
        if proto != "plaintext":
            raise FetchConsumerError(f"security.protocol {proto}: the fetch consumer speaks plaintext only")
        meta_conf = {k: v for k, v in config.items() if not callable(v)}
        meta_conf.setdefault("group.id", "tidewatch-fetch-meta")
        try:
            self._meta = Consumer(meta_conf)  # validates every setting by name
        except KafkaException as exc:
            raise FetchConsumerError(str(exc)) from exc
        self.read_committed = str(config.get("isolation.level", "read_committed")) == "read_committed"
        self.max_bytes = int(config.get("fetch.max.bytes", 52_428_800))
        self.part_bytes = int(config.get("max.partition.fetch.bytes", 1_048_576))
        self.wait_ms = int(config.get("fetch.wait.max.ms", 500))
        self.eof = str(config.get("enable.partition.eof", "false")).lower() in ("true", "1")
        self.reset = str(config.get("auto.offset.reset", "largest")).lower()
        self.client_id = str(config.get("client.id", "tidewatch-engine"))
        self._pos: dict[tuple[str, int], int] = {}  # next offset to fetch
        self._eof_at: dict[tuple[str, int], int] = {}  # position EOF was last reported at
        self._leaders: dict[tuple[str, int], int] = {}
        self._brokers: dict[int, tuple[str, int]] = {}
        self._conns: dict[int, _Connection] = {}
        self._topics: list[str] = []
        self._topic_idx: dict[str, int] = {}
        self._pending: Chunk | None = None
        self._backoff_until = 0.0
        self._stale = False  # partition leaders to be looked up again before the next fetch
        self._closed = False

    # ------------------------------------------------------------------ assignment
    def _topic(self, name: str) -> int:
        idx = self._topic_idx.get(name)
        if idx is None:
            idx = self._topic_idx[name] = len(self._topics)
            self._topics.append(name)
        return idx

    def _resolve(self, topic: str, part: int, offset: int) -> int:
        if offset >= 0:
            return offset
        from confluent_kafka import TopicPartition

        lo, hi = self._meta.get_watermark_offsets(TopicPartition(topic, part), timeout=30)
        return int(lo if offset == OFFSET_BEGINNING else hi)

    def _refresh(self) -> None:
        topics = sorted({t for t, _ in self._pos})
        brokers: dict[int, tuple[str, int]] = {}
        for t in topics:
            md = self._meta.list_topics(t, timeout=30)
            for b in md.brokers.values():
                brokers[b.id] = (b.host, b.port)
            tm = md.topics[t]
            if tm.error is not None:
                raise FetchConsumerError(f"metadata of {t}: {tm.error}")
            for p, pm in tm.partitions.items():
                self._leaders[(t, p)] = pm.leader
        self._brokers = brokers

    def assign(self, parts: list[tuple[str, int, int]]) -> None:
        """Read ``(topic, partition, offset)`` (offset :data:`OFFSET_BEGINNING` for the first)."""
        self._pos = {(t, p): self._resolve(t, p, o) for t, p, o in parts}
        for t, _, _ in parts:
            self._topic(t)
        self._eof_at.clear()
        self._pending = None
        self._refresh()

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read ``partition`` from ``offset`` on; what is buffered of it is dropped."""
        tp = (topic, partition)
        self._pos[tp] = self._resolve(topic, partition, offset)
        self._eof_at.pop(tp, None)
        ch = self._pending
        if ch is not None:
            t = self._topic_idx.get(topic, -1)
            drop = (ch.topic == t) & (ch.partition == partition)
            if drop.any():
                self._pending = _take(
                    ch, np.flatnonzero(~drop), keep_errors=lambda e: (e.topic, e.partition) != tp
                )

    def watermarks(self, topic: str, partition: int, timeout_s: float) -> tuple[int, int]:
        """(low, high) offsets of ``partition`` (``read_committed``: high is the last stable offset)."""
        from confluent_kafka import TopicPartition

        lo, hi = self._meta.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
        return int(lo), int(hi)

    # ------------------------------------------------------------------ reading
    def consume(self, max_records: int, timeout_s: float) -> Chunk:
        """Up to ``max_records`` records (and the events among them): what is buffered, else one
        fetch from every leader, waiting up to ``timeout_s`` (capped by ``fetch.wait.max.ms``)
        for records."""
        if self._pending is None:
            self._pending = self._fetch(timeout_s)
        ch = self._pending
        n = len(ch)
        if n <= max_records:
            self._pending = None
            return ch
        head = _slice(ch, 0, max_records)
        self._pending = _slice(ch, max_records, n)
        return head

    def _fetch(self, timeout_s: float) -> Chunk:
        now = time.monotonic()
        if now < self._backoff_until:
            time.sleep(min(self._backoff_until - now, timeout_s))
            return _empty(self._topics)
        if self._stale:
            try:
                self._refresh()
                self._stale = False
            except Exception as exc:  # noqa: BLE001 - reported as an event, tried again next call
                self._backoff_until = time.monotonic() + 0.5
                return _concat(self._topics, [], [ConsumeError(-195, None, -1, -1, f"metadata: {exc}", 0)])
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp in self._pos:
            by_leader.setdefault(self._leaders.get(tp, -1), []).append(tp)
        chunks: list[Chunk] = []
        errors: list[ConsumeError] = []
        for leader, tps in by_leader.items():
            try:
                if leader < 0 or leader not in self._brokers:
                    raise ConnectionError(f"no leader for {tps}")
                chunks.append(self._fetch_from(leader, tps, timeout_s))
            except (OSError, ConnectionError) as exc:  # reconnect and look the leaders up again
                conn = self._conns.pop(leader, None)
                if conn is not None:
                    conn.close()
                errors.append(ConsumeError(-195, None, -1, -1, f"fetch from broker {leader}: {exc}", 0))
                self._backoff_until = time.monotonic() + 0.5
                self._stale = True
        return _concat(self._topics, chunks, errors)

    def _fetch_from(self, leader: int, tps: list[tuple[str, int]], timeout_s: float) -> Chunk:
        conn = self._conns.get(leader)
        if conn is None:
            host, port = self._brokers[leader]
            conn = self._conns[leader] = _Connection(host, port, self.client_id, 30)
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        wait_ms = max(0, min(int(timeout_s * 1000), self.wait_ms))
        body = [struct.pack(">iiiib", -1, wait_ms, 1, self.max_bytes, 1 if self.read_committed else 0)]
        body.append(struct.pack(">i", len(by_topic)))
        for t, ps in by_topic.items():
            body.append(_str(t) + struct.pack(">i", len(ps)))
            for p in ps:
                body.append(struct.pack(">iqi", p, self._pos[(t, p)], self.part_bytes))
        resp = conn.request(API_FETCH, FETCH_VERSION, b"".join(body), wait_ms / 1000 + 30)
        return self._parse(resp)

    def _parse(self, resp: memoryview) -> Chunk:
        r = _Reader(resp)
        r.int32()  # throttle_time_ms
        segs: list[
            Any
        ] = []  # (body, base offset, base ts, log-append ts or -1, min offset, topic, partition)
        ends: list[tuple[int, str, int, int]] = []  # (segments before, topic, partition, end offset)
        errors: list[tuple[int, ConsumeError]] = []
        for _ in range(r.int32()):
            topic = r.string()
            for _ in range(r.int32()):
                part, err = r.take(_PART)
                hw, lso = r.take(_HWLSO)
                n_ab = r.int32()
                aborted = sorted((r.take(_ABORTED) for _ in range(max(n_ab, 0))), key=lambda a: a[1])
                size = r.int32()
                start = r.pos
                r.pos += max(size, 0)
                tp = (topic, part)
                if err:
                    if err == ERR_OFFSET_OUT_OF_RANGE and self.reset in ("earliest", "smallest", "beginning"):
                        self._pos[tp] = self._resolve(topic, part, OFFSET_BEGINNING)
                    elif err == ERR_OFFSET_OUT_OF_RANGE and self.reset in ("latest", "largest", "end"):
                        self._pos[tp] = self._resolve(topic, part, OFFSET_END)
                    elif err in RETRIABLE:  # a leader moved or is not there yet: look again first
                        self._backoff_until = time.monotonic() + 0.1
                        self._stale = True
                    msg = f"fetch {topic}[{part}] at {self._pos[tp]}: Kafka error {err}"
                    errors.append((len(segs), ConsumeError(err, topic, part, self._pos[tp], msg, 0)))
                    continue
                if size > 0:
                    self._batches(resp[start : start + size], tp, aborted, segs)
                end = lso if self.read_committed else hw
                ends.append((len(segs), topic, part, end))
        return self._assemble(segs, ends, errors)

    def _batches(self, buf: memoryview, tp: tuple[str, int], aborted: list[Any], segs: list[Any]) -> None:
        """The data batches of one partition's records, read_committed applied; moves the fetch
        position past every whole batch (control and aborted ones included)."""
        pos = self._pos[tp]
        aborted_pids: set[int] = set()
        ai = 0
        p, end = 0, len(buf)
        while p + BATCH_HEADER <= end:
            base, blen = struct.unpack_from(">qi", buf, p)
            total = 12 + blen
            if p + total > end:
                break  # a partial batch at the end of the response: fetched again next time
            if buf[p + 16] != 2:
                raise FetchConsumerError(f"{tp[0]}[{tp[1]}] offset {base}: record batch magic {buf[p + 16]}")
            attrs, last_delta, base_ts, max_ts, pid, _, _, count = _BATCH.unpack_from(buf, p + 21)
            last = base + last_delta
            body = buf[p + BATCH_HEADER : p + total]
            p += total
            # the aborted-transaction bookkeeping sees every batch, also one wholly before the
            # fetch offset: an ABORT marker there still ends its producer's aborted run
            if self.read_committed and pid >= 0:
                while ai < len(aborted) and aborted[ai][1] <= last:
                    aborted_pids.add(aborted[ai][0])
                    ai += 1
                if attrs & ATTR_CONTROL:
                    if _control_type(body, attrs) == 0:  # ABORT marker: the producer's aborted run ends
                        aborted_pids.discard(pid)
                elif attrs & ATTR_TRANSACTIONAL and pid in aborted_pids:
                    pos = max(pos, last + 1)
                    continue
            if attrs & ATTR_CONTROL or last < pos:
                pos = max(pos, last + 1)
                continue
            codec = attrs & ATTR_CODEC
            data = _decompress(codec, body) if codec else body
            lat = max_ts if attrs & ATTR_LOG_APPEND_TIME else -1
            segs.append((data, base, base_ts, lat, pos, tp[0], tp[1]))
            pos = last + 1
        self._pos[tp] = pos

    def _assemble(
        self, segs: list[Any], ends: list[tuple[int, str, int, int]], errors: list[tuple[int, ConsumeError]]
    ) -> Chunk:
        k = len(segs)
        lens = np.fromiter((len(s[0]) for s in segs), np.int64, k)
        seg_end = np.cumsum(lens)
        seg_start = seg_end - lens
        data = np.frombuffer(b"".join(s[0] for s in segs), np.uint8) if k else np.zeros(0, np.uint8)
        seg_base = np.fromiter((s[1] for s in segs), np.int64, k)
        seg_ts = np.fromiter((s[2] for s in segs), np.int64, k)
        seg_lat = np.fromiter((s[3] for s in segs), np.int64, k)
        seg_min = np.fromiter((s[4] for s in segs), np.int64, k)
        seg_topic = np.fromiter((self._topic(s[5]) for s in segs), np.int32, k)
        seg_part = np.fromiter((s[6] for s in segs), np.int32, k)
        cap = 0
        for s in segs:  # a record takes at least 7 bytes (length, attributes and 5 varints)
            cap += len(s[0]) // 7 + 1
        off = np.empty(cap, np.int64)
        ts = np.empty(cap, np.int64)
        kst, kln = np.empty(cap, np.int64), np.empty(cap, np.int64)
        vst, vln = np.empty(cap, np.int64), np.empty(cap, np.int64)
        rseg = np.empty(cap, np.int64)
        n = int(_records(data, seg_start, seg_end, seg_base, seg_ts, seg_lat, seg_min,
                         off, ts, kst, kln, vst, vln, rseg)) if k else 0  # fmt: skip
        if n < 0:
            s = segs[-1 - n]
            raise FetchConsumerError(f"{s[5]}[{s[6]}]: malformed records in the batch at offset {s[1]}")
        rseg = rseg[:n]
        keys = _large_binary(data, kst[:n], kln[:n])
        values = _large_binary(data, vst[:n], vln[:n])
        first_row = np.searchsorted(
            rseg, np.arange(k + 1)
        )  # rows of segment s: [first_row[s], first_row[s+1])
        out_errors = [
            ConsumeError(e.code, e.topic, e.partition, e.offset, e.message, int(first_row[before]))
            for before, e in errors
        ]
        if self.eof:
            for before, topic, part, end_off in ends:
                tp = (topic, part)
                pos = self._pos[tp]
                if end_off >= 0 and pos >= end_off and self._eof_at.get(tp) != pos:
                    self._eof_at[tp] = pos
                    msg = f"end of {topic}[{part}] at offset {pos}"
                    out_errors.append(
                        ConsumeError(ERR_PARTITION_EOF, topic, part, pos, msg, int(first_row[before]))
                    )
        out_errors.sort(key=lambda e: e.position)
        return Chunk(
            list(self._topics),
            seg_topic[rseg],
            seg_part[rseg],
            off[:n].copy(),
            ts[:n].copy(),
            keys,
            values,
            out_errors,
        )

    def close(self) -> None:
        """Close the sockets and the metadata client (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for c in self._conns.values():
            c.close()
        self._conns.clear()
        self._meta.close()


_PART = struct.Struct(">ih")
_HWLSO = struct.Struct(">qq")
_ABORTED = struct.Struct(">qq")


def _control_type(body: memoryview, attrs: int) -> int:
    """The type of a control batch's record (0 ABORT, 1 COMMIT): its key is (version, type)."""
    data = _decompress(attrs & ATTR_CODEC, body) if attrs & ATTR_CODEC else bytes(body)
    arr = np.frombuffer(data, np.uint8)
    e = len(arr)
    p = 0
    klen = 0
    for skip in (0, 1, 0, 0):  # record length, (attributes) timestamp delta, offset delta, key length
        klen, p = zigzag_varint(arr, p + skip, e)
        if p < 0:
            return -1
    if klen < 4 or p + 4 > e:
        return -1
    return int(struct.unpack_from(">h", data, p + 2)[0])


# ---------------------------------------------------------------------------- chunks
def _empty(topics: list[str]) -> Chunk:
    z = np.zeros(1, np.int64)
    e = np.zeros(0, np.uint8)
    return Chunk(list(topics), np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int64),
                 np.zeros(0, np.int64), _binary(0, z, e, e), _binary(0, z, e, e), [])  # fmt: skip


def _slice(ch: Chunk, a: int, b: int) -> Chunk:
    """Rows ``a:b`` and the events among them: an event after ``p`` records belongs to the
    slice holding record ``p - 1`` (to the first slice when ``p`` is 0), re-placed."""
    errs = [
        ConsumeError(e.code, e.topic, e.partition, e.offset, e.message, e.position - a)
        for e in ch.errors
        if (e.position > a or a == 0) and e.position <= b
    ]
    return Chunk(ch.topics, ch.topic[a:b], ch.partition[a:b], ch.offset[a:b], ch.timestamp[a:b],
                 ch.key.slice(a, b - a), ch.value.slice(a, b - a), errs)  # fmt: skip


def _take(ch: Chunk, rows: np.ndarray, keep_errors: Any) -> Chunk:
    """The rows ``rows`` (sorted) and the errors ``keep_errors`` accepts, re-placed."""
    idx = pa.array(rows, pa.int64())
    errs = [
        ConsumeError(
            e.code, e.topic, e.partition, e.offset, e.message, int(np.searchsorted(rows, e.position))
        )
        for e in ch.errors
        if keep_errors(e)
    ]
    return Chunk(ch.topics, ch.topic[rows], ch.partition[rows], ch.offset[rows], ch.timestamp[rows],
                 ch.key.take(idx), ch.value.take(idx), errs)  # fmt: skip


def _concat(topics: list[str], chunks: list[Chunk], after: list[ConsumeError] | None = None) -> Chunk:
    """The chunks one after the other, then the events ``after`` (placed after every record)."""
    if len(chunks) == 1 and not after:
        return chunks[0]
    errs: list[ConsumeError] = []
    n = 0
    for c in chunks:
        errs.extend(
            ConsumeError(e.code, e.topic, e.partition, e.offset, e.message, e.position + n) for e in c.errors
        )
        n += len(c)
    errs.extend(ConsumeError(e.code, e.topic, e.partition, e.offset, e.message, n) for e in after or [])
    if not chunks:
        out = _empty(topics)
        out.errors.extend(errs)
        return out
    return Chunk(
        list(topics),
        np.concatenate([c.topic for c in chunks]),
        np.concatenate([c.partition for c in chunks]),
        np.concatenate([c.offset for c in chunks]),
        np.concatenate([c.timestamp for c in chunks]),
        pa.concat_arrays([c.key for c in chunks]),
        pa.concat_arrays([c.value for c in chunks]),
        errs,
    )
