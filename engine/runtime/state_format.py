"""The state snapshot format's constants and its allowlist of classes, shared by the writer
(:mod:`engine.runtime.state_capture`) and the reader (:mod:`engine.runtime.state_codec`, whose
docstring describes the format).

Allowed classes (:func:`allowed`): classes defined in a module under ``engine.`` (plain classes:
metaclass ``type``, no ``__new__`` or ``__del__`` of their own, not exceptions), the rule
classes of :mod:`subscriptions.rule_ast` and :mod:`subscriptions.compiler` the evaluator holds,
and classes given to :func:`allow` (tests' stand-in evaluators).  :func:`_resolve` imports at
most a module under ``engine.`` to find a class.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import struct
import sys
from typing import Any

from engine.errors import EngineError, SnapshotUnreadable

__all__ = ["FORMAT_VERSION", "MAGIC", "StateNotEncodable", "allow", "allowed"]

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
