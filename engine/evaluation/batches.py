"""Micro-batches, row predicates and the kernels of the evaluator's group lookups.

* :class:`BatchView`: one micro-batch of one stream (a dict of NumPy columns) with per-batch
  caches -- factorized string columns, and one boolean mask per row predicate (WHERE AND
  FILTER, keyed by its text) shared by every structure under that predicate.
* :class:`EvalPaneSpec`: what the evaluator asks to be pre-aggregated per (key, pane)
  (Golab et al. 2003's basic windows, fed as rows with multiplicities: Arasu & Widom 2004,
  section 4.2), and :class:`Unit`, one retained input of a stream for the PSoup backfill of
  rules added later (Chandrasekaran & Franklin 2002).
* The Numba kernels of a group of threshold rules sharing one collective index (Arasu &
  Widom 2004, section 4: one index lookup serves them all): :func:`group_pass` and
  :func:`pair_diff` over sorted ``(rule uid << SHIFT) | key id`` pairs, and :func:`sorted_diff`.

No state is kept here beyond one batch; the shared window state is :mod:`engine.evaluation.state`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numba as nb
import numpy as np
import pandas as pd

from engine.evaluation.panes import PaneRows, PaneSpec
from subscriptions import rule_ast as A
from tidewatch.schema import STREAMS

EMPTY = np.zeros(0, np.int64)
SHIFT = np.int64(32)  # (rule uid << 32) | key id encodes a (rule, key) pair


class BatchView:
    """A micro-batch of one stream with per-batch caches (factorized strings, predicate masks)."""

    def __init__(
        self,
        stream: str,
        cols: dict[str, np.ndarray],
        pre: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        self.stream = stream
        self.cols = cols
        self.n = int(np.asarray(cols["ts"]).shape[0])
        self._fact: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._masks: dict[str, np.ndarray] = {}
        #: string columns already factorized over a larger input (the backtest's whole file):
        #: field -> (codes of these rows, the input's uniques)
        self.pre = pre or {}
        #: field -> (positions in the input's uniques of this batch's uniques, input's uniques)
        self.global_index: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def factorized(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(codes, uniques) of a column (hash-based, one pass; from ``pre`` when given there:
        the input's codes compacted to the values present in the batch, no hashing)."""
        f = self._fact.get(name)
        if f is None:
            if name in self.pre:
                codes_g, uniq_g = self.pre[name]
                seen = np.zeros(uniq_g.shape[0], bool)
                seen[codes_g] = True
                present = np.flatnonzero(seen)
                remap = np.zeros(uniq_g.shape[0], np.int64)
                remap[present] = np.arange(present.shape[0], dtype=np.int64)
                f = (remap[codes_g], uniq_g[present])
                self.global_index[name] = (present, uniq_g)
            else:
                codes, uniques = pd.factorize(np.asarray(self.cols[name]), sort=False)
                f = (codes.astype(np.int64), np.asarray(uniques, dtype=object))
            self._fact[name] = f
        return f

    def numeric(self, name: str) -> np.ndarray:
        return np.asarray(self.cols[name])

    def mask(self, pred: A.RowCond | None) -> np.ndarray | None:
        """Boolean mask of rows satisfying pred (None: all rows)."""
        if pred is None:
            return None
        key = A.row_text(pred)
        m = self._masks.get(key)
        if m is None:
            m = self._eval(pred)
            self._masks[key] = m
        return m

    def _eval(self, c: A.RowCond) -> np.ndarray:
        spec = STREAMS[self.stream].fields
        if isinstance(c, (A.RowCmp, A.RowIn, A.RowBetween)):
            f = spec[c.field]
            if f.numeric:
                return _row_test(c, self.numeric(c.field))
            codes, uniques = self.factorized(c.field)
            return _row_test(c, uniques)[codes] if self.n else np.zeros(0, bool)
        if isinstance(c, A.RowAnd):
            out = np.ones(self.n, bool)
            for x in c.items:
                out &= self.mask(x)  # type: ignore[arg-type]
            return out
        if isinstance(c, A.RowOr):
            out = np.zeros(self.n, bool)
            for x in c.items:
                out |= self.mask(x)  # type: ignore[arg-type]
            return out
        if isinstance(c, A.RowNot):
            return ~self.mask(c.item)  # type: ignore[operator]
        raise TypeError(c)


def _row_test(c: A.RowCond, v: np.ndarray) -> np.ndarray:
    if isinstance(c, A.RowCmp):
        return np.asarray(compare(v, c.op, c.value), dtype=bool)
    if isinstance(c, A.RowIn):
        if v.dtype == object:
            return np.asarray(pd.Index(v).isin(list(c.values)), dtype=bool)
        return np.isin(v, np.asarray(c.values, dtype=np.float64))
    if isinstance(c, A.RowBetween):
        return np.asarray(compare(v, ">=", c.lo), dtype=bool) & np.asarray(compare(v, "<=", c.hi), dtype=bool)
    raise TypeError(c)


def compare(a: Any, op: str, b: Any) -> Any:
    if op == ">":
        return a > b
    if op == ">=":
        return a >= b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == "=":
        return a == b
    return a != b


@dataclass(frozen=True)
class EvalPaneSpec(PaneSpec):
    """:class:`engine.evaluation.panes.PaneSpec` of one (stream, key field) plus what the evaluator needs
    besides the pane rows: ``needs_raw`` (raw events must be given too, see
    :meth:`engine.evaluation.evaluator.Evaluator.apply_panes`) and the pane width ``pane_ms`` the
    rows must use."""

    needs_raw: bool = False
    pane_ms: int = 0


@dataclass
class Unit:
    """One retained input of a stream for PSoup backfill: raw columns and/or the pane rows of
    each key field, all standing for the same events."""

    raw: dict[str, np.ndarray] | None
    rows: dict[str, PaneRows] = field(default_factory=dict)
    source: Any = None  # the caller's raw dict, to join the calls of one batch (by identity)
    #: ``(lo, hi)``: the unit stands for the stream's applied events with ``lo < ts <= hi`` (the
    #: engine's executors mode, which retains pane rows only: the events are re-read from
    #: Kafka when needed, :mod:`engine.executors.history`); None: not known
    span: tuple[int, int] | None = None

    def max_ts(self) -> int:
        if self.raw is not None and self.raw["ts"].shape[0]:
            return int(self.raw["ts"][-1])
        if self.span is not None and not self.rows:
            return int(self.span[1])
        panes = [int(np.asarray(r.pane).max()) for r in self.rows.values() if len(r)]
        return max(panes) if panes else int(np.iinfo(np.int64).min)


@nb.njit(cache=True, nogil=True)
def group_pass(cand, vals, los, his, lo_strict, hi_strict, uids, prev):  # type: ignore[no-untyped-def]
    """One exact pass of a group of single-threshold rules (section 4: one index lookup serves
    them all): the sorted (rule uid << 32 | key id) pairs whose exact value lies in each rule's
    range, and the pairs that entered / exited since ``prev`` (sorted). ``uids`` ascending;
    candidates in key order (sorted here otherwise): the pairs come out sorted, no sort."""
    n = cand.shape[0]
    for i in range(1, n):
        if cand[i] < cand[i - 1]:
            order = np.argsort(cand, kind="mergesort")
            cand = cand[order]
            vals = vals[order]
            break
    R = los.shape[0]
    pairs = np.empty(R * n, np.int64)
    j = 0
    for r in range(R):
        hi_bits = uids[r] << 32
        lo, hi, ls, hs = los[r], his[r], lo_strict[r], hi_strict[r]
        for i in range(n):
            x = vals[i]
            if (x > lo if ls else x >= lo) and (x < hi if hs else x <= hi):
                pairs[j] = hi_bits | cand[i]
                j += 1
    return pair_diff(pairs[:j], prev)


@nb.njit(cache=True, nogil=True)
def pair_diff(pairs, prev):  # type: ignore[no-untyped-def]
    """``pairs`` and the pairs that entered / exited since ``prev`` (both sorted, unique)."""
    j = pairs.shape[0]
    m = prev.shape[0]
    enter = np.empty(j, np.int64)
    exit_ = np.empty(m, np.int64)
    i = k = ne = nx = 0
    while i < j or k < m:
        if k >= m or (i < j and pairs[i] < prev[k]):
            enter[ne] = pairs[i]
            ne += 1
            i += 1
        elif i >= j or prev[k] < pairs[i]:
            exit_[nx] = prev[k]
            nx += 1
            k += 1
        else:
            i += 1
            k += 1
    return pairs, enter[:ne], exit_[:nx]


def sorted_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elements of sorted unique ``a`` not in sorted unique ``b`` (binary search, no re-sort)."""
    if a.shape[0] == 0 or b.shape[0] == 0:
        return a
    i = np.searchsorted(b, a)
    found = b[np.minimum(i, b.shape[0] - 1)] == a
    return a[~found]
