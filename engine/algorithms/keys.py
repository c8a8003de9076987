"""Interning of substream keys (ticker symbols, IP addresses, flows) to dense int64 ids.

Every structure of :mod:`engine.algorithms` indexes its per-key state by a dense id
``0..K-1`` (Arasu & Widom 2004, section 2: the substreams ``S_k``, ``k in K``); this module
is the one place that maps the caller's key values to those ids and back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np


class KeyInterner:
    """Bidirectional map ``key value (str) <-> dense int64 id`` assigned in first-seen order."""

    def __init__(self, keys: list[str] | None = None) -> None:
        self._ids: dict[str, int] = {}
        self._keys: list[str] = []
        for k in keys or []:
            self.id(k)

    def id(self, value: object) -> int:
        """Id of one key value, assigning the next id when it is new."""
        s = str(value)
        i = self._ids.get(s)
        if i is None:
            i = len(self._keys)
            self._ids[s] = i
            self._keys.append(s)
        return i

    def ids(self, values: np.ndarray | list[object]) -> np.ndarray:
        """Ids (int64) of an array of key values, assigning new ids in first-seen order.

        Vectorized over the distinct values of the batch: one dict access per distinct value.
        """
        arr = np.asarray(values, dtype=object)
        if arr.size == 0:
            return np.empty(0, dtype=np.int64)
        uniq, inverse = np.unique(arr.astype(str), return_inverse=True)
        # assign new ids in first-seen order of the batch
        first_pos = np.full(len(uniq), arr.size, dtype=np.int64)
        np.minimum.at(first_pos, inverse.ravel(), np.arange(arr.size, dtype=np.int64))
        mapped = np.empty(len(uniq), dtype=np.int64)
        for j in np.argsort(first_pos, kind="stable"):
            mapped[j] = self.id(uniq[j])
        return mapped[inverse.ravel()].reshape(arr.shape)

    def get(self, value: object) -> int | None:
        """Id of a key value, or None when it was never seen (no id is assigned)."""
        return self._ids.get(str(value))

    def key(self, i: int) -> str:
        """Key value of an id."""
        return self._keys[int(i)]

    def keys(self, ids: np.ndarray | list[int]) -> list[str]:
        """Key values of an array of ids."""
        return [self._keys[int(i)] for i in np.asarray(ids).ravel()]

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, value: object) -> bool:
        return str(value) in self._ids

    def to_bytes(self) -> bytes:
        """Serialize: key count (8 bytes) then the UTF-8 keys joined by NUL (keys never contain NUL)."""
        return _keys_bytes(self._keys)

    def capture_bytes(self) -> Callable[[], bytes]:
        """:meth:`to_bytes` of now, made by the callable returned whenever it is called (it holds
        a copy of the list of keys, which are immutable)."""
        return functools.partial(_keys_bytes, list(self._keys))

    @classmethod
    def from_bytes(cls, b: bytes) -> KeyInterner:
        """Inverse of :meth:`to_bytes`."""
        n = int.from_bytes(b[:8], "little")
        if n == 0:
            return cls()
        keys = b[8:].decode("utf-8").split("\x00")
        if len(keys) != n:
            raise ValueError("corrupt KeyInterner bytes")
        return cls(keys)

    @property
    def nbytes(self) -> int:
        """Approximate state size in bytes."""
        return sum(len(k) + 8 for k in self._keys)


def _keys_bytes(keys: list[str]) -> bytes:
    return len(keys).to_bytes(8, "little") + "\x00".join(keys).encode("utf-8")
