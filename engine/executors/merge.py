"""The driver's side of the executors' output: the exact merge of partial pane rows.

The tasks of a batch each send partial rows for the (stream, key field, key, pane, column set)
they saw (:mod:`engine.executors.preagg`); the same pane may also be partial across batches
(its events keep arriving until the watermark passes it).  :class:`PanePartial` holds the
partial rows of one (stream, key field), dense (one row per (key, pane), every column set
aligned with it), and merges them exactly -- vectorized (NumPy + one Numba pass per column set,
no Python per row):

* ``total`` and COUNT: integer sums;
* SUM: the fixed128 words (:mod:`engine.algorithms.fixed128`) added modulo ``2**128`` --
  integers, so any grouping gives the same words, and the float64 sum is the float nearest to
  them (``to_float_many``), bit for bit what ``panes.aggregate`` gives for all the events at once;
* MIN / MAX: the smallest / largest value of the parts (count > 0);
* FIRST / LAST: the value of the part whose first (last) event is smallest (largest) in
  (ts, batch, partition, offset) -- the driver's order: ``ts``, ties in arrival order, which
  is (partition, offset) within a batch and older batches first across batches;
* COUNT DISTINCT: (value, multiplicity) pairs, multiplicities added;
* key order: a (key, pane)'s earliest event in (batch, partition, offset) order, the smallest
  per key, so :meth:`PanePartial.pane_rows` orders keys as first seen, like ``aggregate``.

The merge's contract: for events split in any way among tasks (and among batches, numbered in
the order the driver reads them), ``PanePartial.merge`` of the parts, then
:meth:`PanePartial.pane_rows`, equals ``panes.aggregate`` of all the events (decoded by
:func:`engine.decode.decode_records`, batches concatenated oldest first) with the same column
sets: same rows in the same order, same ``total``, counts, float sums, exact words, FIRST and
LAST (bits), MIN and MAX (values).  Two things are canonical rather than order-dependent:

* COUNT DISTINCT pairs within a row are sorted by value (``aggregate`` lists them in the order
  values were first seen); the evaluator's COUNT DISTINCT over time windows reads whole panes,
  so the order within a pane does not change an answer;
* a MIN / MAX over values that compare equal but differ in sign (``0.0`` and ``-0.0``) may keep
  the other zero (``aggregate``'s own result depends on the order it reduces in); they compare
  equal, so no rule's answer changes.

:meth:`PanePartial.split` cuts off the panes due at a lookup time (``pane <= tau``;
:meth:`PanePartial.split_at` for a batch's lookup times in one pass, and
:meth:`PanePartial.rows_at` the same with each due part already as its pane rows, each row
gathered once, which is what the engine's lookups read); the rest stays pending and merges
with the next batch's rows; :meth:`PanePartial.with_spec` carries pending rows over a change
of the column sets (new sets from the executors re-run over the same records).
:func:`engine.executors.output.merge_output` turns a batch's whole executor output
(``mapInArrow(...).toArrow()``) into what the driver needs, these partials among it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numba as nb
import numpy as np
import pandas as pd

from engine.algorithms.fixed128 import add, to_float_many
from engine.evaluation.panes import PaneAggregates, PaneRows, SharedKeyIds
from engine.executors.preagg import KeySpec, SetSpec

_T = TypeVar("_T")
#: COUNT DISTINCT triples (rows, values, multiplicities) per column set, per field
_Dist = list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]


# ---------------------------------------------------------------- kernels
@nb.njit(cache=True)
def _less(a, b):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Lexicographic ``a < b`` of two int64 rows."""
    for k in range(a.shape[0]):
        if a[k] != b[k]:
            return a[k] < b[k]
    return False


@nb.njit(cache=True)
def _merge_set(gid, n_groups, count, hi, lo, mins, maxs, first, last, first_at, last_at):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """One column set's parts -> one row per group (parts with count 0 are skipped)."""
    f1, f2, f3 = hi.shape[1], mins.shape[1], first.shape[1]
    o_count = np.zeros(n_groups, np.int64)
    o_hi = np.zeros((n_groups, f1), np.int64)
    o_lo = np.zeros((n_groups, f1), np.int64)
    o_min = np.full((n_groups, f2), np.nan)
    o_max = np.full((n_groups, f2), np.nan)
    o_first = np.full((n_groups, f3), np.nan)
    o_last = np.full((n_groups, f3), np.nan)
    o_fat = np.zeros((n_groups, first_at.shape[1]), np.int64)
    o_lat = np.zeros((n_groups, last_at.shape[1]), np.int64)
    for i in range(gid.shape[0]):
        c = count[i]
        if c == 0:
            continue
        g = gid[i]
        seen = o_count[g] > 0
        o_count[g] += c
        for f in range(f1):
            o_hi[g, f], o_lo[g, f] = add(o_hi[g, f], o_lo[g, f], hi[i, f], lo[i, f])
        for f in range(f2):
            v = mins[i, f]
            if not seen or v < o_min[g, f]:
                o_min[g, f] = v
            v = maxs[i, f]
            if not seen or v > o_max[g, f]:
                o_max[g, f] = v
        if f3:
            if not seen or _less(first_at[i], o_fat[g]):
                o_fat[g, :] = first_at[i]
                o_first[g, :] = first[i]
            if not seen or _less(o_lat[g], last_at[i]):
                o_lat[g, :] = last_at[i]
                o_last[g, :] = last[i]
    return o_count, o_hi, o_lo, o_min, o_max, o_first, o_last, o_fat, o_lat


@nb.njit(cache=True)
def _merge_total(gid, n_groups, total, at):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Totals added; the lexicographically smallest ``at`` row per group."""
    o_total = np.zeros(n_groups, np.int64)
    o_at = np.zeros((n_groups, at.shape[1]), np.int64)
    seen = np.zeros(n_groups, np.bool_)
    for i in range(gid.shape[0]):
        g = gid[i]
        o_total[g] += total[i]
        if not seen[g] or _less(at[i], o_at[g]):
            o_at[g, :] = at[i]
            seen[g] = True
    return o_total, o_at


def _group_sum(gid: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Exact int64 sums of ``values`` per group id (sort + reduceat, no float)."""
    out = np.zeros(n, np.int64)
    if len(gid) == 0:
        return out
    order = np.argsort(gid, kind="stable")
    g = gid[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    out[g[starts]] = np.add.reduceat(np.asarray(values, np.int64)[order], starts)
    return out


# ---------------------------------------------------------------- partial rows
@dataclass
class SetPartial:
    """One column set's aggregates, aligned with the rows of its :class:`PanePartial`."""

    count: np.ndarray  # int64 (R,)
    sum_hi: np.ndarray  # int64 (R, len(sums)): fixed128 words of the exact sums
    sum_lo: np.ndarray
    mins: np.ndarray  # float64 (R, len(minmax)), NaN where count == 0
    maxs: np.ndarray
    first: np.ndarray  # float64 (R, len(firstlast)), NaN where count == 0
    last: np.ndarray
    #: int64 (R, 4): (ts, batch, partition, offset) of the event FIRST / LAST come from
    first_at: np.ndarray
    last_at: np.ndarray
    #: per distinct field: (row, value, multiplicity), sorted by (row, value)
    distinct: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)


@dataclass
class _Block:
    """Rows of parts: key codes (into a shared uniques array), panes, and their columns."""

    kc: np.ndarray
    pane: np.ndarray
    cols: tuple[np.ndarray, ...]
    aligned: bool = False  # one row per total row, in the same order (the inline column set)


@dataclass
class PanePartial:
    """Partial (key, pane) rows of one (stream, key field), mergeable (module docstring)."""

    spec: KeySpec
    keys: np.ndarray  # object array of key values
    pane: np.ndarray  # int64
    total: np.ndarray  # int64: events before any predicate
    #: int64 (R, 3): (batch, partition, offset) of the row's earliest event in arrival order
    key_at: np.ndarray
    sets: list[SetPartial]

    def __len__(self) -> int:
        return len(self.pane)

    @property
    def n_events(self) -> int:
        return int(self.total.sum())

    # -------------------------------------------------------------- building
    @classmethod
    def empty(cls, spec: KeySpec) -> PanePartial:
        """No rows (a pending buffer before the first batch)."""
        return _combine(
            spec,
            np.zeros(0, object),
            _Block(_I0, _I0, (_I0, np.zeros((0, 3), np.int64))),
            [_empty_set_block(s) for s in spec.sets],
            [[_Block(_I0, _I0, (np.zeros(0), _I0)) for _ in s.distinct] for s in spec.sets],
        )

    @classmethod
    def merge(cls, parts: list[PanePartial]) -> PanePartial:
        """One partial of many (same spec): exact, associative and commutative."""
        if not parts:
            raise ValueError("nothing to merge")
        spec = parts[0].spec
        if any(p.spec != spec for p in parts):
            raise ValueError("partials of different pane specs")
        parts = [p for p in parts if len(p)] or parts[:1]
        if len(parts) == 1:
            return parts[0]
        codes, uniques = pd.factorize(np.concatenate([p.keys for p in parts]), sort=False)
        codes = codes.astype(np.int64)
        bounds = np.cumsum([0] + [len(p) for p in parts])
        kcs = [codes[bounds[i] : bounds[i + 1]] for i in range(len(parts))]
        tot = _concat_blocks(
            [_Block(kc, p.pane, (p.total, p.key_at)) for kc, p in zip(kcs, parts, strict=True)]
        )
        sets, dist = [], []
        for j, s in enumerate(spec.sets):
            blocks, dblocks = [], [[] for _ in s.distinct]  # type: ignore[var-annotated]
            for kc, p in zip(kcs, parts, strict=True):
                sp = p.sets[j]
                live = np.flatnonzero(sp.count > 0)
                blocks.append(
                    _Block(
                        kc[live],
                        p.pane[live],
                        (
                            sp.count[live],
                            sp.sum_hi[live],
                            sp.sum_lo[live],
                            sp.mins[live],
                            sp.maxs[live],
                            sp.first[live],
                            sp.last[live],
                            sp.first_at[live],
                            sp.last_at[live],
                        ),
                    )
                )
                for k, (r, v, m) in enumerate(sp.distinct):
                    dblocks[k].append(_Block(kc[r], p.pane[r], (v, m)))
            sets.append(_concat_blocks(blocks))
            dist.append([_concat_blocks(b) for b in dblocks])
        return _combine(spec, np.asarray(uniques, dtype=object), tot, sets, dist)

    # -------------------------------------------------------------- using
    def take(self, idx: np.ndarray) -> PanePartial:
        """The rows ``idx`` (increasing positions or a boolean mask)."""
        idx = np.flatnonzero(idx) if idx.dtype == bool else np.asarray(idx, np.int64)
        new: np.ndarray | None = None
        dist: _Dist = []
        for sp in self.sets:
            dist.append([])
            for r, v, m in sp.distinct:
                if not len(r):
                    dist[-1].append((r, v, m))
                    continue
                if new is None:  # O(rows) once, and only when a COUNT DISTINCT has rows to remap
                    new = np.full(len(self), -1, np.int64)
                    new[idx] = np.arange(len(idx))
                nr = new[r]
                keep = nr >= 0
                dist[-1].append((nr[keep], v[keep], m[keep]))
        return self._rows(idx, dist)

    def _rows(self, idx: np.ndarray, dist: _Dist) -> PanePartial:
        """The rows ``idx`` with the distinct triples ``dist`` (per set, per field) already
        renumbered to the new rows."""
        sets = [
            SetPartial(
                sp.count[idx],
                sp.sum_hi[idx],
                sp.sum_lo[idx],
                sp.mins[idx],
                sp.maxs[idx],
                sp.first[idx],
                sp.last[idx],
                sp.first_at[idx],
                sp.last_at[idx],
                d,
            )
            for sp, d in zip(self.sets, dist, strict=True)
        ]
        return PanePartial(self.spec, self.keys[idx], self.pane[idx], self.total[idx], self.key_at[idx], sets)

    def split(self, until: int) -> tuple[PanePartial, PanePartial]:
        """(rows with ``pane <= until``, the others): what a lookup at ``until`` applies, what
        stays pending."""
        due = self.pane <= until
        return self.take(due), self.take(~due)

    def split_at(self, taus: range) -> tuple[dict[int, PanePartial], PanePartial]:
        """What :meth:`split` gives lookup by lookup over the increasing ``taus``, cut in one
        pass: ``(due, rest)`` where ``due[i]`` holds the rows with ``taus[i-1] < pane <= taus[i]``
        (every row with ``pane <= taus[0]`` in ``due[0]``), present only for the lookups that
        have rows (a stream idle for a day spans ``86,400`` lookups of one second, nearly all
        empty), and ``rest`` the rows after the last lookup.  Each row is copied once, not once
        per lookup it waits through; rows keep their order within each part."""
        return self._cut(taus, self._rows)

    def rows_at(self, taus: range) -> tuple[dict[int, PaneRows], PanePartial]:
        """:meth:`split_at` with each due part as its :meth:`pane_rows`, made from this partial's
        rows at once (each gathered once, in its final order: not cut, then ordered).  The keys
        are factorized once for all the parts, which share their ids (``PaneRows.key_global``)."""
        if not len(self):
            return {}, self
        codes, uniques = pd.factorize(self.keys, sort=False)
        glob = (np.asarray(codes, np.int64), np.asarray(uniques, dtype=object), SharedKeyIds(len(uniques)))
        return self._cut(taus, lambda idx, dist: self._pane_rows(idx, dist, glob))

    def _cut(self, taus: range, make: Callable[[np.ndarray, _Dist], _T]) -> tuple[dict[int, _T], PanePartial]:
        """:meth:`split_at` with the due parts made by ``make(rows, distinct triples)``."""
        if not len(self):
            return {}, self
        n = len(taus)
        at = np.searchsorted(np.asarray(taus, np.int64), self.pane, "left")  # first tau >= pane
        order = np.argsort(at, kind="stable")  # stable: increasing positions within each part
        parts, starts = np.unique(at[order], return_index=True)
        ends = np.r_[starts[1:], len(at)]
        # each row's position within its part, for renumbering the distinct triples in one pass
        # (O(rows + triples) per batch, not O(rows) per part)
        pos = np.empty(len(at), np.int64)
        pos[order] = np.arange(len(at)) - np.repeat(starts, ends - starts)
        dist: list[_Dist] = [[[] for _ in self.sets] for _ in parts]
        for s, sp in enumerate(self.sets):
            for r, v, m in sp.distinct:
                o = np.argsort(at[r], kind="stable")  # by part, keeping (row, value) order
                r, v, m = r[o], v[o], m[o]
                cut = np.searchsorted(at[r], parts, "left")
                for j, (a, b) in enumerate(zip(cut, np.r_[cut[1:], len(r)], strict=True)):
                    dist[j][s].append((pos[r[a:b]], v[a:b], m[a:b]))
        due: dict[int, _T] = {}
        rest: PanePartial | None = None
        for p, a, b, d in zip(parts.tolist(), starts, ends, dist, strict=True):
            if p == n:
                rest = self._rows(order[a:b], d)
            else:
                due[p] = make(order[a:b], d)
        return due, self.take(_I0) if rest is None else rest

    def with_spec(self, spec: KeySpec, extra: PanePartial | None = None) -> PanePartial:
        """The same rows under another spec of the same (stream, key field) -- after rules were
        added or removed while these panes were pending.  Each column set of ``spec`` is taken
        by name from this partial or else from ``extra``: the new sets computed over the *same
        events* (the executors re-run over the pending batches' offset ranges with only those
        sets); sets no longer in ``spec`` are dropped.  A set found in neither is an error unless
        there are no rows (its aggregates cannot be made up)."""
        if (spec.stream, spec.key) != (self.spec.stream, self.spec.key):
            raise ValueError("another stream or key field")
        mine = {s.name: (s, sp) for s, sp in zip(self.spec.sets, self.sets, strict=True)}
        theirs: dict[str, tuple[SetSpec, SetPartial]] = {}
        pos = np.arange(len(self))
        if extra is not None and len(extra.spec.sets):
            if len(extra) != len(self):
                raise ValueError("extra rows are not the same (key, pane) rows")
            codes, _ = pd.factorize(np.concatenate([self.keys, extra.keys]), sort=False)
            panes, pcode = np.unique(np.concatenate([self.pane, extra.pane]), return_inverse=True)
            comp = np.asarray(codes, np.int64) * max(len(panes), 1) + pcode.reshape(-1)
            pos = pd.Index(comp[len(self) :]).get_indexer(comp[: len(self)])  # extra row of each row
            if np.any(pos < 0) or not np.array_equal(extra.total[pos], self.total):
                raise ValueError("extra rows are not the same events")
            back = np.empty(len(pos), np.int64)
            back[pos] = np.arange(len(pos))  # row of self of each extra row
            for s, sp in zip(extra.spec.sets, extra.sets, strict=True):
                dist = []
                for r, v, m in sp.distinct:  # rows renumbered; within a row still sorted by value
                    o = np.argsort(back[r], kind="stable")
                    dist.append((back[r][o], v[o], m[o]))
                theirs[s.name] = (
                    s,
                    SetPartial(
                        sp.count[pos],
                        sp.sum_hi[pos],
                        sp.sum_lo[pos],
                        sp.mins[pos],
                        sp.maxs[pos],
                        sp.first[pos],
                        sp.last[pos],
                        sp.first_at[pos],
                        sp.last_at[pos],
                        dist,
                    ),
                )
        sets = []
        for s in spec.sets:
            got = mine.get(s.name) or theirs.get(s.name)
            if got is not None and got[0] != s:
                raise ValueError(f"column set {s.name!r} has other fields")
            if got is None:
                if len(self):
                    raise ValueError(f"column set {s.name!r} is not in the pending rows: give it as extra")
                got = (s, PanePartial.empty(KeySpec(spec.stream, spec.key, (s,))).sets[0])
            sets.append(got[1])
        return PanePartial(spec, self.keys, self.pane, self.total, self.key_at, sets)

    def pane_rows(self) -> PaneRows:
        """The rows as ``Evaluator.apply_panes`` takes them: keys as first seen, then panes."""
        return self._pane_rows(None, [sp.distinct for sp in self.sets])

    def _pane_rows(
        self,
        idx: np.ndarray | None,
        dist: _Dist,
        glob: tuple[np.ndarray, np.ndarray, SharedKeyIds] | None = None,
    ) -> PaneRows:
        """:meth:`pane_rows` of the rows ``idx`` (all: ``None``) with the distinct triples
        ``dist`` (per set, per field) numbered by position in ``idx``; ``glob``: this partial's
        keys factorized (codes, uniques) and their shared ids (:meth:`rows_at`)."""
        pane, key_at = (self.pane, self.key_at) if idx is None else (self.pane[idx], self.key_at[idx])
        n = len(pane)
        key_global: tuple[np.ndarray, SharedKeyIds] | None = None
        keys = np.zeros(0, object)
        if n:
            if glob is None:
                kc, kuniq = pd.factorize(self.keys if idx is None else self.keys[idx], sort=False)
            else:  # integers to factorize, not key objects: the same first-seen codes
                kc, kpos = pd.factorize(glob[0] if idx is None else glob[0][idx], sort=False)
                kpos = np.asarray(kpos, np.int64)
                kuniq = glob[1][kpos]
            kc = np.asarray(kc, np.int64)
            _, kmin = _merge_total(kc, len(kuniq), np.zeros(n, np.int64), key_at)  # each key's earliest
            rank = np.empty(len(kuniq), np.int64)
            rank[np.lexsort((kmin[:, 2], kmin[:, 1], kmin[:, 0]))] = np.arange(len(kuniq))
            order = np.lexsort((pane, rank[kc]))
            # the ordered keys factorized: their codes are the ranks (rows go by rank, then pane)
            uniq = np.empty(len(kuniq), object)
            uniq[rank] = np.asarray(kuniq, dtype=object)
            ranked = rank[kc][order]
            keys = uniq[ranked]  # the rows' keys in their final order: one gather of objects
            codes: tuple[np.ndarray, np.ndarray] | None = (ranked, uniq)
            if glob is not None:
                present = np.empty(len(kuniq), np.int64)
                present[rank] = kpos
                key_global = (present, glob[2])
        else:
            order = np.zeros(0, np.int64)
            codes = None
        new = np.empty(n, np.int64)
        new[order] = np.arange(n)
        sel = order if idx is None else idx[order]  # the rows in their final order, in this partial
        sets: dict[str, PaneAggregates] = {}
        for s, sp, ds in zip(self.spec.sets, self.sets, dist, strict=True):
            agg = PaneAggregates(count=sp.count[sel])
            if s.sums:
                hi, lo = sp.sum_hi[sel], sp.sum_lo[sel]
                fl = to_float_many(np.ascontiguousarray(hi), np.ascontiguousarray(lo))
                for c, f in enumerate(s.sums):
                    agg.sums[f] = np.ascontiguousarray(fl[:, c])
                    agg.exact[f] = (np.ascontiguousarray(hi[:, c]), np.ascontiguousarray(lo[:, c]))
            for c, f in enumerate(s.minmax):
                agg.mins[f] = np.ascontiguousarray(sp.mins[sel, c])
                agg.maxs[f] = np.ascontiguousarray(sp.maxs[sel, c])
            for c, f in enumerate(s.firstlast):
                agg.first[f] = np.ascontiguousarray(sp.first[sel, c])
                agg.last[f] = np.ascontiguousarray(sp.last[sel, c])
            for f, (r, v, m) in zip(s.distinct, ds, strict=True):
                nr = new[r]
                o = np.argsort(nr, kind="stable")  # within a row: still sorted by value
                agg.distinct[f] = (nr[o], v[o], m[o])
            sets[s.name] = agg
        return PaneRows(
            keys=keys,
            pane=pane[order],
            total=self.total[sel],
            sets=sets,
            key_codes=codes,
            key_global=key_global,
        )


_I0 = np.zeros(0, np.int64)


def _empty_set_block(s: SetSpec) -> _Block:
    f1, f2, f3 = len(s.sums), len(s.minmax), len(s.firstlast)
    return _Block(
        _I0,
        _I0,
        (
            _I0,
            np.zeros((0, f1), np.int64),
            np.zeros((0, f1), np.int64),
            np.zeros((0, f2)),
            np.zeros((0, f2)),
            np.zeros((0, f3)),
            np.zeros((0, f3)),
            np.zeros((0, 4), np.int64),
            np.zeros((0, 4), np.int64),
        ),
    )


def _concat_blocks(blocks: list[_Block]) -> _Block:
    if len(blocks) == 1:
        return blocks[0]
    return _Block(
        np.concatenate([b.kc for b in blocks]),
        np.concatenate([b.pane for b in blocks]),
        tuple(np.concatenate(c) for c in zip(*(b.cols for b in blocks), strict=True)),
    )


def _combine(
    spec: KeySpec, uniques: np.ndarray, tot: _Block, sets: list[_Block], dist: list[list[_Block]]
) -> PanePartial:
    """Group the parts' rows by (key, pane) (hashing, no sort) and reduce them (module
    docstring).  Every set or distinct row's (key, pane) must have a total row."""
    pcode, panes = pd.factorize(np.asarray(tot.pane, np.int64))
    n_p = max(len(panes), 1)
    gid, groups = pd.factorize(tot.kc * n_p + pcode)
    gid = np.asarray(gid, np.int64)
    groups = np.asarray(groups, np.int64)
    n = len(groups)
    pane_index, group_index = pd.Index(panes), pd.Index(groups)
    total, key_at = _merge_total(gid, n, np.asarray(tot.cols[0], np.int64), np.asarray(tot.cols[1], np.int64))

    def group_of(b: _Block) -> np.ndarray:
        if b.aligned:
            return gid
        if not len(b.kc):
            return _I0
        pc_ = pane_index.get_indexer(b.pane)
        g = group_index.get_indexer(b.kc * n_p + pc_)
        if np.any(pc_ < 0) or np.any(g < 0):
            raise ValueError("a column set's row has no total row (a malformed part)")
        return np.asarray(g, np.int64)

    out_sets = []
    for b, dbs in zip(sets, dist, strict=True):
        cnt, hi, lo, mn, mx, fi, la, fat, lat = _merge_set(
            group_of(b), n, *(np.ascontiguousarray(c) for c in b.cols)
        )
        distinct = []
        for db in dbs:
            dg = group_of(db)
            values, mult = db.cols
            if len(values):
                vcode, vuniq = pd.factorize(values, sort=True)  # canonical: rows, then values
                nv = max(len(vuniq), 1)
                pair = dg * nv + vcode.astype(np.int64)
                order = np.argsort(pair, kind="stable")
                ps = pair[order]
                starts = np.flatnonzero(np.r_[True, ps[1:] != ps[:-1]])
                up = ps[starts]
                m = np.add.reduceat(np.asarray(mult, np.int64)[order], starts)
                distinct.append((up // nv, np.asarray(vuniq)[up % nv], m))
            else:
                distinct.append((_I0, values, _I0))
        out_sets.append(SetPartial(cnt, hi, lo, mn, mx, fi, la, fat, lat, distinct))
    return PanePartial(
        spec,
        np.asarray(uniques, dtype=object)[groups // n_p] if n else np.zeros(0, object),
        np.asarray(panes, np.int64)[groups % n_p] if n else _I0,
        total,
        key_at,
        out_sets,
    )


# ---------------------------------------------------------------- one batch's output
