"""Writing a state snapshot in two phases: :func:`capture` in the evaluation thread, then
:meth:`Captured.finish` wherever it suits (the snapshot writer's background thread).

The state must be written as it is at the end of a batch, and the next batch changes it; until
Nov 27 the whole serialization (:func:`engine.runtime.state_codec.dumps`) ran in the evaluation
thread and the batch after a snapshot waited for it (2--4 s at 10,000 rules,
docs/measurements/engine.md).  It is now split at the one line that matters -- what must see the
state as it is now, and what can work on a private copy:

* :func:`capture` (calling thread, the state must not change meanwhile): the walk of the object
  graph into the nodes of the format (containers, instances, shared objects numbered, paths of
  unencodable values), a copy of every array's buffer (a ``memcpy``), a shallow ``copy()`` of
  every object array of str (its elements are immutable), the algorithm structures'
  ``capture_bytes()`` -- it gathers the rows as a compaction lays them out and copies the other
  arrays its ``to_bytes`` would write (so it must run where the structure is used), and gives a
  callable that writes them later (``engine.algorithms._pool.Packing``; a class without it: its
  ``to_bytes`` now) --,
  Arrow tables' IPC stream and NumPy scalars.  What it returns shares nothing mutable with the
  state: the nodes are lists holding atoms (immutable) -- its own, or a :class:`CaptureCache`'s,
  which nothing changes --, the buffers are copies, ``bytes``, or the structures' callables
  holding copies.
* :meth:`Captured.finish` (any thread, later; the state may have changed since): the object
  arrays' Arrow buffers, the structures' bytes (``np.savez`` of the copies), the buffers'
  offsets, the JSON document, the CRC-32 and the header.  It returns the file's pieces in order,
  not one ``bytes`` of hundreds of megabytes: the writer writes them one after another
  (:func:`engine.runtime.snapshot_writer.atomic_write`).  The one difference it can make: the
  zip entries ``np.savez`` writes are stamped with the time of day (2-second steps), so they
  hold the time of the finish, not of the capture (nothing reads them).

``b"".join(capture(root).finish())`` is :func:`engine.runtime.state_codec.dumps`: the same bytes
the one-phase writer of before gave (tests/engine/runtime/test_state_capture.py), whatever the
state does between the two phases.

The capture reuses the nodes of the compiled rules of the previous capture when given a
:class:`~engine.runtime.capture_cache.CaptureCache` (the same bytes; see that module).

Ints too long for JSON (the strict retry).  The document writes ints as JSON numbers, of any size;
``json.loads`` refuses a number of more than ``sys.get_int_max_str_digits()`` digits, so when the
document holds a run of that many digits (:func:`_long_digits`: a huge int, or a string of digits
-- the text check cannot tell them apart) the writer writes it again "strict": every int beyond
64 bits as an ``["I", hex]`` node, and as a consequence every tuple holding an int as a numbered
``T`` node (strict, it is no tuple of plain atoms) instead of a ``u`` node.  The one-phase writer
walked the state a second time for that.  Here the check needs the document, made in
:meth:`Captured.finish`, when the state may have changed, so the strict document is derived from
the captured nodes instead (:func:`_strictly`), not from the state.  Ints are immutable and the
nodes hold the state's own int objects, so big ints become ``I`` nodes there.  The tuples the
``u`` nodes were made of (immutable too) are remembered in the order the nodes were made
(:attr:`_Encoder.tuples`), so a tuple holding an int becomes a ``T`` node, numbered, and its
next occurrences ``R`` nodes of it, as the strict walk would number them; every later node's
number -- and every ``R`` node pointing to one -- shifts accordingly.  The walk makes and numbers
nodes depth first, before their children, which is the order of the captured node tree, so one
pass over it renumbers exactly.  The common case (no such run) costs nothing but the list of
tuples.  (Detecting huge ints during the walk instead would not do: the retry is decided by the
document's text, strings of digits included, and looking at every int and str would slow the
walk's bulk checks.)

Errors: :func:`capture` raises :class:`~engine.runtime.state_format.StateNotEncodable` (what and
where) for anything the format does not hold, as the one-phase writer did; :meth:`Captured.finish`
raises :class:`CaptureMismatch` only if Arrow's conversion of an object array disagrees with what
the capture foresaw of it (a change of Arrow; tested), never for anything in the state.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import sys
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pydantic_core

from engine.errors import EngineError
from engine.runtime.capture_cache import (
    _IMMUTABLE,
    CaptureCache,
    _Entry,
    _made,
    _Moved,
    immutable,
)
from engine.runtime.state_format import (
    _ALIGN,
    _DTYPE,
    _HEADER,
    _I64,
    _LOOSE,
    _PLAIN,
    _SMALL,
    _ZEROS,
    FORMAT_VERSION,
    MAGIC,
    StateNotEncodable,
    _Fail,
    _native,
    _path_of,
    _slots,
    allowed,
)

__all__ = ["CaptureCache", "CaptureMismatch", "Captured", "capture", "immutable"]

_NO_STATE: dict[str, Any] = {}
_UNSEEN: Any = object()
_NONE = type(None)
#: tags of nodes that hold no value of the state's but buffer numbers, dtypes and shapes
_LEAVES = frozenset("ABYOPN")


class _Later:
    """A buffer made by :meth:`Captured.finish`: an algorithm structure's ``to_bytes`` as of the
    capture (its ``capture_bytes()``, which holds copies of what it needs)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], bytes]) -> None:
        self.make = make


class CaptureMismatch(EngineError, RuntimeError):
    """:meth:`Captured.finish` found an object array's Arrow buffers other than :func:`capture`
    foresaw (a validity buffer exactly when the array holds a None): a change of Arrow's, never
    a matter of the state.  No file is written."""


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

    def __init__(self, cache: CaptureCache | None = None, copy: bool = True) -> None:
        #: copy what the state may change after the capture (False: an image nothing changes)
        self.copy = copy
        self.memo: dict[int, int] = {}  # id -> node number (all are reachable from the root: ids stay)
        self.count = 0
        self.open: set[int] = set()  # tuples / frozensets being written (a cycle through one is refused)
        #: the data section's buffers by number: bytes or uint8 arrays of their own (copies), None
        #: for those of the object arrays, made by :meth:`Captured.finish`
        self.buffers: list[Any] = []
        self.classes: list[str] = []
        self.kinds: dict[type, _Kind] = {}
        #: [class index, attribute names] of the instances written, and their index
        self.shapes: list[list[Any]] = []
        self.dtypes: dict[np.dtype[Any], str | None] = {}
        #: types written as themselves without a look: ints of any size (the strict document, if
        #: one is needed, is derived from the nodes: see the module's docstring)
        self.fast = _LOOSE
        #: the tuples of the ``u`` nodes, in the order the nodes were made -- the order of the
        #: node tree, depth first -- for the strict document
        self.tuples: list[tuple[Any, ...]] = []
        #: (``O`` node, a copy of the flattened object array): Arrow buffers made by finish
        self.strings: list[tuple[list[Any], np.ndarray]] = []
        #: the cache: its entries of the last capture (``old``), those of this one (``new``)
        self.cache = cache
        self.old: dict[int, _Entry] = {} if cache is None else cache.entries
        self.new: dict[int, _Entry] = {}
        #: the number of the first node of the immutable object being recorded (-1: none), and
        #: the (number, object) of the ``R`` nodes to objects met before it
        self.floor = -1
        self.outs: list[tuple[int, Any]] = []
        self.types: list[type] = []  # by class index
        #: id of a sig -> None when its shape numbers are those of now, else the changes
        self.checked: dict[int, dict[int, int] | None] = {}
        self.hits = self.misses = self.moved = 0
        self.recorded: list[_Entry] = []  # the entries made by this capture

    def buf(self, b: Any) -> int:
        self.buffers.append(b)
        return len(self.buffers) - 1

    def items(self, tag: str, xs: Any, where: Callable[[int], str]) -> list[Any]:
        fast = self.fast
        if _atomic(xs, fast):
            return [tag, *xs]
        out: list[Any] = [tag]
        enc = self.enc
        tuples = self.tuples
        memo = self.memo
        try:
            for x in xs:
                tx = type(x)
                if tx in fast or (tx is float and x - x == 0.0):
                    out.append(x)
                elif tx is tuple and set(map(type, x)) <= fast:
                    out.append(["u", *x])
                    tuples.append(x)
                else:
                    m = memo.get(id(x))
                    if m is None or tx is tuple or tx is frozenset:  # (a cycle: enc refuses it)
                        out.append(enc(x))
                    else:  # met before: enc's R node, inlined
                        if m < self.floor:
                            self.outs.append((m, x))
                        out.append(["R", m])
        except _Fail as f:
            f.parts.append(where(len(out) - 1))
            raise
        return out

    def enc(self, x: Any) -> Any:  # noqa: C901 - one dispatch over the node kinds
        t = type(x)
        if t in _PLAIN:
            return x
        if t is int:
            return x
        if t is float:
            return x if math.isfinite(x) else ["f", repr(x)]
        if t is tuple and _atomic(x, self.fast):  # immutable, no identity to keep: not numbered
            self.tuples.append(x)
            return ["u", *x]
        i = id(x)
        memo = self.memo
        m = memo.get(i)
        if m is not None:
            if i in self.open:
                raise _Fail(t.__name__, "a cycle through an immutable container")
            if m < self.floor:
                self.outs.append((m, x))
            return ["R", m]
        kind = self.kinds.get(t)
        if kind is not None:
            if kind[0] == "C":
                memo[i] = self.count
                self.count += 1
                return self.instance(x, kind)
            if kind[0] == "Z":
                return self.frozen(x, kind)
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
            kind = self.kind(t)
            if kind[0] == "Z":  # numbered by frozen() instead
                del memo[i]
                self.count -= 1
                return self.frozen(x, kind)
        if kind[0] == "N":  # its bytes later if it can give them so (copies of its arrays)
            later = getattr(x, "capture_bytes", None) if self.copy else None  # else now: no copies
            return ["N", kind[1], self.buf(x.to_bytes() if later is None else _Later(later()))]
        return self.instance(x, kind)

    def kind(self, t: type) -> _Kind:
        """Register class ``t`` (allowed): its kind ("N" native, "Z" frozen, "C" the others)."""
        path = _path_of(t)
        tag = "N" if _native(t) else "Z" if path in _IMMUTABLE and self.cache is not None else "C"
        kind = [tag, len(self.classes), tuple(_slots(t)), {}, True]
        self.classes.append(path)
        self.types.append(t)
        self.kinds[t] = kind
        return kind

    def frozen(self, x: Any, kind: _Kind) -> list[Any] | _Moved:
        """The node of frozen object ``x``, not met yet in this walk: the cached one when it is
        exactly what the walk would give here (:meth:`replay`), else walked (:meth:`record`)."""
        e = self.old.get(id(x))
        if e is not None and e.root is x:
            node = self.replay(e)
            if node is not None:
                return node
        return self.record(x, kind)

    def replay(self, e: _Entry) -> list[Any] | _Moved | None:
        """``e``'s node, numbered from here (its ``R`` nodes and shape numbers renumbered when
        they changed), or None when the walk would write it otherwise: an object of its subtree
        met already (an ``R`` node instead), an object it points to not met before it."""
        memo = self.memo
        if not memo.keys().isdisjoint(e.ids):
            return None
        if e.source is not None:  # recorded by the last capture, not finished yet
            e.prepare()
        remap = self.checked.get(id(e.sig), _UNSEEN)
        if remap is _UNSEEN:
            remap = self.checked[id(e.sig)] = self.register(e.sig)
        nums = e.nums
        if nums:  # the objects met before it must be met before it now, and numbered so
            get, open_ = memo.get, self.open
            now = tuple(get(id(o), -1) for o in e.outside)
            if -1 in now or (open_ and any(id(o) in open_ for o in e.outside)):
                return None
            nums = now
        c0 = self.count
        memo.update(zip(e.ids, range(c0, c0 + e.n), strict=True))
        self.count = c0 + e.n
        if e.tuples:
            self.tuples += e.tuples
        self.new[id(e.root)] = e
        self.hits += 1
        if (c0 != e.count0 or nums != e.nums) and e.spots is not None or remap is not None:
            self.moved += 1  # renumbered by finish (a copy of the paths to the numbers)
            return _Moved(e, c0 - e.count0, nums, remap)
        return e.node

    def register(self, sig: tuple[tuple[type, tuple[str, ...], int], ...]) -> dict[int, int] | None:
        """Register the classes and shapes of ``sig`` not registered yet, in its order (that of a
        walk of the subtree); None when each has the number ``sig`` gives it, else the numbers
        that changed (``sig``'s -> now's)."""
        remap: dict[int, int] = {}
        for t, names, sh in sig:
            kind = self.kinds.get(t)
            if kind is None:
                kind = self.kind(t)
            got = kind[3].get(names)
            if got is None:
                got = kind[3][names] = len(self.shapes)
                self.shapes.append([kind[1], list(names)])
            if got != sh:
                remap[sh] = got
        return remap or None

    def record(self, x: Any, kind: _Kind) -> list[Any]:
        """Walk frozen object ``x`` as any instance, and cache its node when it can be reused: no
        ``R`` node out of its subtree, no buffer."""
        memo = self.memo
        c0 = self.count
        memo[id(x)] = c0
        self.count += 1
        if self.cache is None:
            return self.instance(x, kind)
        nb, nt, floor, outs = len(self.buffers), len(self.tuples), self.floor, self.outs
        self.floor, self.outs = c0, []
        try:
            node = self.instance(x, kind)
        finally:
            mine, self.floor, self.outs = self.outs, floor, outs
            outs += [o for o in mine if o[0] < floor]  # those out of the enclosing one too
        self.misses += 1
        if len(self.buffers) == nb:
            n = self.count - c0
            ids = tuple(itertools.islice(reversed(memo.keys()), n))[::-1]
            out = {m: o for m, o in mine}  # the objects met before it, by number
            source = (self.shapes, self.types, self.cache.sigs)
            e = _Entry(x, node, c0, ids, tuple(self.tuples[nt:]), tuple(out.values()), tuple(out), source)
            self.new[id(x)] = e
            self.recorded.append(e)
        return node

    def mapping(self, d: dict[Any, Any]) -> list[Any]:
        fast = self.fast
        if _atomic(d.keys(), fast) and _atomic(d.values(), fast):
            return ["D", *itertools.chain.from_iterable(d.items())]
        out: list[Any] = ["D"]
        enc = self.enc
        tuples = self.tuples
        memo = self.memo
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
                    tuples.append(v)
                else:
                    m = memo.get(id(v))
                    if m is None or tv is tuple or tv is frozenset:  # (a cycle: enc refuses it)
                        out.append(enc(v))
                    else:  # met before: enc's R node, inlined
                        if m < self.floor:
                            self.outs.append((m, v))
                        out.append(["R", m])
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
        tuples = self.tuples
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
                    tuples.append(v)
                    continue
                i = id(v)  # enc's paths, inlined
                m = memo.get(i)
                if m is not None:
                    if tv is tuple or tv is frozenset:  # (a cycle: enc refuses it)
                        out.append(enc(v))
                    else:
                        if m < self.floor:
                            self.outs.append((m, v))
                        out.append(["R", m])
                    continue
                k = kinds.get(tv)
                if k is not None:
                    if k[0] == "C":
                        memo[i] = self.count
                        self.count += 1
                        out.append(self.instance(v, k))
                        continue
                    if k[0] == "Z":
                        out.append(self.frozen(v, k))
                        continue
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
        if a.nbytes <= _SMALL:  # bytes cost less than an array
            return ["A", dt, list(a.shape), self.buf(a.tobytes())]
        # a copy (memcpy): the state's array may change after capture -- unless nothing changes it
        c = np.array(a, order="C") if self.copy else np.ascontiguousarray(a)
        return ["A", dt, list(a.shape), self.buf(c.reshape(-1).view(np.uint8))]

    def objects(self, a: np.ndarray) -> list[Any]:
        if a.dtype != object:
            raise _Fail(f"numpy array of {a.dtype}", "an unsupported dtype (structured or object)")
        flat = a.flatten()  # a copy of the references (C order); str elements are immutable
        kinds = set(map(type, flat))
        if not kinds <= {str, _NONE}:
            odd = [type(v).__name__ for v in flat if v is not None and not isinstance(v, str)]
            if odd:
                raise _Fail("numpy object array", f"it holds a {odd[0]} (only str and None are written)")
        # Arrow's buffers (made by finish): validity exactly when there is a None, offsets, data;
        # the null count and the type ("string", "large_string") are filled in by finish
        i = len(self.buffers)
        nulls = _NONE in kinds
        self.buffers += [None] * (2 + nulls)
        node = ["O", list(a.shape), len(flat), 0, "string", i if nulls else None, i + nulls, i + nulls + 1]
        self.strings.append((node, flat))
        return node


def _at(i: int) -> str:
    return f"[{i}]"


def _member(i: int) -> str:
    return f"<{i}>"


def _element(i: int) -> str:
    return f"<element {i}>"


def _document(root: Any, classes: list[str], shapes: list[list[Any]], table: list[list[int]]) -> bytes:
    """The JSON text of the document (compact, no NaN): by ``pydantic_core.to_json`` (Rust, about
    three times ``json.dumps``), or ``json.dumps`` for what it refuses (a lone surrogate)."""
    doc = {"root": root, "classes": classes, "shapes": shapes, "buffers": table}
    try:
        return pydantic_core.to_json(doc, fallback=_made)
    except pydantic_core.PydanticSerializationError:
        return json.dumps(doc, allow_nan=False, separators=(",", ":"), default=_made).encode()


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


def _strictly(root: Any, tuples: list[tuple[Any, ...]]) -> Any:
    """The root node the strict walk of the captured state gives (see the module's docstring):
    ints beyond 64 bits as ``I`` nodes, tuples holding an int as numbered ``T`` nodes (``R`` nodes
    when met again), every node renumbered.  ``tuples``: the tuples of the ``u`` nodes, in the
    order of the tree (depth first), which is the order this walks it in."""
    source = iter(tuples)
    renumber: list[int] = []  # the loose number of a node -> its strict number
    numbered: dict[int, int] = {}  # id of a tuple made a T node -> its number
    count = 0

    def node(n: Any) -> Any:
        nonlocal count
        t = type(n)
        if t is _Moved:
            n = n.node()
            t = list
        if t is int:
            return n if -_I64 <= n < _I64 else ["I", hex(n)]
        if t is not list:
            return n
        tag = n[0]
        if tag == "u":
            x = next(source)
            if int not in set(map(type, x)):
                return n
            m = numbered.get(id(x))
            if m is not None:
                return ["R", m]
            numbered[id(x)] = count
            count += 1
            return ["T", *map(node, itertools.islice(n, 1, None))]
        if tag == "R":
            return ["R", renumber[n[1]]]
        if tag == "f" or tag == "s":  # not numbered, no int
            return n
        renumber.append(count)  # every other node is numbered, before its children
        count += 1
        if tag in _LEAVES:
            return n
        return [tag, *map(node, itertools.islice(n, 1, None))]  # "C": its shape number stays

    return node(root)


def _coalesced(pieces: list[Any], small: int = 1 << 16, run: int = 1 << 20) -> list[Any]:
    """``pieces`` with each run of consecutive pieces under ``small`` bytes joined into pieces of
    about ``run`` bytes: a state of thousands of rules has ~10**4 small buffers, and each write or
    CRC of a piece of its own would drop and take the GIL again (and be a system call)."""
    out: list[Any] = []
    group: list[Any] = []
    n = 0
    for p in pieces:
        size = memoryview(p).nbytes
        if size >= small:
            if group:
                out.append(b"".join(group))
                group, n = [], 0
            out.append(p)
            continue
        group.append(p)
        n += size
        if n >= run:
            out.append(b"".join(group))
            group, n = [], 0
    if group:
        out.append(b"".join(group))
    return out


class Captured:
    """A state as :func:`capture` saw it, to be finished into snapshot bytes by :meth:`finish` --
    in any thread, however the state has changed since.  Holds the nodes, the copies of the
    arrays' buffers and of the object arrays, and the algorithm structures' ``capture_bytes``
    callables (holding copies of their arrays): about the state's size while it waits.  Nothing of it is exposed for change; :meth:`finish` may be
    called more than once (one thread at a time), each giving the same bytes."""

    __slots__ = ("_buffers", "_classes", "_recorded", "_root", "_shapes", "_strings", "_tuples")

    def __init__(self, e: _Encoder, root: Any) -> None:
        self._recorded = e.recorded
        self._root = root
        self._classes = e.classes
        self._shapes = e.shapes
        self._buffers = e.buffers
        self._strings = e.strings
        self._tuples = e.tuples

    def finish(self) -> list[Any]:
        """The snapshot's bytes as pieces to write one after another (``bytes`` and uint8 arrays,
        the 32-byte header first, runs of small buffers joined): ``b"".join(...)`` of them is the
        file.  The CRC-32 is taken over the pieces (``zlib.crc32`` releases the GIL for large
        buffers); no large buffer is joined or copied.  :class:`CaptureMismatch` as in the
        module's docstring."""
        buffers = list(self._buffers)
        for node, flat in self._strings:
            s = pa.array(flat, type=pa.string(), from_pandas=False)
            if isinstance(s, pa.ChunkedArray):  # over 2 GiB of text: 64-bit offsets
                s = pa.array(flat, type=pa.large_string(), from_pandas=False)
            validity, offsets, data = s.buffers()
            if (validity is None) != (node[5] is None) or offsets is None or data is None:
                raise CaptureMismatch("Arrow gave an object array other buffers than foreseen")
            node[3] = s.null_count
            node[4] = str(s.type)
            for i, b in zip(node[5:8], (validity, offsets, data), strict=True):
                if i is not None:
                    buffers[i] = np.frombuffer(b, np.uint8)
        table: list[list[int]] = []
        data_pieces: list[Any] = []
        size = 0
        for b in buffers:
            if type(b) is _Later:
                b = b.make()
            n = memoryview(b).nbytes
            pad = -size % _ALIGN
            if pad:
                data_pieces.append(_ZEROS[:pad])
                size += pad
            table.append([size, n])
            data_pieces.append(b)
            size += n
        for e in self._recorded:  # the cache's new entries surveyed here, not in the capture
            e.prepare()
        self._recorded = []
        doc = _document(self._root, self._classes, self._shapes, table)
        if _long_digits(doc):  # an int of thousands of digits, maybe: big ints as "I" nodes
            doc = _document(_strictly(self._root, self._tuples), self._classes, self._shapes, table)
        doc_len = len(doc) + (-len(doc) % _ALIGN)
        pieces = _coalesced([doc, _ZEROS[: -len(doc) % _ALIGN], *data_pieces])
        crc = 0
        for p in pieces:
            crc = zlib.crc32(p, crc)
        return [_HEADER.pack(MAGIC, FORMAT_VERSION, crc, doc_len, size), *pieces]


def capture(root: Any, cache: CaptureCache | None = None, *, private_image: bool = False) -> Captured:
    """The first phase of writing a snapshot of ``root`` (see the module's docstring), in the
    thread that owns the state, which must not change until it returns; its
    :meth:`~Captured.finish` gives the bytes.  :class:`StateNotEncodable` when ``root`` holds
    something the format does not.  ``private_image=True``: the calling process's image of the
    state never changes after the capture (the forked child that writes a snapshot,
    :mod:`engine.runtime.snapshot_writer`, passes it, and only it), so nothing is copied: the
    arrays' buffers are the state's own, the algorithm structures' bytes are made now (the same
    bytes, without the copies of their arrays that :meth:`capture_bytes` makes).  The child's
    copies were 2-3 times the state in fresh pages, each a page fault (≈ 12 µs on this machine,
    docs/measurements/engine.md, "The marker beside the records, and what a fork costs")."""
    collecting = gc.isenabled()
    gc.disable()  # the walk makes ~10**5 lists and holds them all: no collection can free any
    try:
        e = _Encoder(cache, copy=not private_image)
        node = e.enc(root)
    except _Fail as f:
        raise StateNotEncodable(f.type_name, "".join(reversed(f.parts)), f.reason) from None
    except RecursionError:
        raise StateNotEncodable("state", "", "nested too deeply") from None
    finally:
        if collecting:
            gc.enable()
    if cache is not None:  # the frozen objects of this state: the others are gone from it
        cache.entries = e.new
        cache.hits, cache.misses, cache.moved = e.hits, e.misses, e.moved
    return Captured(e, node)
