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
                            ``to_bytes`` / ``from_bytes`` (NumPy ``savez`` without pickle)
``["R", n]``                the n-th shared object again (identity and cycles are kept)
==========================  =====================================================================

Every node other than atoms, ``I``, ``f``, ``s`` and ``u`` is numbered in the order it is first
met (depth first, before its children), so shared objects -- the same structure in a rule and in
its key state, the same array twice -- are written once and restored as one object.  A shape of
a dataclass must name all its fields (else the class changed since: the file is refused).

Allowed classes (:func:`allowed`): classes defined in a module under ``engine.`` (plain classes:
metaclass ``type``, no ``__new__`` or ``__del__`` of their own, not exceptions), the rule
classes of :mod:`subscriptions.rule_ast` and :mod:`subscriptions.compiler` the evaluator holds,
and classes given to :func:`allow` (tests' stand-in evaluators).  A reader imports at most a
module under ``engine.`` to find a class.

Errors: anything :func:`dumps` cannot write raises :class:`StateNotEncodable` naming the type and
where it is in the state (e.g. ``['evaluator'].rules['r1'].plan``); anything wrong with what
:func:`loads` reads (bad magic, another format version, a damaged or truncated file, a class not
allowed) raises :class:`engine.errors.SnapshotUnreadable` -- the engine then rebuilds its state
from Kafka (:meth:`engine.app.EngineApp.recover`).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import itertools
import json
import math
import re
import struct
import sys
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pydantic_core

from engine.errors import EngineError, SnapshotUnreadable

__all__ = ["FORMAT_VERSION", "MAGIC", "StateNotEncodable", "allow", "allowed", "dumps", "loads"]

MAGIC = b"TWSTATE\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQQ")  # magic, version, crc32, document length, data length
_ALIGN = 64
_I64 = 1 << 63
#: dtype strings of arrays and scalars (byte order, kind, item size, datetime unit)
_DTYPE = re.compile(r"^[<>|=][biufcmMUS]\d{1,5}(\[\w{1,8}\])?$")
_CLASS = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ATOMS: frozenset[type] = frozenset({str, int, float, bool, type(None)})
_PLAIN: frozenset[type] = frozenset({str, bool, type(None)})
_LOOSE: frozenset[type] = _PLAIN | {
    int
}  # ints as JSON numbers, any size (unless json.loads would refuse one)
_ZEROS = bytes(_ALIGN)
_SMALL = 4096  # arrays of up to this many bytes are copied as bytes
_NO_STATE: dict[str, Any] = {}
_UNSEEN: Any = object()


class StateNotEncodable(EngineError, TypeError):
    """:func:`dumps` met something the snapshot format does not hold (an unknown type, a class
    not allowed, an object array of something else than str): ``type_name`` and ``path`` (where,
    from the root, e.g. ``.evaluator.groups[('trades', 'symbol')]``) say what and where."""

    def __init__(self, type_name: str, path: str, reason: str) -> None:
        super().__init__(f"cannot snapshot {type_name} at {path or 'the root'}: {reason}")
        self.type_name = type_name
        self.path = path
        self.reason = reason


class _Fail(EngineError):
    """Internal: an unencodable value, with the path collected while unwinding."""

    def __init__(self, type_name: str, reason: str) -> None:
        super().__init__(reason)
        self.type_name = type_name
        self.reason = reason
        self.parts: list[str] = []


# ---------------------------------------------------------------- the allowlist
_registered: dict[str, type] = {}


def _path_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _plain(cls: type) -> bool:
    """A class whose instances can be made by ``object.__new__`` and filled without running code."""
    return (
        type(cls) is type
        and cls.__new__ is object.__new__
        and getattr(cls, "__del__", None) is None
        and not issubclass(cls, BaseException)
        and "<locals>" not in cls.__qualname__
    )


def allow(cls: type) -> type:
    """Allow ``cls`` in snapshots besides the engine's own classes (e.g. a test's stand-in
    evaluator); returns ``cls`` (usable as a decorator).  TypeError for a class whose instances
    cannot be made without running its code (its own ``__new__`` or ``__del__``, a metaclass)."""
    if not _plain(cls):
        raise TypeError(f"{_path_of(cls)} cannot be restored without running its code")
    _registered[_path_of(cls)] = cls
    return cls


def _explicit() -> dict[str, type]:
    """The classes outside ``engine.`` the evaluator holds (a compiled rule), and :func:`allow`'s."""
    if "subscriptions.compiler:Plan" not in _registered:
        from subscriptions import compiler
        from subscriptions import rule_ast as A

        ast = [c for c in vars(A).values() if isinstance(c, type) and c.__module__ == A.__name__]
        for c in [*ast, compiler.AggSpec, compiler.Atom, compiler.Plan]:
            if dataclasses.is_dataclass(c) and _plain(c):
                _registered[_path_of(c)] = c
    return _registered


def allowed(cls: type) -> bool:
    """Whether instances of ``cls`` may be written to and read from a snapshot."""
    reg = _explicit().get(_path_of(cls))
    if reg is not None:
        return reg is cls
    return cls.__module__.startswith("engine.") and _plain(cls)


def _resolve(name: str) -> type:
    """The allowed class named ``module:qualname`` (SnapshotUnreadable if none); imports at most
    a module under ``engine.``."""
    if not isinstance(name, str) or not _CLASS.match(name):
        raise SnapshotUnreadable(f"bad class name {name!r}")
    reg = _explicit().get(name)
    if reg is not None:
        return reg
    mod_name, qual = name.split(":")
    if not mod_name.startswith("engine."):
        raise SnapshotUnreadable(f"the snapshot names {name}, which is not allowed in a snapshot")
    mod = sys.modules.get(mod_name)
    if mod is None:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as exc:
            raise SnapshotUnreadable(f"the snapshot names {name}: no module {mod_name}") from exc
    obj: Any = mod
    for part in qual.split("."):
        obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
    if not isinstance(obj, type) or _path_of(obj) != name or not allowed(obj):
        raise SnapshotUnreadable(f"the snapshot names {name}, which is not an allowed class here")
    return obj


def _native(cls: type) -> bool:
    """An :mod:`engine.algorithms` class with its own exact ``to_bytes`` / ``from_bytes``."""
    return (
        cls.__module__.startswith("engine.algorithms")
        and callable(getattr(cls, "to_bytes", None))
        and callable(getattr(cls, "from_bytes", None))
    )


def _slots(cls: type) -> list[str]:
    out: list[str] = []
    for c in cls.__mro__:
        s = vars(c).get("__slots__", ())
        out += [s] if isinstance(s, str) else [n for n in s if n not in ("__dict__", "__weakref__")]
    return out


# ---------------------------------------------------------------- writing
def _atomic(xs: Any, fast: frozenset[type]) -> bool:
    """Whether every element of ``xs`` is written as itself (no tag, no recursion): of a type of
    ``fast``, or a finite float."""
    kinds = set(map(type, xs))
    if kinds <= fast:
        return True
    if float not in kinds or not kinds <= fast | {float}:
        return False
    floats = xs if kinds == {float} else [v for v in xs if type(v) is float]
    return all(map(math.isfinite, floats))


def _dtype_str(dt: np.dtype[Any]) -> str | None:
    s = dt.str
    return s if _DTYPE.match(s) else None


#: class -> [tag "C" or "N", index in ``classes``, slot names, {attribute names: shape index},
#: whether the last instance held atoms only]
_Kind = list[Any]


class _Encoder:
    """One walk of the state, depth first (see the module's docstring for the nodes).  Speed:
    everything the C code of the interpreter can check in bulk is checked so -- a container or
    an instance whose items are all atoms (``set(map(type, ...))``) is copied into its node as
    a whole; per class the attribute names of the last layouts met are looked up once per
    instance (one tuple of the ``__dict__``'s keys), never per attribute."""

    def __init__(self, strict: bool = False) -> None:
        self.memo: dict[int, int] = {}  # id -> node number (all are reachable from the root: ids stay)
        self.count = 0
        self.open: set[int] = set()  # tuples / frozensets being written (a cycle through one is refused)
        self.buffers: list[Any] = []  # uint8 arrays or bytes
        self.size = 0
        self.table: list[list[int]] = []
        self.classes: list[str] = []
        self.kinds: dict[type, _Kind] = {}
        #: [class index, attribute names] of the instances written, and their index
        self.shapes: list[list[Any]] = []
        self.dtypes: dict[np.dtype[Any], str | None] = {}
        #: types written as themselves without a look (strict: ints beyond 64 bits become "I"
        #: nodes -- the second try, when the document holds an int of thousands of digits)
        self.strict = strict
        self.fast = _PLAIN if strict else _LOOSE

    def buf(self, b: Any) -> int:
        n = len(b) if isinstance(b, bytes | bytearray) else int(b.nbytes)
        pad = -self.size % _ALIGN
        if pad:
            self.buffers.append(_ZEROS[:pad])
            self.size += pad
        self.table.append([self.size, n])
        self.buffers.append(b)
        self.size += n
        return len(self.table) - 1

    def items(self, tag: str, xs: Any, where: Callable[[int], str]) -> list[Any]:
        fast = self.fast
        if _atomic(xs, fast):
            return [tag, *xs]
        out: list[Any] = [tag]
        enc = self.enc
        try:
            for x in xs:
                tx = type(x)
                if tx in fast or (tx is float and x - x == 0.0):
                    out.append(x)
                elif tx is tuple and set(map(type, x)) <= fast:
                    out.append(["u", *x])
                else:
                    out.append(enc(x))
        except _Fail as f:
            f.parts.append(where(len(out) - 1))
            raise
        return out

    def enc(self, x: Any) -> Any:  # noqa: C901 - one dispatch over the node kinds
        t = type(x)
        if t in _PLAIN:
            return x
        if t is int:
            return x if not self.strict or -_I64 <= x < _I64 else ["I", hex(x)]
        if t is float:
            return x if math.isfinite(x) else ["f", repr(x)]
        if t is tuple and _atomic(x, self.fast):  # immutable, no identity to keep: not numbered
            return ["u", *x]
        i = id(x)
        memo = self.memo
        m = memo.get(i)
        if m is not None:
            if i in self.open:
                raise _Fail(t.__name__, "a cycle through an immutable container")
            return ["R", m]
        kind = self.kinds.get(t)
        if kind is not None and kind[0] == "C":
            memo[i] = self.count
            self.count += 1
            return self.instance(x, kind)
        if isinstance(x, np.generic):
            return self.scalar(x)
        memo[i] = self.count
        self.count += 1
        if t is list:
            return self.items("L", x, _at)
        if t is dict:
            return self.mapping(x)
        if t is tuple or t is frozenset:
            self.open.add(i)
            out = self.items("T", x, _at) if t is tuple else self.items("F", list(x), _member)
            self.open.discard(i)
            return out
        if t is set:
            return self.items("S", list(x), _element)
        if t is bytes:
            return ["B", self.buf(x)]
        if t is bytearray:
            return ["Y", self.buf(bytes(x))]
        if t is np.ndarray:
            return self.array(x)
        if t is pa.Table:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, x.schema) as w:
                w.write_table(x)
            return ["P", self.buf(sink.getvalue().to_pybytes())]
        if kind is None:
            if not allowed(t):
                raise _Fail(_path_of(t), "not an allowed class (engine.runtime.state_codec.allow)")
            kind = ["N" if _native(t) else "C", len(self.classes), tuple(_slots(t)), {}, True]
            self.classes.append(_path_of(t))
            self.kinds[t] = kind
        if kind[0] == "N":
            return ["N", kind[1], self.buf(x.to_bytes())]
        return self.instance(x, kind)

    def mapping(self, d: dict[Any, Any]) -> list[Any]:
        fast = self.fast
        if _atomic(d.keys(), fast) and _atomic(d.values(), fast):
            return ["D", *itertools.chain.from_iterable(d.items())]
        out: list[Any] = ["D"]
        enc = self.enc
        k: Any = None
        try:
            for k, v in d.items():
                tk = type(k)
                out.append(k if tk in fast or (tk is float and k - k == 0.0) else enc(k))
                tv = type(v)
                if tv in fast or (tv is float and v - v == 0.0):
                    out.append(v)
                elif tv is tuple and set(map(type, v)) <= fast:
                    out.append(["u", *v])
                else:
                    out.append(enc(v))
        except _Fail as f:
            f.parts.append(f"<key {k!r}>" if len(out) % 2 else f"[{k!r}]")
            raise
        return out

    def instance(self, x: Any, kind: _Kind) -> list[Any]:
        if kind[2]:
            state = dict(getattr(x, "__dict__", None) or {})
            for name in kind[2]:
                if hasattr(x, name):
                    state[name] = getattr(x, name)
        else:
            state = getattr(x, "__dict__", _NO_STATE)
        names = tuple(state)
        shapes = kind[3]
        sh = shapes.get(names)
        if sh is None:
            sh = shapes[names] = len(self.shapes)
            self.shapes.append([kind[1], list(names)])
        out: list[Any] = ["C", sh]
        values = state.values()
        fast = self.fast
        if kind[4] and set(map(type, values)) <= fast:
            out += values
            return out
        enc = self.enc
        kinds = self.kinds
        memo = self.memo
        flat = True
        try:
            for v in values:
                tv = type(v)
                if tv in fast or (tv is float and v - v == 0.0):
                    out.append(v)  # an atom written as itself (a float: finite)
                    continue
                flat = False
                if tv is tuple and set(map(type, v)) <= fast:
                    out.append(["u", *v])
                    continue
                k = kinds.get(tv)
                if k is not None and k[0] == "C":  # an instance: enc's path, inlined
                    i = id(v)
                    m = memo.get(i)
                    if m is None:
                        memo[i] = self.count
                        self.count += 1
                        out.append(self.instance(v, k))
                    elif i in self.open:
                        out.append(enc(v))
                    else:
                        out.append(["R", m])
                else:
                    out.append(enc(v))
        except _Fail as f:
            f.parts.append(f".{names[len(out) - 2]}")
            raise
        kind[4] = flat  # try the whole at once next time when this one was all atoms
        return out

    def scalar(self, x: np.generic) -> list[Any]:
        dt = _dtype_str(x.dtype)
        if dt is None:
            raise _Fail(f"numpy.{type(x).__name__}", "a NumPy scalar of an unsupported dtype")
        return ["s", dt, x.tobytes().hex()]

    def array(self, a: np.ndarray) -> list[Any]:
        dtype = a.dtype
        if dtype.hasobject:
            return self.objects(a)
        dt = self.dtypes.get(dtype, _UNSEEN)
        if dt is _UNSEEN:
            dt = self.dtypes[dtype] = _dtype_str(dtype)
        if dt is None:
            raise _Fail(f"numpy array of {dtype}", "an unsupported dtype (structured or object)")
        if a.nbytes <= _SMALL:  # a copy costs less than the views
            return ["A", dt, list(a.shape), self.buf(a.tobytes())]
        c = np.ascontiguousarray(a)
        return ["A", dt, list(a.shape), self.buf(c.reshape(-1).view(np.uint8))]

    def objects(self, a: np.ndarray) -> list[Any]:
        if a.dtype != object:
            raise _Fail(f"numpy array of {a.dtype}", "an unsupported dtype (structured or object)")
        flat = a.ravel()
        if not set(map(type, flat)) <= {str, type(None)}:
            odd = [type(v).__name__ for v in flat if v is not None and not isinstance(v, str)]
            if odd:
                raise _Fail("numpy object array", f"it holds a {odd[0]} (only str and None are written)")
        s = pa.array(flat, type=pa.string(), from_pandas=False)
        if isinstance(s, pa.ChunkedArray):  # over 2 GiB of text: 64-bit offsets
            s = pa.array(flat, type=pa.large_string(), from_pandas=False)
        validity, offsets, data = s.buffers()
        bufs = [
            None if b is None else self.buf(np.frombuffer(b, np.uint8)) for b in (validity, offsets, data)
        ]
        return ["O", list(a.shape), len(s), s.null_count, str(s.type), *bufs]


def _at(i: int) -> str:
    return f"[{i}]"


def _member(i: int) -> str:
    return f"<{i}>"


def _element(i: int) -> str:
    return f"<element {i}>"


def _document(e: _Encoder, node: Any) -> bytes:
    """The JSON text of the document (compact, no NaN): by ``pydantic_core.to_json`` (Rust, about
    three times ``json.dumps``), or ``json.dumps`` for what it refuses (a lone surrogate)."""
    doc = {"root": node, "classes": e.classes, "shapes": e.shapes, "buffers": e.table}
    try:
        return pydantic_core.to_json(doc)
    except pydantic_core.PydanticSerializationError:
        return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()


def _long_digits(text: bytes) -> bool:
    """Whether ``text`` may hold a run of more digits than ``json.loads`` reads as an int
    (``sys.get_int_max_str_digits``).  Such a run holds a whole block of half the limit, aligned:
    only blocks that begin and end with a digit are read whole, the rest is not looked at."""
    limit = sys.get_int_max_str_digits()
    if limit == 0 or len(text) <= limit:
        return False
    step = limit // 2
    m = len(text) // step
    blocks = np.frombuffer(text, np.uint8, m * step).reshape(m, step)
    ends = np.flatnonzero(((blocks[:, 0] - 48) < 10) & ((blocks[:, -1] - 48) < 10))
    if not ((blocks[ends] - 48) < 10).all(axis=1).any():
        return False
    digit = np.concatenate([[False], (np.frombuffer(text, np.uint8) - 48) < 10, [False]]).view(np.int8)
    edges = np.flatnonzero(np.diff(digit))
    return bool((edges[1::2] - edges[0::2]).max() > limit)


def dumps(root: Any) -> bytes:
    """The snapshot bytes of ``root`` (see the module's docstring); :class:`StateNotEncodable`
    when it holds something the format does not."""
    collecting = gc.isenabled()
    gc.disable()  # the walk makes ~10**5 lists and holds them all: no collection can free any
    try:
        for strict in (False, True):
            e = _Encoder(strict)
            try:
                node = e.enc(root)
            except _Fail as f:
                raise StateNotEncodable(f.type_name, "".join(reversed(f.parts)), f.reason) from None
            except RecursionError:
                raise StateNotEncodable("state", "", "nested too deeply") from None
            doc = _document(e, node)
            del node
            if strict or not _long_digits(doc):
                break  # else an int of thousands of digits: again, big ints as "I" nodes
    finally:
        if collecting:
            gc.enable()
    doc += _ZEROS[: -len(doc) % _ALIGN]
    crc = zlib.crc32(doc)
    for b in e.buffers:
        crc = zlib.crc32(b, crc)
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, crc, len(doc), e.size)
    return b"".join([head, doc, *e.buffers])


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
        for ci, names in shapes:
            cls, native = self.classes[_index(ci, len(self.classes))]
            if native or type(names) is not list or len(set(names)) != len(names):
                raise SnapshotUnreadable(f"bad attributes of {_path_of(cls)}")
            if not all(type(k) is str and k.isidentifier() and not k.startswith("__") for k in names):
                raise SnapshotUnreadable(f"bad attributes of {_path_of(cls)}")
            if dataclasses.is_dataclass(cls):
                missing = sorted({f.name for f in dataclasses.fields(cls)} - set(names))
                if missing:
                    raise SnapshotUnreadable(f"{_path_of(cls)} lacks the fields {missing} (another layout)")
            slots = frozenset(_slots(cls)).intersection(names)
            if not slots.issuperset(names) and not hasattr(cls, "__dict__"):
                raise SnapshotUnreadable(f"{_path_of(cls)} has no attributes {names}")
            self.shapes.append((cls, tuple(names), slots))

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
