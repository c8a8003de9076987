"""One-pass pre-aggregation of a micro-batch into (key, pane) rows.

Panes are Golab et al.'s basic windows (2003) of width ``g = settings.pane_ms``:
an event with ``ts`` in ``((k-1)g, kg]`` belongs to pane ``kg`` (``pane = ceil(ts/g)*g``),
so a suffix window ``(now - T, now]`` with ``now`` and ``T`` multiples of ``g`` is
exactly the set of panes ``now - T + g, ..., now``; every event lands in exactly one
pane (no ``window()`` expansion, no copies).  Per (key, pane) the row holds, for each
*column set* -- one per distinct WHERE/FILTER predicate in use (conditional
aggregation in the same pass) -- COUNT, SUMs, MIN/MAX, FIRST/LAST (value of the
earliest / latest event of the pane, ties in arrival order) and, for COUNT
DISTINCT, the (value, multiplicity) pairs of the pane (a set-valued index per basic
window, Golab et al. section 3).  These are exactly what the per-key pane
structures of Arasu & Widom (R-INT over panes, section 3; CI-COUNT/CI-SUM fed pane
counts/sums as multiplicities, section 4.2) need.

Everything is vectorized: one ``lexsort`` of the batch, then ``bincount`` /
``reduceat`` per column set, and one Numba pass for the exact SUMs (128-bit fixed point,
:mod:`engine.algorithms.fixed128`: a pane's sum is exact, so window sums built from panes equal
those built from single events, bit for bit).  No per-event Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from engine.algorithms.fixed128 import exact_group_sums

Columns = Mapping[str, np.ndarray]
Predicate = Callable[[Columns], np.ndarray]


@dataclass(frozen=True)
class ColumnSet:
    """The aggregates kept per (key, pane) for the events that satisfy one predicate."""

    name: str
    predicate: Predicate | None = None  # None: every event
    sums: tuple[str, ...] = ()
    minmax: tuple[str, ...] = ()
    firstlast: tuple[str, ...] = ()
    distinct: tuple[str, ...] = ()


@dataclass(frozen=True)
class PaneSpec:
    """What to pre-aggregate for one stream: its key field and the column sets in use."""

    key: str
    column_sets: tuple[ColumnSet, ...] = (ColumnSet("all"),)


@dataclass
class PaneAggregates:
    """The aggregates of one column set, aligned with :attr:`PaneRows.keys`."""

    count: np.ndarray  # int64
    sums: dict[str, np.ndarray] = field(default_factory=dict)  # float64 nearest to the exact sum
    # field -> the exact sums as fixed128 (hi, lo) words (:mod:`engine.algorithms.fixed128`)
    exact: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    mins: dict[str, np.ndarray] = field(default_factory=dict)  # float64, NaN when count == 0
    maxs: dict[str, np.ndarray] = field(default_factory=dict)
    first: dict[str, np.ndarray] = field(default_factory=dict)
    last: dict[str, np.ndarray] = field(default_factory=dict)
    # field -> (row index into the pane rows, value, multiplicity)
    distinct: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)


class SharedKeyIds:
    """The key ids of the keys of one cut's parts (:attr:`PaneRows.key_global`), ``-1`` until
    the key state that owns them (its first user: another one does not read them) interns them."""

    __slots__ = ("ids", "owner")

    def __init__(self, n: int) -> None:
        self.ids = np.full(n, -1, np.int64)
        self.owner: object | None = None


@dataclass
class PaneRows:
    """(key, pane) rows of a batch, sorted by key (first-seen order) then pane."""

    keys: np.ndarray  # object array of key values
    pane: np.ndarray  # int64 pane end ``kg``
    total: np.ndarray  # int64: events of the row before any predicate
    sets: dict[str, PaneAggregates]
    #: the keys factorized, when their maker had them: ``(codes, uniques)`` exactly as
    #: ``pd.factorize(keys, sort=False)`` gives them (codes int64 in first-seen order, uniques an
    #: object array), so that the key ids are interned once per distinct key, not hashed per row
    #: (:meth:`engine.evaluation.state.KeyState.apply_panes`); None: factorize ``keys``.  Not
    #: retained with the rows (:meth:`engine.evaluation.evaluator.Evaluator.apply_panes`)
    key_codes: tuple[np.ndarray, np.ndarray] | None = None
    #: with ``key_codes``, when the rows are one part of many cut from the same rows (a batch's
    #: lookups, :meth:`engine.executors.merge.PanePartial.rows_at`): ``(present, shared)``, the
    #: position of each of ``key_codes``' uniques among the keys of all the parts, and the ids
    #: of those keys as the key state interns them -- so that a key is looked up once per cut,
    #: not once per part it is in.  Not retained with the rows, like ``key_codes``
    key_global: tuple[np.ndarray, SharedKeyIds] | None = None

    def __len__(self) -> int:
        return len(self.pane)

    @property
    def n_events(self) -> int:
        return int(self.total.sum())


def pane_of(ts: np.ndarray, g: int) -> np.ndarray:
    """``ceil(ts / g) * g``: the pane (its end) that an event at ``ts`` belongs to."""
    ts = np.asarray(ts, np.int64)
    return -((-ts) // g) * g


def _segment_starts(gid: np.ndarray) -> np.ndarray:
    """Start positions of the runs of equal values in a sorted id array."""
    if len(gid) == 0:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])


def aggregate(columns: Columns, spec: PaneSpec, g: int) -> PaneRows:
    """Pre-aggregate events (given column-wise, in arrival order) into (key, pane) rows."""
    ts = np.asarray(columns["ts"], np.int64)
    n = len(ts)
    keycodes, uniques = pd.factorize(np.asarray(columns[spec.key], dtype=object), sort=False)
    pane = pane_of(ts, g)
    order = np.lexsort((np.arange(n), ts, pane, keycodes))  # arrival order breaks ts ties
    kc_s, pane_s = keycodes[order], pane[order]
    change = np.r_[True, (kc_s[1:] != kc_s[:-1]) | (pane_s[1:] != pane_s[:-1])] if n else np.zeros(0, bool)
    gid_s = np.cumsum(change) - 1  # group id of each sorted event
    starts = np.flatnonzero(change)
    n_groups = len(starts)
    keys = np.asarray(uniques, dtype=object)[kc_s[starts]] if n else np.zeros(0, dtype=object)
    total = np.bincount(gid_s, minlength=n_groups).astype(np.int64)
    sets: dict[str, PaneAggregates] = {}
    for cs in spec.column_sets:
        if cs.predicate is None:
            sel = np.arange(n)
        else:
            mask = np.asarray(cs.predicate(columns), bool)
            sel = np.flatnonzero(mask[order])
        g_sel = gid_s[sel]
        agg = PaneAggregates(count=np.bincount(g_sel, minlength=n_groups).astype(np.int64))
        seg = _segment_starts(g_sel)
        present = g_sel[seg] if len(seg) else np.zeros(0, np.int64)
        seg_last = np.r_[seg[1:], len(sel)] - 1 if len(seg) else np.zeros(0, np.int64)

        def col(name: str, _sel: np.ndarray = sel) -> np.ndarray:
            return np.asarray(columns[name], np.float64)[order][_sel]

        for f in cs.sums:
            agg.sums[f], agg.exact[f] = exact_group_sums(g_sel, col(f), n_groups)
        for f in cs.minmax:
            v = col(f)
            lo = np.full(n_groups, np.nan)
            hi = np.full(n_groups, np.nan)
            if len(seg):
                lo[present] = np.minimum.reduceat(v, seg)
                hi[present] = np.maximum.reduceat(v, seg)
            agg.mins[f], agg.maxs[f] = lo, hi
        for f in cs.firstlast:
            v = col(f)
            first = np.full(n_groups, np.nan)
            last = np.full(n_groups, np.nan)
            if len(seg):
                first[present] = v[seg]
                last[present] = v[seg_last]
            agg.first[f], agg.last[f] = first, last
        for f in cs.distinct:
            vals = np.asarray(columns[f])[order][sel]
            vcodes, vuniq = pd.factorize(vals, sort=False)
            pair = g_sel.astype(np.int64) * max(len(vuniq), 1) + vcodes
            upair, mult = np.unique(pair, return_counts=True)
            rows = upair // max(len(vuniq), 1)
            agg.distinct[f] = (rows, np.asarray(vuniq)[upair % max(len(vuniq), 1)], mult.astype(np.int64))
        sets[cs.name] = agg
    return PaneRows(keys=keys, pane=pane_s[starts] if n else np.zeros(0, np.int64), total=total, sets=sets)
