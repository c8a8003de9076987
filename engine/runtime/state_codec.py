"""The engine's state snapshot format: versioned, binary, and unable to run code when read.

:meth:`engine.core.EngineCore.to_bytes` writes the whole driver state with :func:`dumps` and
:meth:`engine.core.EngineCore.from_bytes` reads it with :func:`loads`.  Unlike ``pickle``, a file
cannot name a callable for the reader to call: reading builds only plain containers, NumPy
arrays, Arrow tables, and instances of the classes of an explicit allowlist, and those by
``object.__new__`` and filling ``__dict__`` (no ``__init__``, no ``__setstate__``, no
``__reduce__``).  Whoever can write the checkpoint directory can still give the engine a wrong
state -- values are not checked against the structures' invariants, and the algorithms' Numba
kernels do not check bounds, so a crafted state can crash the engine -- but cannot have it call
anything the file names.

Writing is done in two phases by :mod:`engine.runtime.state_capture`: ``capture(root)`` where the
state is owned (the walk, copies of the arrays), ``Captured.finish()`` in any thread later (Arrow
buffers, the document, the CRC-32); the engine runs the second in its snapshot writer's thread
(:meth:`engine.core.EngineCore.capture`).  :func:`dumps` does both at once.  The format's
constants and the allowlist are in :mod:`engine.runtime.state_format`.

Layout (format version 1, little-endian)::

    header   32 bytes: magic b"TWSTATE\\0", u32 format version, u32 CRC-32 of everything after
             the header, u64 length of the document, u64 length of the data section
    document UTF-8 JSON {"root": node, "classes": ["module:qualname", ...], "shapes":
             [[class, [attribute, ...]], ...], "buffers": [[offset, length], ...]},
             zero-padded to a multiple of 64 bytes
    data     the buffers (array contents, bytes), each at a multiple of 64 of the section

A node is a JSON string, number (an int, a finite float), ``true``, ``false`` or ``null``
standing for itself, or a list whose first element is a tag:

==========================  =====================================================================
``["L", x...]``             list            ``["T", x...]`` tuple (``["u", ...]``: of atoms only)
``["S", x...]``             set             ``["F", x...]`` frozenset
``["D", k, v, k, v...]``    dict (any hashable keys, insertion order kept)
``["I", "0x.."]``           int too long for JSON   ``["f", "nan"|"inf"|"-inf"]`` float
``["B", buf]``              bytes           ``["Y", buf]`` bytearray
``["A", dtype, shape, buf]`` NumPy array (raw C-order buffer, ``dtype.str``; never object)
``["O", shape, n, nulls, type, validity, offsets, data]``  NumPy object array of str / None,
                            as the buffers of an Arrow ``string`` (or ``large_string``) array
                            (other object arrays are refused)
``["s", dtype, "hex"]``     NumPy scalar    ``["P", buf]`` Arrow table (IPC stream)
``["C", h, x...]``          instance of an allowed class: ``shapes[h]`` names its class and the
                            attributes (``__dict__`` and slots) the values ``x...`` are of
``["N", c, buf]``           instance of an :mod:`engine.algorithms` class, by its own exact
                            ``to_bytes`` / ``from_bytes`` (NumPy ``savez`` without pickle;
                            written from copies of its arrays by ``capture_bytes``, if it has it)
``["R", n]``                the n-th shared object again (identity and cycles are kept)
==========================  =====================================================================

Every node other than atoms, ``I``, ``f``, ``s`` and ``u`` is numbered in the order it is first
met (depth first, before its children), so shared objects -- the same structure in a rule and in
its key state, the same array twice -- are written once and restored as one object.  A shape of
a dataclass must name all its fields but those with a default (a field added since the file was
written -- ``RuleInfo.staleness_budget_ms``, migration 0009 -- gets its default); else the class
changed since and the file is refused.

Allowed classes (:func:`allowed`, :mod:`engine.runtime.state_format`): classes defined in a module under ``engine.`` (plain classes:
metaclass ``type``, no ``__new__`` or ``__del__`` of their own, not exceptions), the rule
classes of :mod:`subscriptions.rule_ast` and :mod:`subscriptions.compiler` the evaluator holds,
and classes given to :func:`allow` (tests' stand-in evaluators).  A reader imports at most a
module under ``engine.`` to find a class.

Errors: anything :func:`dumps` (``capture``) cannot write raises :class:`StateNotEncodable` naming the type and
where it is in the state (e.g. ``['evaluator'].rules['r1'].plan``); anything wrong with what
:func:`loads` reads (bad magic, another format version, a damaged or truncated file, a class not
allowed) raises :class:`engine.errors.SnapshotUnreadable` -- the engine then rebuilds its state
from Kafka (:meth:`engine.app.EngineApp.recover`).
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import json
import math
import zlib
from typing import Any

import numpy as np
import pyarrow as pa

from engine.errors import SnapshotUnreadable
from engine.runtime.state_capture import capture
from engine.runtime.state_format import (
    _ATOMS,
    _DTYPE,
    _HEADER,
    FORMAT_VERSION,
    MAGIC,
    StateNotEncodable,
    _native,
    _path_of,
    _resolve,
    _slots,
    allow,
    allowed,
)

__all__ = ["FORMAT_VERSION", "MAGIC", "StateNotEncodable", "allow", "allowed", "dumps", "loads"]


# ---------------------------------------------------------------- writing
def dumps(root: Any) -> bytes:
    """The snapshot bytes of ``root`` (see the module's docstring): both phases of
    :mod:`engine.runtime.state_capture` at once; :class:`StateNotEncodable` when it holds
    something the format does not."""
    return b"".join(capture(root).finish())


# ---------------------------------------------------------------- reading
_PENDING = object()  # a tuple / frozenset being read: a reference to it is a damaged file


class _Decoder:
    def __init__(self, data: memoryview, table: list[Any], classes: list[Any], shapes: list[Any]) -> None:
        self.data = data
        self.table = table
        self.memo: list[Any] = []
        #: per class of the document: (class, whether in its native form)
        self.classes = [(cls, _native(cls)) for cls in map(_resolve, classes)]
        #: per shape of the document: (class, attribute names, those that are slots)
        self.shapes: list[tuple[type, tuple[str, ...], frozenset[str]]] = []
        #: per shape: the dataclass fields the file lacks that have a default (added since)
        self.added: list[tuple[dataclasses.Field[Any], ...]] = []
        for ci, names in shapes:
            cls, native = self.classes[_index(ci, len(self.classes))]
            if native or type(names) is not list or len(set(names)) != len(names):
                raise SnapshotUnreadable(f"bad attributes of {_path_of(cls)}")
            if not all(type(k) is str and k.isidentifier() and not k.startswith("__") for k in names):
                raise SnapshotUnreadable(f"bad attributes of {_path_of(cls)}")
            added: tuple[dataclasses.Field[Any], ...] = ()
            if dataclasses.is_dataclass(cls):
                absent = [f for f in dataclasses.fields(cls) if f.name not in names]
                missing = sorted(f.name for f in absent if not _has_default(f))
                if missing:
                    raise SnapshotUnreadable(f"{_path_of(cls)} lacks the fields {missing} (another layout)")
                added = tuple(absent)  # fields added since, with defaults: they get them
            slots = frozenset(_slots(cls)).intersection(names)
            if not slots.issuperset(names) and not hasattr(cls, "__dict__"):
                raise SnapshotUnreadable(f"{_path_of(cls)} has no attributes {names}")
            if added and not hasattr(cls, "__dict__"):
                raise SnapshotUnreadable(f"{_path_of(cls)} lacks the fields {[f.name for f in added]}")
            self.shapes.append((cls, tuple(names), slots))
            self.added.append(added)

    def buf(self, i: Any) -> memoryview:
        off, n = self.table[_index(i, len(self.table))]
        if not (
            isinstance(off, int) and isinstance(n, int) and 0 <= off and 0 <= n and off + n <= len(self.data)
        ):
            raise SnapshotUnreadable(f"buffer {i} lies outside the data")
        return self.data[off : off + n]

    def dec(self, n: Any) -> Any:  # noqa: C901 - one dispatch over the node kinds
        t = type(n)
        if t is not list:
            if t is dict:
                raise SnapshotUnreadable("an object where a value was expected")
            return n
        tag = n[0]
        if tag == "R":
            v = self.memo[_index(n[1], len(self.memo))]
            if v is _PENDING:
                raise SnapshotUnreadable("a reference into an unfinished tuple")
            return v
        if tag == "I":
            return int(n[1], 16)
        if tag == "f":
            if n[1] not in ("nan", "inf", "-inf"):
                raise SnapshotUnreadable(f"bad float {n[1]!r}")
            return float(n[1])
        if tag == "s":
            return np.frombuffer(bytes.fromhex(n[2]), _dtype(n[1]))[0]
        if tag == "u":
            if not set(map(type, n)) <= _ATOMS:
                raise SnapshotUnreadable("a tuple of atoms holding containers")
            return tuple(n[1:])
        at = len(self.memo)
        self.memo.append(_PENDING)
        if tag == "L":
            out: Any = []
            self.memo[at] = out
            out.extend(self.many(n))
        elif tag == "D":
            out = {}
            self.memo[at] = out
            if len(n) % 2 == 0:
                raise SnapshotUnreadable("a dict of an odd number of items")
            if set(map(type, n)) <= _ATOMS:
                out.update(zip(itertools.islice(n, 1, None, 2), itertools.islice(n, 2, None, 2), strict=True))
                return out
            dec = self.dec
            for j in range(1, len(n), 2):
                k = dec(n[j])
                out[k] = dec(n[j + 1])
        elif tag == "S":
            out = set()
            self.memo[at] = out
            out.update(self.many(n))
        elif tag == "T":
            out = tuple(self.many(n))
        elif tag == "F":
            out = frozenset(self.many(n))
        elif tag == "B":
            out = bytes(self.buf(n[1]))
        elif tag == "Y":
            out = bytearray(self.buf(n[1]))
        elif tag == "A":
            out = self.array(n)
        elif tag == "O":
            out = self.objects(n)
        elif tag == "P":
            out = pa.ipc.open_stream(pa.py_buffer(bytes(self.buf(n[1])))).read_all()
        elif tag == "N":
            cls, native = self.classes[_index(n[1], len(self.classes))]
            if not native:
                raise SnapshotUnreadable(f"{_path_of(cls)} has no native form")
            out = cls.from_bytes(bytes(self.buf(n[2])))  # type: ignore[attr-defined]
            if type(out) is not cls:
                raise SnapshotUnreadable(f"{_path_of(cls)}.from_bytes gave a {type(out).__name__}")
        elif tag == "C":
            out = self.instance(n, at)
        else:
            raise SnapshotUnreadable(f"unknown node tag {tag!r}")
        self.memo[at] = out
        return out

    def many(self, n: list[Any]) -> list[Any]:
        if set(map(type, n)) <= _ATOMS:
            return n[1:]
        dec = self.dec
        return [dec(x) for x in itertools.islice(n, 1, None)]

    def instance(self, n: list[Any], at: int) -> Any:
        cls, names, slots = self.shapes[_index(n[1], len(self.shapes))]
        if len(n) != 2 + len(names):
            raise SnapshotUnreadable(
                f"{len(n) - 2} values for the {len(names)} attributes of {_path_of(cls)}"
            )
        obj: Any = object.__new__(cls)
        self.memo[at] = obj
        if set(map(type, n)) <= _ATOMS:
            state = dict(zip(names, itertools.islice(n, 2, None), strict=True))
        else:
            dec = self.dec
            state = {k: dec(v) for k, v in zip(names, itertools.islice(n, 2, None), strict=True)}
        for k in slots:
            object.__setattr__(obj, k, state.pop(k))
        for f in self.added[n[1]]:
            state[f.name] = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        if state:
            obj.__dict__.update(state)
        return obj

    def array(self, n: list[Any]) -> np.ndarray:
        dt = _dtype(n[1])
        shape = _shape(n[2])
        count = math.prod(shape)
        b = self.buf(n[3])
        if len(b) != count * dt.itemsize:
            raise SnapshotUnreadable(f"an array of {len(b)} bytes for {shape} x {dt}")
        return np.frombuffer(b, dt, count).reshape(shape).copy()

    def objects(self, n: list[Any]) -> np.ndarray:
        shape, size, nulls = _shape(n[1]), n[2], n[3]
        if (
            type(size) is not int
            or size != math.prod(shape)
            or type(nulls) is not int
            or not 0 <= nulls <= size
        ):
            raise SnapshotUnreadable("a bad object array")
        kind = {"string": pa.string(), "large_string": pa.large_string()}[n[4]]
        bufs = [None if i is None else pa.py_buffer(self.buf(i)) for i in n[5:8]]
        if len(n) != 8 or bufs[1] is None or bufs[2] is None or (nulls and bufs[0] is None):
            raise SnapshotUnreadable("a bad object array")
        s = pa.Array.from_buffers(kind, size, bufs, nulls)
        s.validate(full=True)  # offsets in bounds and increasing, UTF-8, the null count
        out = s.to_numpy(zero_copy_only=False)
        return out.reshape(shape)


def _index(i: Any, n: int) -> int:
    if type(i) is not int or not 0 <= i < n:
        raise SnapshotUnreadable(f"bad reference {i!r}")
    return i


def _dtype(s: Any) -> np.dtype[Any]:
    if not isinstance(s, str) or not _DTYPE.match(s):
        raise SnapshotUnreadable(f"bad dtype {s!r}")
    return np.dtype(s)


def _shape(s: Any) -> tuple[int, ...]:
    if type(s) is not list or not all(type(d) is int and d >= 0 for d in s) or len(s) > 32:
        raise SnapshotUnreadable(f"bad shape {s!r}")
    return tuple(s)


def _no_constant(name: str) -> Any:
    raise SnapshotUnreadable(f"bad number {name}")


def loads(data: bytes | bytearray | memoryview) -> Any:
    """The state written by :func:`dumps`; :class:`~engine.errors.SnapshotUnreadable` when the
    bytes are not a snapshot of this format version, are damaged, or name a class not allowed."""
    mv = memoryview(data).cast("B")
    if len(mv) < _HEADER.size or bytes(mv[: len(MAGIC)]) != MAGIC:
        raise SnapshotUnreadable("not a Tidewatch state snapshot (bad magic)")
    _, version, crc, doc_len, data_len = _HEADER.unpack_from(mv)
    if version != FORMAT_VERSION:
        raise SnapshotUnreadable(f"state format version {version}; this engine reads {FORMAT_VERSION}")
    if len(mv) != _HEADER.size + doc_len + data_len:
        raise SnapshotUnreadable(
            f"{len(mv)} bytes where the header says {_HEADER.size + doc_len + data_len} (truncated?)"
        )
    body = mv[_HEADER.size :]
    if zlib.crc32(body) != crc:
        raise SnapshotUnreadable("checksum mismatch (a damaged file)")
    collecting = gc.isenabled()
    gc.disable()  # reading makes ~10**6 objects, all kept: no collection can free any
    try:
        doc = json.loads(bytes(body[:doc_len]).rstrip(b"\x00"), parse_constant=_no_constant)
        dec = _Decoder(body[doc_len:], doc["buffers"], doc["classes"], doc["shapes"])
        return dec.dec(doc["root"])
    except SnapshotUnreadable:
        raise
    except Exception as exc:  # whatever a damaged document makes the reader trip on
        raise SnapshotUnreadable(f"a damaged snapshot ({type(exc).__name__}: {exc})") from exc
    finally:
        if collecting:
            gc.enable()


def _has_default(f: dataclasses.Field[Any]) -> bool:
    """Whether a dataclass field has a default (a value or a factory)."""
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
