"""The evaluator's retained input: what a rule added later is filled from (PSoup).

PSoup (Chandrasekaran & Franklin 2002, section 3.2) answers a new query at once over the data
already held; a main-memory PSoup keeps only "data within a certain maximum window specified
as a system parameter" (section 4.2, footnote 2).  The retained input of each stream is

* the *units* -- the batches (raw columns and / or pane rows, :class:`Unit`) in arrival order,
  dropped whole once they are older than the time retention the evaluator gives
  (``cutoff``: the longest time window in use, at least ``Evaluator.history_ms``);
* the *tail* -- raw rows of dropped units that a ROWS window in use can still read: for every
  (key field, predicate) read by ``LAST n ROWS`` windows, each key's newest n rows satisfying
  the predicate (:class:`RowsKeep`; Arasu & Widom 2004, section 2: the tuple-based window
  ``S_k[N, 0]`` of substream k is its last N tuples, so nothing older is read again).  Rows
  arrive in batches; the tail is compacted (concatenated, trimmed, sorted by ts) when it has
  grown past twice what the last compaction kept plus :data:`COMPACT_SLACK` rows, so each row
  is copied O(1) times amortized and the tail holds at most about twice the rows the ROWS
  windows can read, plus that slack.

So the history is bounded by the windows in use: rows per key for ROWS windows, time for
time windows.  What a rule added later sees is documented in :mod:`engine.evaluation.evaluator`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from engine.evaluation.batches import BatchView, Unit
from engine.evaluation.panes import PaneRows
from subscriptions import rule_ast as A

#: the tail is compacted once it holds more than twice the rows kept last time plus this
COMPACT_SLACK = 4096


@dataclass(frozen=True)
class RowsKeep:
    """Rows a ROWS window in use reads: each ``key`` value's newest ``n`` rows satisfying
    ``predicate`` (WHERE AND FILTER; None: every row)."""

    key: str
    predicate: A.RowCond | None
    n: int


def newest_per_key(codes: np.ndarray, sel: np.ndarray | None, n: int) -> np.ndarray:
    """Mask of the rows (in arrival order) that are among the newest ``n`` selected rows
    (``sel``; None: all) of their key (``codes``: the factorized key of each row)."""
    out = np.zeros(codes.shape[0], bool)
    idx = np.arange(codes.shape[0]) if sel is None else np.flatnonzero(sel)
    if idx.shape[0] == 0 or n <= 0:
        return out
    rev = codes[idx][::-1]  # newest first
    order = np.argsort(rev, kind="stable")
    grouped = rev[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    sizes = np.diff(np.r_[starts, grouped.shape[0]])
    rank = np.empty(grouped.shape[0], np.int64)
    rank[order] = np.arange(grouped.shape[0]) - np.repeat(starts, sizes)  # 0: the key's newest
    out[idx[::-1][rank < n]] = True
    return out


def _cols_nbytes(cols: dict[str, np.ndarray] | None) -> int:
    return 0 if cols is None else sum(int(np.asarray(v).nbytes) for v in cols.values())


def _rows_nbytes(rows: PaneRows) -> int:
    n = int(rows.keys.nbytes + rows.pane.nbytes + rows.total.nbytes)
    for agg in rows.sets.values():
        n += int(agg.count.nbytes)
        for d in (agg.sums, agg.mins, agg.maxs, agg.first, agg.last):
            n += sum(int(v.nbytes) for v in d.values())
        n += sum(int(h.nbytes + lo.nbytes) for h, lo in agg.exact.values())
        n += sum(int(a.nbytes + b.nbytes + c.nbytes) for a, b, c in agg.distinct.values())
    return n


def _unit_nbytes(u: Unit) -> int:
    return _cols_nbytes(u.raw) + sum(_rows_nbytes(r) for r in u.rows.values())


class History:
    """Per stream: the retained units and the ROWS tail (see module docstring).  Sizes are kept
    as running totals (a unit's bytes are counted once it is no longer the newest, which the
    calls of one batch may still join): :attr:`nbytes` costs O(streams) per call."""

    def __init__(self) -> None:
        self.units: dict[str, list[Unit]] = {}
        #: per stream, raw column pieces in arrival order (the first one compacted, ts-sorted)
        self.tail: dict[str, list[dict[str, np.ndarray]]] = {}
        self._kept: dict[str, int] = {}  # rows the tail held after its last compaction
        self._tail_n: dict[str, int] = {}  # rows in the tail
        self._tail_b: dict[str, int] = {}  # bytes of the tail
        #: bytes of each unit but the newest (aligned with ``units``) and their sum
        self._ub: dict[str, list[int]] = {}
        self._ub_sum: dict[str, int] = {}

    def newest(self, stream: str) -> Unit | None:
        hist = self.units.get(stream)
        return hist[-1] if hist else None

    def retain(self, stream: str, unit: Unit, cutoff: int, keep: list[RowsKeep]) -> None:
        """Add a unit; drop the units whose events are all at or before ``cutoff`` (the newest
        unit stays: the calls of one batch join it), their raw rows going to the tail while
        ``keep`` (the ROWS windows in use on the stream) may read them."""
        hist = self.units.setdefault(stream, [])
        ub = self._ub.setdefault(stream, [])
        if hist:
            hist[-1].source = None  # only the newest unit can be joined: its size is final
            ub[-1] = _unit_nbytes(hist[-1])
            self._ub_sum[stream] = self._ub_sum.get(stream, 0) + ub[-1]
        hist.append(unit)
        ub.append(0)
        drop = 0
        while drop < len(hist) - 1 and hist[drop].max_ts() <= cutoff:
            drop += 1
        if drop:
            gone, hist[:drop] = hist[:drop], []
            self._ub_sum[stream] -= sum(ub[:drop])
            del ub[:drop]
            if keep:
                self._add_tail(stream, [u.raw for u in gone if u.raw is not None])
        if not keep:
            self.tail.pop(stream, None)
            for d in (self._kept, self._tail_n, self._tail_b):
                d.pop(stream, None)
            return
        if self._tail_n.get(stream, 0) > 2 * self._kept.get(stream, 0) + COMPACT_SLACK:
            self.compact(stream, keep)

    def _add_tail(self, stream: str, pieces: list[dict[str, np.ndarray]]) -> None:
        self.tail.setdefault(stream, []).extend(pieces)
        self._tail_n[stream] = self._tail_n.get(stream, 0) + sum(int(p["ts"].shape[0]) for p in pieces)
        self._tail_b[stream] = self._tail_b.get(stream, 0) + sum(_cols_nbytes(p) for p in pieces)

    def compact(self, stream: str, keep: list[RowsKeep]) -> None:
        """Trim the tail of ``stream`` to the rows ``keep`` can read, as one ts-sorted piece."""
        pieces = [p for p in self.tail.get(stream, []) if p["ts"].shape[0]]
        self.tail[stream] = []
        self._kept[stream] = self._tail_n[stream] = self._tail_b[stream] = 0
        if not pieces:
            return
        names = set(pieces[0]).intersection(*pieces[1:])
        cols = {k: np.concatenate([np.asarray(p[k]) for p in pieces]) for k in pieces[0] if k in names}
        view = BatchView(stream, cols)
        mask = np.zeros(view.n, bool)
        for k in keep:
            codes = view.factorized(k.key)[0]
            mask |= newest_per_key(codes, view.mask(k.predicate), k.n)
        idx = np.flatnonzero(mask)
        ts = np.asarray(cols["ts"], np.int64)[idx]
        idx = idx[np.argsort(ts, kind="stable")]  # per key: arrival order (ts never decreases)
        if idx.shape[0]:
            self._add_tail(stream, [{k: v[idx] for k, v in cols.items()}])
        self._kept[stream] = int(idx.shape[0])

    def tail_of(self, stream: str) -> list[dict[str, np.ndarray]]:
        """The tail's raw pieces of ``stream``, oldest first (all older than its units)."""
        return self.tail.get(stream, [])

    def units_of(self, stream: str) -> list[Unit]:
        return self.units.get(stream, [])

    def rows(self, streams: Iterable[str] | None = None) -> int:
        """Raw rows held (units and tails) of the given streams (default: all)."""
        names = set(self.units) | set(self.tail) if streams is None else set(streams)
        n = 0
        for s in names:
            n += sum(int(u.raw["ts"].shape[0]) for u in self.units.get(s, []) if u.raw is not None)
            n += self._tail_n.get(s, 0)
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held (raw columns, pane rows, tails)."""
        n = sum(self._ub_sum.values()) + sum(self._tail_b.values())
        return n + sum(_unit_nbytes(h[-1]) for h in self.units.values() if h)
