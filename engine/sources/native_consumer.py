"""A librdkafka consumer that hands records over as Arrow columns, with no Python object per record.

The direct source (:mod:`engine.sources.direct`) first read Kafka with confluent-kafka's
``Consumer.consume``, which makes one ``Message`` object per record; then the engine's Arrow
table was built from their getters: several times the engine core's whole cost per event at
10 rules, Avro decode included (``bench/kafka_consume_probe.py`` against
``bench/engine_bench.py --core-only``; the figures in docs/measurements/engine.md, "The native
consumer").  This consumer drives the same librdkafka (the one bundled with
confluent-kafka) through ``ctypes`` for the per-call API and two Numba kernels for the
per-record part:

1. ``rd_kafka_consume_batch_queue`` fills an array of ``rd_kafka_message_t *`` (GIL released);
2. :func:`_headers` reads each message's public fields (error, topic handle, partition,
   offset, key and payload pointer/length; ``rd_kafka_message_timestamp``);
3. :func:`_copy` copies keys and payloads into the data buffers of two Arrow ``large_binary``
   columns and destroys each message (``rd_kafka_message_destroy``).

Both kernels run without the GIL, so the engine's evaluation thread goes on meanwhile.  The
kernels call librdkafka by symbol name (registered with LLVM at load), which keeps them in
Numba's on-disk cache.  ``rd_kafka_message_t`` is a public struct of ``rdkafka.h`` (its layout
is part of librdkafka's ABI); the ``W_*`` constants name the words read.

Records and errors keep librdkafka's semantics: ``Chunk.errors`` lists the error events
(partition EOF among them) with their place among the records, as ``consume`` would have
returned them in line.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
from dataclasses import dataclass, field
from typing import Any

import numba as nb
import numpy as np
import pyarrow as pa
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.errors import EngineError

#: ``RD_KAFKA_OFFSET_BEGINNING``
OFFSET_BEGINNING = -2
#: ``RD_KAFKA_RESP_ERR__PARTITION_EOF``: the consumer reached the end of a partition
ERR_PARTITION_EOF = -191
#: ``RD_KAFKA_RESP_ERR__FATAL``
ERR_FATAL = -150

#: 8-byte words of ``rd_kafka_message_t`` (x86-64 / aarch64 LP64 layout): err (int, padded),
#: rkt, partition (int32, padded), payload, len, key, key_len, offset
W_ERR, W_RKT, W_PARTITION, W_PAYLOAD, W_LEN, W_KEY, W_KEY_LEN, W_OFFSET = range(8)

_vp = ctypes.c_void_p


class NativeConsumerError(EngineError, RuntimeError):
    """librdkafka refused a setting or a call."""


def library_path() -> str:
    """The librdkafka shared library: the one bundled with confluent-kafka (the same library
    the rest of the app's Kafka clients use), else the system's."""
    import confluent_kafka

    here = os.path.dirname(os.path.dirname(os.path.abspath(confluent_kafka.__file__)))
    bundled = sorted(glob.glob(os.path.join(here, "confluent_kafka.libs", "librdkafka*.so*")))
    if bundled:
        return bundled[0]
    found = ctypes.util.find_library("rdkafka")
    if found:
        return found
    raise NativeConsumerError(
        "librdkafka not found: neither confluent-kafka's bundled copy nor a system librdkafka "
        "(apt install librdkafka1); or run the engine with --source spark"
    )


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(library_path())
    sig: dict[str, tuple[Any, list[Any]]] = {
        "rd_kafka_conf_new": (_vp, []),
        "rd_kafka_conf_destroy": (None, [_vp]),
        "rd_kafka_conf_set": (
            ctypes.c_int,
            [_vp, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t],
        ),
        "rd_kafka_new": (_vp, [ctypes.c_int, _vp, ctypes.c_char_p, ctypes.c_size_t]),
        "rd_kafka_poll_set_consumer": (ctypes.c_int, [_vp]),
        "rd_kafka_queue_get_consumer": (_vp, [_vp]),
        "rd_kafka_queue_destroy": (None, [_vp]),
        "rd_kafka_consumer_close": (ctypes.c_int, [_vp]),
        "rd_kafka_destroy": (None, [_vp]),
        "rd_kafka_topic_partition_list_new": (_vp, [ctypes.c_int]),
        "rd_kafka_topic_partition_list_add": (_vp, [_vp, ctypes.c_char_p, ctypes.c_int32]),
        "rd_kafka_topic_partition_list_set_offset": (
            ctypes.c_int,
            [_vp, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int64],
        ),
        "rd_kafka_topic_partition_list_destroy": (None, [_vp]),
        "rd_kafka_assign": (ctypes.c_int, [_vp, _vp]),
        "rd_kafka_seek_partitions": (_vp, [_vp, _vp, ctypes.c_int]),
        "rd_kafka_error_string": (ctypes.c_char_p, [_vp]),
        "rd_kafka_error_destroy": (None, [_vp]),
        "rd_kafka_consume_batch_queue": (ctypes.c_ssize_t, [_vp, ctypes.c_int, _vp, ctypes.c_size_t]),
        "rd_kafka_query_watermark_offsets": (
            ctypes.c_int,
            [
                _vp,
                ctypes.c_char_p,
                ctypes.c_int32,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_int,
            ],
        ),
        "rd_kafka_topic_name": (ctypes.c_char_p, [_vp]),
        "rd_kafka_err2str": (ctypes.c_char_p, [ctypes.c_int]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    for name in ("rd_kafka_message_destroy", "rd_kafka_message_timestamp"):  # called by the kernels
        llvm.add_symbol(name, ctypes.cast(getattr(lib, name), _vp).value)
    return lib


def err2str(code: int) -> str:
    return (_lib().rd_kafka_err2str(code) or b"").decode("utf-8", "replace")


# ---------------------------------------------------------------------------- Numba kernels
@intrinsic
def _ptr(typingctx: Any, addr: Any) -> Any:
    """An int64 address as a ``void *``."""
    sig = types.voidptr(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


@intrinsic
def _message_timestamp(typingctx: Any, msg: Any) -> Any:
    """``rd_kafka_message_timestamp(msg, NULL)``: epoch ms, or -1 when the record has none."""
    sig = types.int64(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.IntType(64), [cgutils.voidptr_t, cgutils.voidptr_t])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "rd_kafka_message_timestamp")
        return builder.call(
            fn, [builder.inttoptr(args[0], cgutils.voidptr_t), ir.Constant(cgutils.voidptr_t, None)]
        )

    return sig, codegen


@intrinsic
def _message_destroy(typingctx: Any, msg: Any) -> Any:
    """``rd_kafka_message_destroy(msg)``."""
    sig = types.void(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "rd_kafka_message_destroy")
        builder.call(fn, [builder.inttoptr(args[0], cgutils.voidptr_t)])
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True)
def _int32(word: np.int64) -> np.int64:
    """The signed 32-bit integer in the low half of a little-endian 8-byte word (the rest is padding)."""
    v = word & 0xFFFFFFFF
    return v - 0x100000000 if v >= 0x80000000 else v


@nb.njit(cache=True, nogil=True)
def _headers(
    ptrs: np.ndarray,
    n: int,
    err: np.ndarray,
    rkt: np.ndarray,
    part: np.ndarray,
    off: np.ndarray,
    ts: np.ndarray,
    klen: np.ndarray,
    vlen: np.ndarray,
    vptr: np.ndarray,
) -> None:
    """Public fields of ``n`` messages; ``klen`` / ``vlen`` -1 for a NULL key / payload."""
    for i in range(n):
        h = nb.carray(_ptr(ptrs[i]), (8,), np.int64)  # type: ignore[call-arg]
        e = _int32(h[W_ERR])
        err[i] = e
        rkt[i] = h[W_RKT]
        part[i] = _int32(h[W_PARTITION])
        off[i] = h[W_OFFSET]
        vptr[i] = h[W_PAYLOAD]
        vlen[i] = h[W_LEN] if h[W_PAYLOAD] != 0 else -1
        klen[i] = h[W_KEY_LEN] if h[W_KEY] != 0 else -1
        ts[i] = _message_timestamp(ptrs[i]) if e == 0 else -1  # type: ignore[call-arg]


@nb.njit(cache=True, nogil=True)
def _put(src: int, length: int, data: np.ndarray, pos: int) -> int:
    """Copy ``length`` bytes at address ``src`` to ``data[pos:]`` (nothing for NULL or empty);
    the position after them."""
    if length > 0:
        data[pos : pos + length] = nb.carray(_ptr(src), (length,), np.uint8)  # type: ignore[call-arg, type-var]
        return pos + length
    return pos


@nb.njit(cache=True, nogil=True)
def _copy(
    ptrs: np.ndarray,
    n: int,
    err: np.ndarray,
    klen: np.ndarray,
    vlen: np.ndarray,
    kdata: np.ndarray,
    koffs: np.ndarray,
    kvalid: np.ndarray,
    vdata: np.ndarray,
    voffs: np.ndarray,
    vvalid: np.ndarray,
) -> None:
    """Keys and payloads of the records (``err == 0``) into Arrow ``large_binary`` buffers
    (offsets, data, validity as bytes); then every message is destroyed."""
    j = 0
    kp = 0
    vp = 0
    koffs[0] = 0
    voffs[0] = 0
    for i in range(n):
        if err[i] == 0:
            h = nb.carray(_ptr(ptrs[i]), (8,), np.int64)  # type: ignore[call-arg]
            kvalid[j] = klen[i] >= 0
            kp = _put(h[W_KEY], klen[i], kdata, kp)
            vvalid[j] = vlen[i] >= 0
            vp = _put(h[W_PAYLOAD], vlen[i], vdata, vp)
            j += 1
            koffs[j] = kp
            voffs[j] = vp
        _message_destroy(ptrs[i])  # type: ignore[call-arg]


def _binary(n: int, offs: np.ndarray, data: np.ndarray, valid: np.ndarray) -> pa.Array:
    nulls = int(n - np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid.view(np.bool_), bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        pa.large_binary(), n, [bitmap, pa.py_buffer(offs), pa.py_buffer(data)], null_count=nulls
    )


# ---------------------------------------------------------------------------- the consumer
@dataclass
class ConsumeError:
    """An error event in the consumer's queue (partition EOF among them)."""

    code: int
    topic: str | None
    partition: int
    offset: int
    message: str
    position: int  #: how many of the chunk's records came before it


@dataclass
class Chunk:
    """What one ``consume`` call returned: the records as Arrow-ready columns (arrival order),
    ``topic`` an index into ``topics``, and the error events among them."""

    topics: list[str]
    topic: np.ndarray  # int32
    partition: np.ndarray  # int32
    offset: np.ndarray  # int64
    timestamp: np.ndarray  # int64 epoch ms (-1: none)
    key: pa.Array
    value: pa.Array
    errors: list[ConsumeError] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offset)

    def table(self) -> pa.Table:
        """The records as :data:`engine.sources.readers.RECORD_COLUMNS` (``topic`` a string column)."""
        names = pa.array(self.topics, pa.string())
        topic = pa.DictionaryArray.from_arrays(pa.array(self.topic, pa.int32()), names).cast(pa.string())
        return pa.table(
            {
                "topic": topic,
                "partition": pa.array(self.partition),
                "offset": pa.array(self.offset),
                "timestamp": pa.array(self.timestamp),
                "key": self.key,
                "value": self.value,
            }
        )


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class NativeConsumer:
    """A librdkafka consumer with manual assignment (no group subscription, no commits), whose
    :meth:`consume` returns a :class:`Chunk` of columns instead of message objects.

    ``config`` is librdkafka's configuration (the dict a confluent-kafka ``Consumer`` takes,
    string/number/bool values only).  One thread uses it at a time."""

    def __init__(self, config: dict[str, Any]) -> None:
        lib = _lib()
        self._lib = lib
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        for k, v in config.items():
            if callable(v):
                lib.rd_kafka_conf_destroy(conf)
                raise NativeConsumerError(f"setting {k}: callbacks are not supported by the native consumer")
            if lib.rd_kafka_conf_set(conf, k.encode(), _setting(v).encode(), errstr, len(errstr)) != 0:
                lib.rd_kafka_conf_destroy(conf)
                raise NativeConsumerError(f"setting {k}: {errstr.value.decode('utf-8', 'replace')}")
        rk = lib.rd_kafka_new(1, conf, errstr, len(errstr))  # RD_KAFKA_CONSUMER; owns conf on success
        if not rk:
            lib.rd_kafka_conf_destroy(conf)
            raise NativeConsumerError(f"librdkafka consumer: {errstr.value.decode('utf-8', 'replace')}")
        self._rk = rk
        lib.rd_kafka_poll_set_consumer(rk)  # errors and events come through the consumer queue
        self._q = lib.rd_kafka_queue_get_consumer(rk)
        self._ptrs = np.zeros(0, np.int64)
        self._topics: list[str] = []
        self._topic_idx: dict[str, int] = {}
        self._closed = False

    # ------------------------------------------------------------------ assignment
    def _list(self, parts: list[tuple[str, int, int]]) -> Any:
        lib = self._lib
        tl = lib.rd_kafka_topic_partition_list_new(max(len(parts), 1))
        for topic, part, offset in parts:
            lib.rd_kafka_topic_partition_list_add(tl, topic.encode(), part)
            lib.rd_kafka_topic_partition_list_set_offset(tl, topic.encode(), part, offset)
        return tl

    def assign(self, parts: list[tuple[str, int, int]]) -> None:
        """Read ``(topic, partition, offset)`` (offset :data:`OFFSET_BEGINNING` for the first)."""
        tl = self._list(parts)
        try:
            err = self._lib.rd_kafka_assign(self._rk, tl)
        finally:
            self._lib.rd_kafka_topic_partition_list_destroy(tl)
        if err:
            raise NativeConsumerError(f"assign: {err2str(err)}")

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read ``partition`` from ``offset`` on; what was fetched past it is dropped (at once,
        as confluent-kafka's ``seek``: records still queued may follow, see the caller)."""
        tl = self._list([(topic, partition, offset)])
        try:
            e = self._lib.rd_kafka_seek_partitions(self._rk, tl, 0)
        finally:
            self._lib.rd_kafka_topic_partition_list_destroy(tl)
        if e:
            msg = (self._lib.rd_kafka_error_string(e) or b"").decode("utf-8", "replace")
            self._lib.rd_kafka_error_destroy(e)
            raise NativeConsumerError(f"seek {topic}[{partition}] to {offset}: {msg}")

    def watermarks(self, topic: str, partition: int, timeout_s: float) -> tuple[int, int]:
        """(low, high) offsets of ``partition`` asked of the broker (``read_committed``: high is
        the last stable offset)."""
        lo, hi = ctypes.c_int64(), ctypes.c_int64()
        err = self._lib.rd_kafka_query_watermark_offsets(
            self._rk, topic.encode(), partition, ctypes.byref(lo), ctypes.byref(hi), int(timeout_s * 1000)
        )
        if err:
            raise NativeConsumerError(f"end offsets of {topic}[{partition}]: {err2str(err)}")
        return lo.value, hi.value

    # ------------------------------------------------------------------ reading
    def _topic(self, rkt: int) -> int:
        name = (self._lib.rd_kafka_topic_name(_vp(rkt)) or b"").decode()
        idx = self._topic_idx.get(name)
        if idx is None:
            idx = self._topic_idx[name] = len(self._topics)
            self._topics.append(name)
        return idx

    def consume(self, max_records: int, timeout_s: float) -> Chunk:
        """Up to ``max_records`` records and events: what librdkafka's queue has, waiting up to
        ``timeout_s`` for it to reach ``max_records`` (``rd_kafka_consume_batch_queue``)."""
        lib = self._lib
        if len(self._ptrs) < max_records:
            self._ptrs = np.zeros(max_records, np.int64)
        ptrs = self._ptrs
        n = int(
            lib.rd_kafka_consume_batch_queue(self._q, int(timeout_s * 1000), ptrs.ctypes.data, max_records)
        )
        if n < 0:
            raise NativeConsumerError("consume: the consumer queue is gone")
        err = np.empty(n, np.int32)
        rkt = np.empty(n, np.int64)
        part = np.empty(n, np.int32)
        off = np.empty(n, np.int64)
        ts = np.empty(n, np.int64)
        klen = np.empty(n, np.int64)
        vlen = np.empty(n, np.int64)
        vptr = np.empty(n, np.int64)
        if n:
            _headers(ptrs, n, err, rkt, part, off, ts, klen, vlen, vptr)
        ok = err == 0
        m = int(np.count_nonzero(ok))
        topic = np.zeros(m, np.int32)
        errors: list[ConsumeError] = []
        try:
            for i in np.flatnonzero(~ok):  # rare: read their topic and text before the messages go
                name = self._topics[self._topic(int(rkt[i]))] if rkt[i] else None
                text = (
                    ctypes.string_at(int(vptr[i]), int(vlen[i])).decode("utf-8", "replace")
                    if vlen[i] > 0
                    else ""
                )
                errors.append(
                    ConsumeError(
                        int(err[i]),
                        name,
                        int(part[i]),
                        int(off[i]),
                        text or err2str(int(err[i])),
                        int(np.count_nonzero(ok[:i])),
                    )
                )
            if m:
                handles = rkt[ok]
                for h in np.unique(handles):
                    topic[handles == h] = self._topic(int(h))
        finally:  # every message is destroyed, whatever happened above
            kl, vl = klen[ok], vlen[ok]
            kdata = np.empty(int(kl[kl > 0].sum()), np.uint8)
            vdata = np.empty(int(vl[vl > 0].sum()), np.uint8)
            koffs = np.empty(m + 1, np.int64)
            voffs = np.empty(m + 1, np.int64)
            kvalid = np.empty(m, np.uint8)
            vvalid = np.empty(m, np.uint8)
            if n:
                _copy(ptrs, n, err, klen, vlen, kdata, koffs, kvalid, vdata, voffs, vvalid)
            else:
                koffs[0] = voffs[0] = 0
        return Chunk(
            list(self._topics),
            topic,
            part[ok],
            off[ok],
            ts[ok],
            _binary(m, koffs, kdata, kvalid),
            _binary(m, voffs, vdata, vvalid),
            errors,
        )

    def close(self) -> None:
        """Leave and free the client (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._lib.rd_kafka_consumer_close(self._rk)
        self._lib.rd_kafka_queue_destroy(self._q)
        self._lib.rd_kafka_destroy(self._rk)
