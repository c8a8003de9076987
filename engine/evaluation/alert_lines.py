"""The backtest's alert file written in bulk: alerts as columns, JSON lines built by Arrow.

A lookup's :class:`engine.evaluation.rules.Changes` are blocks of (rule names, key values) per
kind.  :class:`AlertWriter` gathers them, one chunk of many lookups at a time, and writes the
lines of RULES.md's backtest contract -- ordered by lookup, then rule, then key (string order,
i.e. Unicode code points), one line per alert::

    {"as_of": 1767225600000, "rule": "busy", "key": "AAPL", "kind": "ENTER"}

byte for byte what ``json.dumps({"as_of": ..., "rule": ..., "key": ..., "kind": ...})`` gives
(:func:`alert_line`, the per-alert reference).  No Python runs per alert: names and keys are
dictionary-encoded, each distinct string ranked (Arrow's byte-wise UTF-8 order is code-point
order) and quoted once (:func:`json_quote`), the order is one integer sort, and the lines are
joined by ``pyarrow.compute`` and written as one buffer per chunk.
"""

from __future__ import annotations

import ctypes
import io
import json
from typing import IO, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from engine.evaluation.rules import Changes

#: strings json.dumps writes between quotes unchanged: printable ASCII except ``"`` and ``\``
_PLAIN = r"^[\x20\x21\x23-\x5b\x5d-\x7e]*$"


def alert_line(as_of: int, rule: str, key: str, kind: str) -> str:
    """One alert's line (no newline), the reference the bulk writer reproduces."""
    return json.dumps({"as_of": int(as_of), "rule": rule, "key": key, "kind": kind})


def json_quote(values: pa.Array) -> pa.Array:
    """``json.dumps`` of each string (default ``ensure_ascii``): plain printable ASCII is
    wrapped in quotes by Arrow; the others (escapes, non-ASCII) go through ``json.dumps``."""
    quoted = pc.binary_join_element_wise('"', values, '"', "")
    plain = pc.match_substring_regex(values, _PLAIN)
    if pc.all(plain).as_py() is not False:
        return quoted
    mask = pc.invert(plain)
    odd = values.filter(mask).to_pylist()
    return pc.replace_with_mask(quoted, mask, pa.array([json.dumps(s) for s in odd], pa.string()))


def _ranks(values: pa.Array) -> np.ndarray:
    """Dense rank of each string in code-point order (equal strings, equal ranks)."""
    order = np.asarray(pc.sort_indices(values).to_numpy(), dtype=np.int64)
    n = order.shape[0]
    ordered = values.take(pa.array(order))
    step = np.ones(n, np.int64)
    if n > 1:
        step[1:] = np.asarray(
            pc.not_equal(ordered[1:], ordered[:-1]).to_numpy(zero_copy_only=False), np.int64
        )
    step[:1] = 0
    rank = np.empty(n, np.int64)
    rank[order] = np.cumsum(step)
    return rank


def _radix_order(key: np.ndarray, bits: int) -> np.ndarray:
    """The stable sorting order of ``key`` (non-negative int64 below ``2**bits``): least
    significant digit first, 16 bits at a time, each pass NumPy's stable sort of a uint16 array
    (a radix sort, linear), so a key of up to 32 bits costs two linear passes."""
    order: np.ndarray | None = None
    for shift in range(0, bits, 16):
        digit = ((key if order is None else key[order]) >> shift).astype(np.uint16)
        step = np.argsort(digit, kind="stable")
        order = step if order is None else order[step]
    assert order is not None
    return order


def _bits(n: int) -> int:
    return max(1, int(n - 1).bit_length())


def _factorize(values: np.ndarray) -> tuple[np.ndarray, pa.Array]:
    """(codes, one Arrow string per code) of an object array of str, grouped by object
    identity: the evaluator hands out the same str object for the same key (its key array) and
    rule name, so grouping reads no string.  Equal strings held by distinct objects get distinct
    codes (same text, so the same line); nothing here relies on codes being distinct texts."""
    values = np.ascontiguousarray(values, dtype=object)
    n = values.shape[0]
    addr = values.__array_interface__["data"][0]
    ptrs = np.frombuffer((ctypes.c_ssize_t * n).from_address(addr), dtype=np.int64)  # object ids
    codes, uniq = pd.factorize(ptrs, sort=False)
    codes = np.asarray(codes, dtype=np.int64)
    rep = np.empty(len(uniq), np.int64)
    rep[codes] = np.arange(n, dtype=np.int64)  # an occurrence of each object
    try:
        return codes, pa.array(values[rep], pa.string())
    except (pa.ArrowException, UnicodeError) as exc:
        raise ValueError(str(exc)) from None


def format_alerts(
    lookup: np.ndarray, as_of: np.ndarray, names: np.ndarray, keys: np.ndarray, kinds: np.ndarray
) -> str:
    """The lines (each ending in a newline) of alerts given as columns: ``lookup`` a
    non-decreasing lookup number per alert, ``as_of`` its time (one per lookup), ``names`` /
    ``keys`` object arrays of str, ``kinds`` "ENTER" / "EXIT" as 0 / 1.  Within a lookup the
    lines are ordered by rule, then key, then kind (as ``sorted`` orders the tuples); lookups
    keep their order.  Raises ValueError for a string Arrow cannot encode (a lone surrogate)."""
    return str(format_alert_bytes(lookup, as_of, names, keys, kinds), "ascii")


def format_alert_bytes(
    lookup: np.ndarray, as_of: np.ndarray, names: np.ndarray, keys: np.ndarray, kinds: np.ndarray
) -> memoryview:
    """:func:`format_alerts` as the ASCII bytes of the lines (every string is JSON-quoted with
    non-ASCII escaped), a view of the Arrow buffer they were built in: no copy, no decoding."""
    n = int(keys.shape[0])
    if n == 0:
        return memoryview(b"")
    n_idx, n_uni = _factorize(names)
    k_idx, k_uni = _factorize(keys)
    kinds = kinds.astype(np.int64)
    seq = lookup - lookup[0]
    b_key, b_name, b_seq = _bits(len(k_uni)), _bits(len(n_uni)), _bits(int(seq[-1]) + 1)
    n_rank = _ranks(n_uni)[n_idx]
    k_rank = _ranks(k_uni)[k_idx]
    bits = 1 + b_key + b_name + b_seq
    if bits <= 63:
        order = _radix_order((((seq << b_name) | n_rank) << b_key | k_rank) << 1 | kinds, bits)
    else:
        order = np.lexsort((kinds, k_rank, n_rank, seq))
    # two pieces per line, each built once per distinct value: '{"as_of": T, "rule": "r", "key": '
    # per run of one (lookup, rule), '"k", "kind": "ENTER"}\n' per (key, kind); the lines are the
    # data buffer of one take of 2n pieces (head, tail, head, tail, ...) from [heads..., tails...]
    s_seq, s_name = seq[order], n_idx[order]
    starts = np.flatnonzero(np.r_[True, (s_seq[1:] != s_seq[:-1]) | (s_name[1:] != s_name[:-1])])
    t_text = pc.cast(pa.array(as_of[order][starts], pa.int64()), pa.string())
    heads = pc.binary_join_element_wise(
        '{"as_of": ', t_text, ', "rule": ', json_quote(n_uni).take(pa.array(s_name[starts])), ', "key": ', ""
    )
    quoted = json_quote(k_uni).take(pa.array(np.repeat(np.arange(len(k_uni), dtype=np.int64), 2)))
    kind_tail = pa.array(['ENTER"}\n', 'EXIT"}\n'] * len(k_uni), pa.string())
    tails = pc.binary_join_element_wise(quoted, ', "kind": "', kind_tail, "")
    pick = np.empty(2 * n, np.int64)
    pick[0::2] = np.repeat(np.arange(starts.shape[0], dtype=np.int64), np.diff(np.r_[starts, n]))
    pick[1::2] = k_idx[order] * 2 + kinds[order] + starts.shape[0]
    lines = pa.concat_arrays([heads, tails]).take(pa.array(pick))
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=2 * n + 1, offset=lines.offset * 4)
    data = lines.buffers()[2]
    assert data is not None
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])]


class AlertWriter:
    """Alert lines of successive lookups' changes to ``out``, in chunks of about ``chunk`` alerts.
    ``out`` a text stream, or a binary one (``open(path, "wb")``, ``sys.stdout.buffer``): the
    lines are ASCII, written then as the bytes they were built in."""

    def __init__(self, out: IO[str] | IO[bytes], chunk: int = 1 << 18) -> None:
        self.out = out
        self.chunk = chunk
        self.count = 0
        self._parts: list[tuple[int, int, np.ndarray, np.ndarray, int]] = []
        self._held = 0
        self._lookups = 0

    def add(self, changes: Changes) -> None:
        """Queue one lookup's changes (written in lookup order)."""
        for names, keys, kind in changes.parts:
            if kind not in ("ENTER", "EXIT"):
                raise ValueError(f"unknown alert kind {kind!r}")
            self._parts.append((self._lookups, changes.as_of, names, keys, 0 if kind == "ENTER" else 1))
            self._held += int(keys.shape[0])
        self._lookups += 1
        if self._held >= self.chunk:
            self.flush()

    def _write(self, raw: memoryview | str) -> None:
        """ASCII lines to ``out``: as they are to a binary stream (no decoding, no encoding, no
        newline translation), as text to a text stream."""
        out: Any = self.out  # IO[str] or IO[bytes], told apart here
        if isinstance(out, io.RawIOBase | io.BufferedIOBase):
            out.write(raw.encode("ascii") if isinstance(raw, str) else raw)
        else:
            out.write(raw if isinstance(raw, str) else str(raw, "ascii"))

    def flush(self) -> None:
        """Write what is queued."""
        if not self._parts:
            return
        parts, self._parts = self._parts, []
        lens = np.array([p[3].shape[0] for p in parts], np.int64)
        lookup = np.repeat(np.array([p[0] for p in parts], np.int64), lens)
        as_of = np.repeat(np.array([p[1] for p in parts], np.int64), lens)
        kinds = np.repeat(np.array([p[4] for p in parts], np.int8), lens)
        names = np.concatenate([np.asarray(p[2], dtype=object) for p in parts])
        keys = np.concatenate([np.asarray(p[3], dtype=object) for p in parts])
        try:
            raw = format_alert_bytes(lookup, as_of, names, keys, kinds)
        except ValueError:  # a string Arrow cannot encode: the per-alert reference
            rows = sorted(
                zip(
                    lookup.tolist(),
                    names.tolist(),
                    keys.tolist(),
                    kinds.tolist(),
                    as_of.tolist(),
                    strict=True,
                )
            )
            text = "".join(
                alert_line(t, n, k, "ENTER" if c == 0 else "EXIT") + "\n" for _, n, k, c, t in rows
            )
            self._write(text)
        else:
            self._write(raw)
        self.count += int(keys.shape[0])
        self._held = 0
