"""The evaluator: many standing rules over shared window state (the code the engine and the
backtest both run).

State is shared, never per rule (Arasu & Widom 2004, sections 3-4):

* per (stream, key field) a :class:`_KeyState` with the key interner and a domain R-INT of
  every event (before WHERE) for the key domain of RULES.md;
* per (predicate = WHERE AND FILTER, attribute, kind) one structure -- R-INT counts, R-INT
  running sums and values (SUM/AVG/FIRST/LAST), MIN/MAX, COUNT DISTINCT -- serving every rule
  that needs it;
* per (predicate, attribute) one collective index, CI-COUNT or CI-SUM, serving every
  indexable atom on it (any window, any threshold).

``strategy="shared"`` answers a rule with a driver (see :mod:`subscriptions.compiler`) from the
index candidates of its driving atom(s) followed by an exact post-check of the whole
condition; rules that are a single threshold atom and share (index, window) are looked up
together (one index lookup at the loosest threshold, then one Numba pass: exact values,
per-rule ranges, changes), and so are rules ``driver AND further aggregate-vs-constant atoms``
(the group's (rule, key) pairs of the driver are then filtered by the other atoms, each distinct
aggregate read once for the keys of all rules using it -- Arasu & Widom's sharing carried over
to the post-check); candidates the index proves (``CICount.lookup``'s ``sure`` mask) skip
the post-check when the driving atom is the condition or one of its top-level disjuncts.
``strategy="naive"`` evaluates every rule, one by one, on every key of its key domain from the
same per-key structures, with no collective index.  Both give identical answers.

Batches are dicts of NumPy columns (one micro-batch); within a batch rows may come in any order,
across batches each key's timestamps must not decrease.  With ``pane_ms=g`` the structures of
time windows that are multiples of g are fed one row per (key, pane) -- Golab et al. 2003's basic
windows, as multiplicities (Arasu & Widom 2004, section 4.2) -- either pre-aggregated here
(:meth:`Evaluator.apply`) or given as :class:`engine.evaluation.panes.PaneRows` (:meth:`Evaluator.apply_panes`,
see :meth:`Evaluator.pane_spec`); answers are identical to raw events for lookups at pane
boundaries.  New rules are evaluated against the state already held (PSoup, Chandrasekaran &
Franklin 2002): structures a new rule needs that do not exist yet, or that were expired to a
shorter horizon than it reads, are (re)built from the retained history.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numba as nb
import numpy as np
import pandas as pd

from engine.algorithms import CICount, CISum, DistinctCount, KeyInterner, MinMax, RInt
from engine.algorithms.fixed128 import exact_group_sums
from engine.evaluation.panes import ColumnSet, PaneAggregates, PaneRows, PaneSpec, aggregate, pane_of
from subscriptions import rule_ast as A
from subscriptions.compiler import AggSpec, Atom, Plan
from tidewatch.schema import STREAMS

_EMPTY = np.zeros(0, np.int64)
_SHIFT = np.int64(32)  # (rule uid << 32) | key id encodes a (rule, key) pair


# ---------------------------------------------------------------- batches and predicates
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
        return np.asarray(_compare(v, c.op, c.value), dtype=bool)
    if isinstance(c, A.RowIn):
        if v.dtype == object:
            return np.asarray(pd.Index(v).isin(list(c.values)), dtype=bool)
        return np.isin(v, np.asarray(c.values, dtype=np.float64))
    if isinstance(c, A.RowBetween):
        return np.asarray(_compare(v, ">=", c.lo), dtype=bool) & np.asarray(
            _compare(v, "<=", c.hi), dtype=bool
        )
    raise TypeError(c)


def _compare(a: Any, op: str, b: Any) -> Any:
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
    :meth:`Evaluator.apply_panes`) and the pane width ``pane_ms`` the rows must use."""

    needs_raw: bool = False
    pane_ms: int = 0


@dataclass
class _Unit:
    """One retained input of a stream for PSoup backfill: raw columns and/or the pane rows of
    each key field, all standing for the same events."""

    raw: dict[str, np.ndarray] | None
    rows: dict[str, PaneRows] = field(default_factory=dict)
    source: Any = None  # the caller's raw dict, to join the calls of one batch (by identity)

    def max_ts(self) -> int:
        if self.raw is not None and self.raw["ts"].shape[0]:
            return int(self.raw["ts"][-1])
        panes = [int(np.asarray(r.pane).max()) for r in self.rows.values() if len(r)]
        return max(panes) if panes else int(np.iinfo(np.int64).min)


@nb.njit(cache=True, nogil=True)
def _group_pass(cand, vals, los, his, lo_strict, hi_strict, uids, prev):  # type: ignore[no-untyped-def]
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
    return _pair_diff(pairs[:j], prev)


@nb.njit(cache=True, nogil=True)
def _pair_diff(pairs, prev):  # type: ignore[no-untyped-def]
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


# ---------------------------------------------------------------- shared state
@dataclass
class _Structure:
    """One shared per-key structure and the rules / windows that use it.

    ``raw``: fed with raw events (always so without panes; with panes only when a window it
    serves is a ROWS window or not a multiple of the pane width), else fed with pane rows."""

    kind: str  # count | values | firstlast | minmax | distinct | ci_count | ci_sum
    predicate: A.RowCond | None
    attr: str  # "*" or field name
    obj: Any
    raw: bool = True
    users: dict[str, int] = field(default_factory=dict)  # rule name -> longest time window it needs
    rows_users: set[str] = field(default_factory=set)  # rules reading ROWS windows (no expiry)

    def horizon(self) -> int | None:
        """Longest time window in use (None: must not expire, a ROWS window reads it)."""
        if self.rows_users:
            return None
        return max(self.users.values(), default=0)

    @property
    def first_col(self) -> int:
        """Value column of the R-INT read for FIRST (pane-fed ``firstlast``: the pane's first)."""
        return 0

    @property
    def last_col(self) -> int:
        """Value column of the R-INT read for LAST (pane-fed ``firstlast``: the pane's last)."""
        return 1 if self.kind == "firstlast" else 0


def _set_name(predicate: A.RowCond | None) -> str:
    """Name of the pane column set of a predicate ("all" without one)."""
    return "all" if predicate is None else A.row_text(predicate)


class _KeyState:
    """Everything held for one (stream, key field): interner, domain R-INTs, structures, indexes.

    With panes (``pane_ms``), structures come in two feeds (see :class:`_Structure`) and so
    does the domain R-INT (``domains[True]`` raw, ``domains[False]`` pane rows)."""

    def __init__(self, stream: str, key: str, ci_p: int, pane_ms: int | None = None) -> None:
        self.stream = stream
        self.key = key
        self.ci_p = ci_p
        self.pane_ms = pane_ms
        self.interner = KeyInterner()
        #: every event (before WHERE), for key domains; keyed by feed (True: raw events)
        self.domains: dict[bool, RInt] = {True: RInt(0), False: RInt(0)}
        #: a domain R-INT is kept only while a rule reads it (naive, or a rule without a driver:
        #: an index-driven rule's answer lies inside its key domain by construction)
        self.domain_live: dict[bool, bool] = {True: False, False: False}
        self.domain_users: dict[str, int | None] = {}
        self.domain_readers: dict[str, bool] = {}  # rule name -> feed of the domain it reads
        self.structs: dict[tuple[str, str, str, bool], _Structure] = {}
        self.value_ids: dict[str, KeyInterner] = {}  # per string field, for COUNT DISTINCT
        self._ids: dict[Any, int] = {}  # key value -> id (mirror of the interner, for fast lookups)
        self._key_arr = np.zeros(0, dtype=object)  # id -> key value (capacity doubles)
        self._key_n = 0
        #: keys the input is known to hold (a backtest factorizes the whole file first): lets
        #: the collective indexes allocate for the whole key domain at once
        self.key_hint = 0
        self._pre_cache: tuple[np.ndarray, np.ndarray] | None = None  # (input's uniques, their ids)

    @property
    def domain(self) -> RInt:
        """The domain R-INT without panes (kept for callers of the raw-only evaluator)."""
        return self.domains[True]

    def feed_raw(self, window: A.Window | int | None) -> bool:
        """Whether a window must be served from raw events (True without panes)."""
        g = self.pane_ms
        if g is None:
            return True
        if isinstance(window, A.RowsWindow):
            return True
        if window is None:  # a ROWS-only rule's domain: every key seen, no window
            return False
        if isinstance(window, A.TimeWindow):
            return window.start_ms % g != 0 or window.end_ms % g != 0
        return int(window) % g != 0

    def struct(
        self, kind: str, predicate: A.RowCond | None, attr: str, raw: bool = True
    ) -> tuple[_Structure, bool]:
        """The shared structure for (kind, predicate, attribute, feed), created when missing.

        COUNT is served by an existing R-INT of values under the same predicate and feed when
        there is one (its count column holds the same rows), so one R-INT serves COUNT and SUM."""
        if self.pane_ms is None:
            raw = True
        pred = A.row_text(predicate)
        k = (kind, pred, attr, raw)
        s = self.structs.get(k)
        if s is not None:
            return s, False
        if kind == "count":
            for (kind2, pred2, _, raw2), s2 in self.structs.items():
                if kind2 == "values" and pred2 == pred and raw2 == raw:
                    return s2, False
        s = _Structure(kind, predicate, attr, self.new_obj(kind, attr, raw), raw)
        self.structs[k] = s
        return s, True

    def new_obj(self, kind: str, attr: str, raw: bool) -> Any:
        """An empty algorithms structure of a kind."""
        obj: Any
        if kind == "count":
            obj = RInt(0)
        elif kind == "values":
            # one column: SUM (and, raw-fed, FIRST/LAST of the value); pane-fed: the pane sums
            obj = RInt(1)
        elif kind == "firstlast":
            # pane-fed FIRST/LAST: columns [the pane's first value, the pane's last value]
            obj = RInt(2)
        elif kind == "minmax":
            obj = MinMax()
        elif kind == "distinct":
            obj = DistinctCount()
        elif kind == "ci_count":
            obj = CICount(self.ci_p)
        elif kind == "ci_sum":
            # CI-SUM counts values in units (section 4.2); a unit of the field's typical value
            # keeps the number of levels, and the O(p log units) update cost, small -- candidates
            # stay a superset (one unit of slack), the post-check stays exact
            obj = CISum(self.ci_p, unit=STREAMS[self.stream].fields[attr].typical)
        else:  # pragma: no cover
            raise ValueError(kind)
        return obj

    def key_values(self, ids: np.ndarray) -> np.ndarray:
        """Key values (object array) of key ids."""
        n = len(self.interner)
        if self._key_n < n:
            if self._key_arr.shape[0] < n:
                grown = np.empty(max(2 * self._key_arr.shape[0], n, 64), dtype=object)
                grown[: self._key_n] = self._key_arr[: self._key_n]
                self._key_arr = grown
            self._key_arr[self._key_n : n] = self.interner.keys(np.arange(self._key_n, n))
            self._key_n = n
        return self._key_arr[ids]

    def _intern(self, codes: np.ndarray, uniques: np.ndarray) -> np.ndarray:
        """Key ids of factorized key values (new keys get ids in first-seen order)."""
        get = self._ids.get
        ids = np.fromiter((get(u, -1) for u in uniques), np.int64, uniques.shape[0])
        new = ids < 0
        if new.any():  # first-seen order (uniques are in order of appearance)
            # distinct and unseen: one interner call each, in first-seen order (no re-sort)
            intern = self.interner.id
            got = np.fromiter((intern(u) for u in uniques[new].tolist()), np.int64, int(new.sum()))
            ids[new] = got
            self._ids.update(zip(uniques[new].tolist(), got.tolist(), strict=True))
        return ids[codes]

    def unique_ids(self, batch: BatchView) -> tuple[np.ndarray, np.ndarray]:
        """(codes, key id of each code) of the batch's key column. With a pre-factorized key
        column the ids of the input's uniques are cached across batches (no per-key hashing)."""
        codes, uniques = batch.factorized(self.key)
        K = uniques.shape[0]
        g = batch.global_index.get(self.key)
        if g is None:
            return codes, self._intern(np.arange(K, dtype=np.int64), uniques)
        present, uniq_g = g
        cache = self._pre_cache
        if cache is None or cache[0] is not uniq_g:
            cache = self._pre_cache = (uniq_g, np.full(uniq_g.shape[0], -1, np.int64))
        ids_u = cache[1]
        ids = ids_u[present]
        miss = np.flatnonzero(ids < 0)
        if miss.shape[0]:
            got = self._intern(np.arange(miss.shape[0], dtype=np.int64), uniques[miss])
            ids[miss] = got
            ids_u[present[miss]] = got
        return codes, ids

    def key_ids(self, batch: BatchView) -> np.ndarray:
        if batch.n == 0:
            return np.zeros(0, np.int64)
        codes, ids = self.unique_ids(batch)
        return ids[codes]

    def ids_of(self, keys: np.ndarray) -> np.ndarray:
        """Key ids of an array of key values."""
        if keys.shape[0] == 0:
            return np.zeros(0, np.int64)
        codes, uniques = pd.factorize(np.asarray(keys, dtype=object), sort=False)
        return self._intern(codes.astype(np.int64), np.asarray(uniques, dtype=object))

    def distinct_ids(self, name: str, v: np.ndarray) -> np.ndarray:
        """int64 identities of values of a field (COUNT DISTINCT compares these)."""
        f = STREAMS[self.stream].fields[name]
        if f.numeric:
            if f.type == "int":
                return np.asarray(v).astype(np.int64)
            return (np.asarray(v).astype(np.float64) + 0.0).view(np.int64)
        if v.shape[0] == 0:
            return np.zeros(0, np.int64)
        codes, uniques = pd.factorize(np.asarray(v, dtype=object), sort=False)
        it = self.value_ids.setdefault(name, KeyInterner())
        return it.ids(np.asarray(uniques, dtype=object).astype(str))[codes]

    def distinct_values(self, batch: BatchView, name: str) -> np.ndarray:
        f = STREAMS[self.stream].fields[name]
        if f.numeric:
            return self.distinct_ids(name, batch.numeric(name))
        codes, uniques = batch.factorized(name)
        it = self.value_ids.setdefault(name, KeyInterner())
        if batch.n == 0:
            return np.zeros(0, np.int64)
        return it.ids(uniques.astype(str))[codes]

    def apply(
        self, batch: BatchView, structs: Iterable[_Structure] | None = None, domain: bool | None = None
    ) -> None:
        """Apply a ts-sorted batch of raw events to every raw-fed structure (or the given ones)
        and, when ``domain`` (default: all structures and the raw domain R-INT is live), to the
        raw domain R-INT."""
        if domain is None:
            domain = structs is None and self.domain_live[True]
        if structs is None:
            structs = [s for s in self.structs.values() if s.raw]
        else:
            structs = list(structs)
        if not structs and not domain:
            return
        ids = self.key_ids(batch)
        ts = np.asarray(batch.cols["ts"], dtype=np.int64)
        if domain:
            self.domains[True].append(ids, ts)
        for s in structs:
            m = batch.mask(s.predicate)
            k, t = (ids, ts) if m is None else (ids[m], ts[m])
            if k.shape[0] == 0:
                continue
            if s.kind == "count":
                s.obj.append(k, t)
            elif s.kind == "ci_count":
                s.obj.update(k, t)
            elif s.kind == "distinct":
                v = self.distinct_values(batch, s.attr)
                s.obj.append(k, t, v if m is None else v[m])
            else:
                v = batch.numeric(s.attr).astype(np.float64)
                v = v if m is None else v[m]
                if s.kind == "values":
                    s.obj.append(k, t, v.reshape(-1, 1))
                elif s.kind == "minmax":
                    s.obj.append(k, t, v)
                else:  # ci_sum
                    s.obj.update(k, t, v)

    # ------------------------------------------------------------ panes
    def pane_structs(self) -> list[_Structure]:
        return [s for s in self.structs.values() if not s.raw]

    def column_sets(
        self, structs: Iterable[_Structure] | None = None
    ) -> list[tuple[A.RowCond | None, dict[str, set[str]]]]:
        """(predicate, {"sums"|"minmax"|"firstlast"|"distinct": fields}) of the pane-fed structures."""
        out: dict[str, tuple[A.RowCond | None, dict[str, set[str]]]] = {}
        for s in self.pane_structs() if structs is None else structs:
            name = _set_name(s.predicate)
            _, need = out.setdefault(
                name, (s.predicate, {"sums": set(), "minmax": set(), "firstlast": set(), "distinct": set()})
            )
            if s.kind in ("values", "ci_sum"):
                need["sums"].add(s.attr)
            elif s.kind == "firstlast":
                need["firstlast"].add(s.attr)
            elif s.kind == "minmax":
                need["minmax"].add(s.attr)
            elif s.kind == "distinct":
                need["distinct"].add(s.attr)
        return list(out.values())

    def _reserve(self, s: _Structure) -> None:
        """Capacity hint for collective indexes that take one (``reserve_keys``): room for every
        key id interned so far, so key growth does not re-copy their slot tables batch by batch."""
        reserve = getattr(s.obj, "reserve_keys", None)
        if reserve is not None:
            reserve(max(len(self.interner), self.key_hint))

    def one_pane_rows(
        self, batch: BatchView, structs: list[_Structure], pane: int
    ) -> tuple[PaneRows, np.ndarray]:
        """(rows, key ids of the rows) of a ts-sorted batch whose events all lie in one pane:
        what :func:`engine.evaluation.panes.aggregate` computes, grouped by key only (no sort), from the
        batch's cached factorization and predicate masks."""
        codes, ids = self.unique_ids(batch)
        uniques = batch.factorized(self.key)[1]
        K = uniques.shape[0]
        sets: dict[str, PaneAggregates] = {}
        for pred, need in self.column_sets(structs):
            m = batch.mask(pred)
            c = codes if m is None else codes[m]
            agg = PaneAggregates(count=np.bincount(c, minlength=K).astype(np.int64))
            present = agg.count > 0

            def col(name: str, _m: np.ndarray | None = m) -> np.ndarray:
                v = batch.numeric(name).astype(np.float64)
                return v if _m is None else v[_m]

            for f in need["sums"]:
                agg.sums[f], agg.exact[f] = exact_group_sums(c, col(f), K)
            for f in need["minmax"]:
                v = col(f)
                lo = np.full(K, np.inf)
                hi = np.full(K, -np.inf)
                np.minimum.at(lo, c, v)
                np.maximum.at(hi, c, v)
                lo[~present] = np.nan
                hi[~present] = np.nan
                agg.mins[f], agg.maxs[f] = lo, hi
            if need["firstlast"]:
                # rows are in stable ts order: a key's first / last row is its FIRST / LAST
                ukeys, first_i = np.unique(c, return_index=True)
                _, last_r = np.unique(c[::-1], return_index=True)
                last_i = c.shape[0] - 1 - last_r
                for f in need["firstlast"]:
                    v = col(f)
                    first = np.full(K, np.nan)
                    last = np.full(K, np.nan)
                    first[ukeys] = v[first_i]
                    last[ukeys] = v[last_i]
                    agg.first[f], agg.last[f] = first, last
            for f in need["distinct"]:
                vals = np.asarray(batch.cols[f])
                vals = vals if m is None else vals[m]
                vcodes, vuniq = pd.factorize(vals, sort=False)
                nv = max(len(vuniq), 1)
                upair, mult = np.unique(c.astype(np.int64) * nv + vcodes, return_counts=True)
                agg.distinct[f] = (upair // nv, np.asarray(vuniq)[upair % nv], mult.astype(np.int64))
            sets[_set_name(pred)] = agg
        total = np.bincount(codes, minlength=K).astype(np.int64)
        rows = PaneRows(keys=uniques, pane=np.full(K, pane, np.int64), total=total, sets=sets)
        return rows, ids

    def apply_panes(
        self,
        rows: PaneRows,
        structs: Iterable[_Structure] | None = None,
        domain: bool | None = None,
        ids: np.ndarray | None = None,
    ) -> list[_Structure]:
        """Apply (key, pane) rows to every pane-fed structure (or the given ones) and, when
        ``domain`` (default: all structures and the pane domain R-INT is live), to the pane
        domain R-INT. Each row stands for its pane's events at ``ts = pane`` (its end), with
        multiplicities (Arasu & Widom 2004, section 4.2). Returns the structures whose column
        set was missing from ``rows`` (left untouched)."""
        if len(rows) == 0:
            return []
        if ids is None:
            ids = self.ids_of(rows.keys)
        ts = np.asarray(rows.pane, dtype=np.int64)
        if domain is None:
            domain = structs is None and self.domain_live[False]
        if domain:
            tot = np.asarray(rows.total, dtype=np.int64)
            live = tot > 0
            self.domains[False].append(ids[live], ts[live], mult=tot[live])
        missing: list[_Structure] = []
        for s in self.pane_structs() if structs is None else structs:
            self._reserve(s)
            agg = rows.sets.get(_set_name(s.predicate))
            if agg is None:
                missing.append(s)
                continue
            cnt = np.asarray(agg.count, dtype=np.int64)
            sel = np.flatnonzero(cnt > 0)
            if sel.shape[0] == 0:
                continue
            k, t, c = ids[sel], ts[sel], cnt[sel]
            try:
                if s.kind == "count":
                    s.obj.append(k, t, mult=c)
                elif s.kind == "ci_count":
                    s.obj.update(k, t, mult=c)
                elif s.kind == "ci_sum":
                    s.obj.update(k, t, np.asarray(agg.sums[s.attr], np.float64)[sel])
                elif s.kind == "values":
                    v = np.asarray(agg.sums[s.attr], np.float64)[sel].reshape(-1, 1)
                    ex = agg.exact.get(s.attr)  # the exact pane sums (v is rounded)
                    s.obj.append(k, t, v, mult=c, exact=None if ex is None else (ex[0][sel], ex[1][sel]))
                elif s.kind == "firstlast":
                    vals = np.column_stack((agg.first[s.attr][sel], agg.last[s.attr][sel]))
                    s.obj.append(k, t, vals, mult=c)
                elif s.kind == "minmax":
                    # two rows per pane, its MIN and its MAX: every MIN/MAX over time windows of
                    # whole panes is exact (ROWS windows are fed raw events)
                    n = sel.shape[0]
                    s.obj.append(
                        np.repeat(k, 2),
                        np.repeat(t, 2),
                        np.column_stack((agg.mins[s.attr][sel], agg.maxs[s.attr][sel])).reshape(2 * n),
                    )
                else:  # distinct: one row per (key, pane, value); multiplicities do not matter
                    r, v, _mult = agg.distinct[s.attr]
                    r = np.asarray(r, np.int64)
                    s.obj.append(ids[r], ts[r], self.distinct_ids(s.attr, np.asarray(v)))
            except KeyError:
                missing.append(s)
        return missing


# ---------------------------------------------------------------- rules
@dataclass
class _Rule:
    name: str
    plan: Plan
    uid: int
    state: _KeyState
    agg_structs: list[_Structure]  # by AggSpec id
    index_structs: dict[int, _Structure]  # atom id -> CI structure (driving atoms)
    prev: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sorted key ids
    group: tuple[Any, ...] | None = None


@dataclass
class _ExtraTable:
    """The extra threshold atoms of a group's members that read one aggregate (structure,
    function, window): per member (sorted by rule uid, at most one atom each) the operator, the
    constant, which side the aggregate is on and whether the atom is negated."""

    struct: _Structure
    spec: AggSpec
    uids: np.ndarray  # sorted rule uids
    ops: np.ndarray  # object array of "<", "<=", ">", ">=", "=", "!="
    consts: np.ndarray  # float64
    agg_left: np.ndarray  # bool: aggregate op constant (else constant op aggregate)
    negated: np.ndarray  # bool

    def check(self, ctx: _Lookup, uid_of: np.ndarray, key_of: np.ndarray) -> np.ndarray | None:
        """Indices of the pairs (rule uid, key id) of this table's rules that fail their atom
        (None: the table has no pair); the aggregate is computed once per distinct key."""
        pos = np.minimum(np.searchsorted(self.uids, uid_of), self.uids.shape[0] - 1)
        sel = np.flatnonzero(self.uids[pos] == uid_of)
        if sel.shape[0] == 0:
            return None
        keys, inv = np.unique(key_of[sel], return_inverse=True)
        v = ctx._agg(self.spec, self.struct, keys)[inv]
        j = pos[sel]
        ok = np.empty(sel.shape[0], bool)
        ops, c, left = self.ops[j], self.consts[j], self.agg_left[j]
        for op in np.unique(ops):
            m = ops == op
            a = np.where(left[m], v[m], c[m])
            b = np.where(left[m], c[m], v[m])
            with np.errstate(invalid="ignore"):
                r = np.asarray(_compare(a, str(op), b), dtype=bool)
                if op == "!=":  # as _Lookup._atom: NULL (NaN) compares false
                    r = r & ~np.isnan(a) & ~np.isnan(b)
            ok[m] = r
        ok ^= self.negated[j]
        return sel[~ok]


def _extra_tables(
    extras: dict[str, list[tuple[_Structure, AggSpec, Atom]]], uids: dict[str, int]
) -> list[_ExtraTable]:
    """Group the extra atoms of a group's members into tables, one per aggregate read (a rule
    with two atoms on the same aggregate puts the second into a second table)."""
    rows: dict[tuple[Any, ...], list[tuple[int, _Structure, AggSpec, Atom]]] = {}
    for name, items in extras.items():
        seen: dict[tuple[Any, ...], int] = {}
        for s, spec, atom in items:
            sig = (id(s), spec.func, spec.window)
            k = seen.get(sig, 0)
            seen[sig] = k + 1
            rows.setdefault((*sig, k), []).append((uids[name], s, spec, atom))
    out = []
    for table in rows.values():
        table.sort(key=lambda r: r[0])
        out.append(
            _ExtraTable(
                struct=table[0][1],
                spec=table[0][2],
                uids=np.array([r[0] for r in table], np.int64),
                ops=np.array([r[3].op for r in table], dtype=object),
                consts=np.array([_const_side(r[3])[0] for r in table], np.float64),
                agg_left=np.array([_const_side(r[3])[1] for r in table], bool),
                negated=np.array([r[3].negated for r in table], bool),
            )
        )
    return out


def _const_side(atom: Atom) -> tuple[float, bool]:
    """(the constant, True if the aggregate is the left side) of an aggregate-vs-constant atom."""
    if isinstance(atom.right, A.Num):
        return float(atom.right.value), True
    assert isinstance(atom.left, A.Num)
    return float(atom.left.value), False


def _extra_atoms(plan: Plan) -> list[Atom] | None:
    """The atoms besides the driver when the condition is ``driver AND a1 AND ...`` with every
    ``ai`` an aggregate compared to a constant (looked up with the driver's group); else None."""
    if len(plan.driver) != 1 or plan.cond[0] != "and":
        return None
    parts = plan.cond[1]
    if any(p[0] != "atom" for p in parts) or ("atom", plan.driver[0]) not in parts:
        return None
    out = []
    for p in parts:
        if p[1] == plan.driver[0]:
            continue
        a = plan.atoms[p[1]]
        if not (
            (isinstance(a.left, A.Agg) and isinstance(a.right, A.Num))
            or (isinstance(a.right, A.Agg) and isinstance(a.left, A.Num))
        ):
            return None
        out.append(a)
    return out


@dataclass
class _Group:
    """Threshold rules driven by one (index, window), looked up together: single-atom rules and
    rules ``driver AND more threshold atoms`` (the latter in :attr:`extras`)."""

    state: _KeyState
    index: _Structure
    exact: _Structure  # R-INT with the exact counts / sums
    sum_kind: bool
    T: int
    members: dict[str, Atom] = field(default_factory=dict)  # rule name -> its atom
    uids: dict[str, int] = field(default_factory=dict)
    prev_pairs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    arrays: tuple[Any, ...] | None = None  # per-member ranges, rebuilt when members change
    #: members whose condition is the driving atom AND further threshold atoms: rule name ->
    #: those atoms (aggregate structure, its spec, the atom), checked on the group's pairs
    extras: dict[str, list[tuple[_Structure, AggSpec, Atom]]] = field(default_factory=dict)
    extra_tables: list[_ExtraTable] | None = None  # extras by (structure, aggregate), rebuilt with arrays

    def prepare(self) -> None:
        names = sorted(self.members, key=lambda n: self.uids[n])  # ascending uids: sorted pairs
        atoms = [self.members[n] for n in names]
        los = np.array([a.lo for a in atoms], np.float64)  # indexable atoms always have lo
        his = np.array([np.inf if a.hi is None else a.hi for a in atoms], np.float64)
        lo_strict = np.array([a.lo_strict for a in atoms], bool)
        hi_strict = np.array([a.hi_strict for a in atoms], bool)
        uids = np.array([self.uids[n] for n in names], np.int64)
        loosest = float(los.min())
        ls = bool(np.all(lo_strict[los == loosest]))
        if np.all(np.isfinite(his)):
            top = float(his.max())
            hi_arg: float | None = top
            hs = bool(np.all(hi_strict[his == top]))
        else:
            hi_arg, hs = None, True
        self.arrays = (names, los, his, lo_strict, hi_strict, uids, (loosest, ls, hi_arg, hs))
        order = np.argsort(uids)
        self._uid_sorted = uids[order]
        self._name_sorted = np.array(names, dtype=object)[order]
        self.extra_tables = _extra_tables(self.extras, self.uids)

    def name_of(self, uids: np.ndarray) -> np.ndarray:
        """Rule names (object array) of an array of rule uids of this group."""
        if self.arrays is None:
            self.prepare()
        return self._name_sorted[np.searchsorted(self._uid_sorted, uids)]


@dataclass
class Changes:
    """Result changes of one lookup: blocks of (rule names, key values) that entered / exited."""

    def __init__(self, as_of: int) -> None:
        self.as_of = as_of
        self.parts: list[tuple[np.ndarray, np.ndarray, str]] = []

    def add(self, names: np.ndarray, keys: np.ndarray, kind: str) -> None:
        if keys.shape[0]:
            self.parts.append((names, keys, kind))

    def rows(self) -> list[tuple[int, str, str, str]]:
        """(as_of, rule, key, kind) ordered by rule, then key (string order)."""
        items: list[tuple[str, str, str]] = []
        for names, keys, kind in self.parts:
            items.extend(zip(names.tolist(), keys.tolist(), [kind] * keys.shape[0], strict=True))
        items.sort()
        t = self.as_of
        return [(t, n, k, kind) for n, k, kind in items]

    def __len__(self) -> int:
        return sum(int(k.shape[0]) for _, k, _ in self.parts)


class Evaluator:
    """Long-lived evaluator of many rules over shared window state (see module docstring).

    ``history_ms``: how long raw batches are retained so that rules added later can build
    structures nobody had (PSoup); ``None`` retains as long as the longest window in use.

    ``pane_ms``: with a pane width g, structures serving time windows whose bounds are multiples
    of g are fed one row per (key, pane) instead of one per event (Golab et al. 2003's basic
    windows; rows with multiplicities, Arasu & Widom 2004 section 4.2): answers are identical
    to raw events for lookups at pane boundaries (``now`` a multiple of g). ROWS windows and
    windows that are not multiples of g keep structures fed with raw events.
    """

    def __init__(
        self,
        strategy: str = "shared",
        ci_p: int | None = None,
        history_ms: int | None = None,
        pane_ms: int | None = None,
    ) -> None:
        if strategy not in ("shared", "naive"):
            raise ValueError("strategy must be 'shared' or 'naive'")
        if ci_p is None:
            from tidewatch.settings import get_settings

            ci_p = get_settings().ci_p
        self.strategy = strategy
        self.ci_p = int(ci_p)
        self.history_ms = history_ms
        if pane_ms is not None and pane_ms <= 0:
            raise ValueError("pane_ms must be a positive number of milliseconds")
        self.pane_ms = pane_ms
        self.states: dict[tuple[str, str], _KeyState] = {}
        self.rules: dict[str, _Rule] = {}
        self.groups: dict[tuple[Any, ...], _Group] = {}
        self._uid = 0
        #: per stream, retained input in arrival order (raw columns and / or pane rows)
        self._history: dict[str, list[_Unit]] = {}
        self._max_ts: dict[str, int] = {}
        self._last_expire: int | None = None
        self.stats = {"events": 0, "lookups": 0, "candidates": 0, "post_checked": 0}

    # ------------------------------------------------------------ rules
    def add_rule(self, name: str, plan: Plan) -> None:
        """Register a rule; structures it needs and nobody had are filled from retained history."""
        if name in self.rules:
            raise ValueError(f"rule {name!r} already exists")
        st = self.states.get((plan.stream, plan.key))
        if st is None:
            st = _KeyState(plan.stream, plan.key, self.ci_p, self.pane_ms)
            self.states[(plan.stream, plan.key)] = st
            new_state = True
        else:
            new_state = False
        dom_raw = st.feed_raw(plan.domain_ms)
        expired = self._last_expire is not None  # rows older than the horizons in use may be gone
        needs_domain = plan.domain_ms is not None and (self.strategy == "naive" or not plan.driver)
        domain_fresh = needs_domain and not st.domain_live[dom_raw] and not new_state
        # the longest domain window read so far (only needed, and only scanned, when the
        # domain R-INT is live and may have been expired: no O(rules) scan per added rule)
        longer = (
            needs_domain
            and st.domain_live[dom_raw]
            and expired
            and plan.domain_ms is not None
            and plan.domain_ms
            > max(
                (
                    w
                    for n, w in st.domain_users.items()
                    if w is not None and st.domain_readers.get(n) == dom_raw
                ),
                default=0,
            )
        )
        st.domain_users[name] = plan.domain_ms
        st.domain_readers[name] = dom_raw
        if longer:
            # a longer domain window than the expired R-INT kept: rebuild it from history
            st.domains[dom_raw] = RInt(0)
            domain_fresh = True
        if needs_domain:
            st.domain_live[dom_raw] = True
        fresh: list[_Structure] = []

        def use(kind: str, pred: A.RowCond | None, attr: str, window: A.Window | int) -> _Structure:
            s, created = st.struct(kind, pred, attr, st.feed_raw(window))
            if created:
                fresh.append(s)
            elif expired and all(s is not f for f in fresh):
                h = s.horizon()
                if isinstance(window, A.RowsWindow):
                    # a ROWS window reads the key's last n events however old: a structure
                    # that time windows alone kept (and expired) lost them
                    longer = h is not None and h > 0
                else:
                    w = window.start_ms if isinstance(window, A.TimeWindow) else int(window)
                    longer = h is not None and w > h
                if longer:
                    # the structure was expired to a shorter horizon: rebuild it from history
                    s.obj = st.new_obj(s.kind, s.attr, s.raw)
                    fresh.append(s)
            if isinstance(window, A.RowsWindow):
                s.rows_users.add(name)
                s.users.setdefault(name, 0)
            else:
                w = window.start_ms if isinstance(window, A.TimeWindow) else int(window)
                s.users[name] = max(s.users.get(name, 0), w)
            return s

        def kind_of(a: AggSpec) -> str:
            kind = a.structure[0]
            if kind == "values" and a.func in ("FIRST", "LAST") and not st.feed_raw(a.window):
                return "firstlast"  # pane sums cannot give FIRST / LAST: the panes' own values
            return kind

        agg_structs = [use(kind_of(a), a.predicate, a.structure[2], a.window) for a in plan.aggs]
        index_structs: dict[int, _Structure] = {}
        if self.strategy == "shared":
            for i in plan.driver:
                atom = plan.atoms[i]
                assert atom.index is not None
                kind, _, attr = atom.index
                pred = plan.aggs[atom.agg_id].predicate  # type: ignore[index]
                index_structs[i] = use("ci_" + kind, pred, attr, atom.window_ms)
        self._uid += 1
        rule = _Rule(name, plan, self._uid, st, agg_structs, index_structs)
        self.rules[name] = rule
        if fresh or new_state or domain_fresh:
            self._replay(st, fresh, new_state, dom_raw if domain_fresh else None)
        extra = None if self.strategy != "shared" or plan.single_atom else _extra_atoms(plan)
        if self.strategy == "shared" and (plan.single_atom or extra is not None):
            atom = plan.atoms[plan.driver[0]]
            idx = index_structs[atom.id]
            gkey = (plan.stream, plan.key, idx.kind, A.row_text(idx.predicate), idx.attr, atom.window_ms)
            g = self.groups.get(gkey)
            if g is None:
                g = _Group(st, idx, agg_structs[atom.agg_id], idx.kind == "ci_sum", atom.window_ms)  # type: ignore[index]
                self.groups[gkey] = g
            g.members[name] = atom
            g.uids[name] = rule.uid
            if extra:
                g.extras[name] = [
                    (agg_structs[plan.agg_id(x)], plan.aggs[plan.agg_id(x)], a)
                    for a in extra
                    for x in (a.left if isinstance(a.left, A.Agg) else a.right,)
                    if isinstance(x, A.Agg)
                ]
            g.arrays = None
            rule.group = gkey

    def add_rules(self, rules: Iterable[tuple[str, Plan]]) -> None:
        """Register many rules; those reading value R-INTs first, so COUNTs can share them."""
        items = list(rules)
        items.sort(key=lambda r: 0 if any(a.structure[0] == "values" for a in r[1].aggs) else 1)
        for name, plan in items:
            self.add_rule(name, plan)

    def remove_rule(self, name: str) -> None:
        """Unregister a rule; structures nobody uses any more are dropped."""
        rule = self.rules.pop(name)
        st = rule.state
        st.domain_users.pop(name, None)
        st.domain_readers.pop(name, None)
        if rule.group is not None:
            g = self.groups[rule.group]
            g.members.pop(name)
            g.extras.pop(name, None)
            g.arrays = None
            uid = g.uids.pop(name)
            g.prev_pairs = g.prev_pairs[(g.prev_pairs >> _SHIFT) != uid]
            if not g.members:
                del self.groups[rule.group]
        for k, s in list(st.structs.items()):
            s.users.pop(name, None)
            s.rows_users.discard(name)
            if not s.users:
                del st.structs[k]
        if not st.domain_users:
            del self.states[(st.stream, st.key)]

    def _replay(
        self, st: _KeyState, fresh: list[_Structure], new_state: bool, domain_fresh: bool | None
    ) -> None:
        """PSoup: fill new structures (and a domain R-INT when it starts being read) from the
        retained history (``domain_fresh``: the feed of that domain R-INT, None: none)."""
        if new_state:
            raw_s = pane_s = None  # every structure, and the live domains
            raw_d = pane_d = None
        else:
            raw_s = [s for s in fresh if s.raw]
            pane_s = [s for s in fresh if not s.raw]
            raw_d = domain_fresh is True
            pane_d = domain_fresh is False
        g = self.pane_ms or 1
        for unit in self._history.get(st.stream, []):
            cols = unit.raw
            rows = unit.rows.get(st.key)
            if cols is not None and (raw_s is None or raw_s or raw_d):
                st.apply(BatchView(st.stream, cols), raw_s, domain=raw_d)
            if self.pane_ms is None or not (pane_s is None or pane_s or pane_d):
                continue
            todo = st.pane_structs() if pane_s is None else pane_s
            dom = pane_d if pane_d is not None else st.domain_live[False]
            if rows is None and cols is None:
                continue
            if rows is None:
                assert cols is not None
                rows = aggregate(cols, self._spec(st, BatchView(st.stream, cols), todo), g)
                st.apply_panes(rows, todo, domain=dom)
                continue
            missing = st.apply_panes(rows, todo, domain=dom)
            if missing and cols is not None:
                view = BatchView(st.stream, cols)
                st.apply_panes(aggregate(cols, self._spec(st, view, missing), g), missing, False)
            elif missing:
                self.stats["backfill_missing"] = self.stats.get("backfill_missing", 0) + len(missing)

    # ------------------------------------------------------------ events
    @staticmethod
    def _sorted_cols(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Columns of a batch sorted by ts (stable), ts as int64; None when empty."""
        ts = np.asarray(batch["ts"], dtype=np.int64)
        n = ts.shape[0]
        if n == 0:
            return None
        if n > 1 and np.any(ts[1:] < ts[:-1]):
            order = np.argsort(ts, kind="stable")
            cols = {k: np.asarray(v)[order] for k, v in batch.items()}
        else:
            cols = {k: np.asarray(v) for k, v in batch.items()}
        cols["ts"] = np.asarray(cols["ts"], dtype=np.int64)
        return cols

    def apply(
        self,
        stream: str,
        batch: dict[str, np.ndarray],
        factorized: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        """Apply one micro-batch of a stream (columns of equal length; any order within it).

        With panes, the batch is also pre-aggregated into (key, pane) rows
        (:func:`engine.evaluation.panes.aggregate`) for the pane-fed structures. ``factorized``: string
        columns already factorized over a larger input, field -> (codes of the batch's rows,
        the input's uniques), e.g. the backtest's whole file (saves hashing strings per batch)."""
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        ts_in = np.asarray(batch["ts"], dtype=np.int64)
        cols = self._sorted_cols(batch)
        if cols is None:
            return
        pre = factorized
        if pre and ts_in.shape[0] > 1 and np.any(ts_in[1:] < ts_in[:-1]):
            order = np.argsort(ts_in, kind="stable")
            pre = {k: (np.asarray(c)[order], u) for k, (c, u) in pre.items()}
        view = BatchView(stream, cols, pre)
        for st in self.states.values():
            if st.stream != stream:
                continue
            if pre and st.key in pre:  # keys factorized over the whole input: its domain size
                st.key_hint = max(st.key_hint, len(pre[st.key][1]))
            st.apply(view)
            if self.pane_ms is not None:
                todo = st.pane_structs()
                if todo or st.domain_live[False]:
                    first, last = pane_of(cols["ts"][[0, -1]], self.pane_ms)
                    if first == last:  # one pane (the backtest, the engine): group by key only
                        rows, ids = st.one_pane_rows(view, todo, int(last))
                        st.apply_panes(rows, todo, domain=st.domain_live[False], ids=ids)
                    else:
                        rows = aggregate(cols, self._spec(st, view, todo), self.pane_ms)
                        st.apply_panes(rows, todo, domain=st.domain_live[False])
        self._note(stream, cols, int(cols["ts"][0]), int(cols["ts"][-1]))
        self._retain(stream, _Unit(cols))

    def apply_panes(
        self, stream: str, rows: PaneRows, key: str | None = None, raw: dict[str, np.ndarray] | None = None
    ) -> None:
        """Apply (key, pane) rows built with :meth:`pane_spec` (e.g. by Spark) to the pane-fed
        structures of ``(stream, key)`` (``key`` may be omitted when the stream has one key field
        in use); rows of keys whose events were already applied must have later panes.

        ``raw``: the same events, raw -- required when ``pane_spec(...).needs_raw``; it feeds the
        raw-fed structures of that key field and is retained for rules added later (PSoup:
        without it, structures for predicates no column set aggregates cannot be backfilled).
        Results equal applying the raw events for lookups at pane boundaries."""
        if self.pane_ms is None:
            raise ValueError("apply_panes needs an Evaluator(pane_ms=...)")
        st = self._state_of(stream, key)
        if st is None:
            return
        raw_cols = None if raw is None else self._sorted_cols(raw)
        if raw_cols is not None:
            st.apply(BatchView(stream, raw_cols))
        st.apply_panes(rows)
        if len(rows):
            pane = np.asarray(rows.pane, np.int64)
            self._note(stream, None, int(pane.min()), int(pane.max()), n=int(np.asarray(rows.total).sum()))
            hist = self._history.get(stream)
            last = hist[-1] if hist else None
            if raw is not None and last is not None and last.source is raw and st.key not in last.rows:
                last.rows[st.key] = rows  # another key field's rows of the same batch
            else:
                self._retain(stream, _Unit(raw_cols, {st.key: rows}, raw))

    def _state_of(self, stream: str, key: str | None) -> _KeyState | None:
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        if key is not None:
            return self.states.get((stream, key))
        mine = [st for st in self.states.values() if st.stream == stream]
        if len(mine) > 1:
            raise ValueError(f"rules use several key fields of {stream}: give key=")
        return mine[0] if mine else None

    def _note(
        self, stream: str, cols: dict[str, np.ndarray] | None, lo: int, hi: int, n: int | None = None
    ) -> None:
        self.stats["events"] += int(cols["ts"].shape[0]) if cols is not None else int(n or 0)
        self._max_ts[stream] = max(self._max_ts.get(stream, lo), hi)

    def _spec(
        self, st: _KeyState, view: BatchView | None, structs: Iterable[_Structure] | None = None
    ) -> PaneSpec:
        """The pane spec of the given pane-fed structures of ``st`` (default: all of them);
        predicates read the masks cached in ``view`` when given its columns."""
        sets = []
        stream = st.stream

        def mask_fn(pred: A.RowCond) -> Any:
            def f(cols: Any) -> np.ndarray:
                if view is not None and cols is view.cols:
                    return view.mask(pred)  # type: ignore[return-value]
                return BatchView(stream, dict(cols)).mask(pred)  # type: ignore[return-value]

            return f

        for pred, need in st.column_sets(structs):
            sets.append(
                ColumnSet(
                    _set_name(pred),
                    None if pred is None else mask_fn(pred),
                    sums=tuple(sorted(need["sums"])),
                    minmax=tuple(sorted(need["minmax"])),
                    firstlast=tuple(sorted(need["firstlast"])),
                    distinct=tuple(sorted(need["distinct"])),
                )
            )
        needs_raw = any(s.raw for s in st.structs.values()) or st.domain_live[True]
        return EvalPaneSpec(st.key, tuple(sets), needs_raw=needs_raw, pane_ms=self.pane_ms or 0)

    def pane_specs(self, stream: str) -> list[EvalPaneSpec]:
        """One :class:`EvalPaneSpec` per key field of ``stream`` in use (see :meth:`pane_spec`)."""
        return [self._spec(st, None) for st in self.states.values() if st.stream == stream]  # type: ignore[misc]

    def pane_spec(self, stream: str, key: str | None = None) -> EvalPaneSpec:
        """What to pre-aggregate per (key, pane) for ``stream`` (``key``: the key field, may be
        omitted when the rules use one): one column set per distinct predicate (WHERE AND
        FILTER) of a pane-fed structure, named by the predicate's text ("all": none), with the
        fields it SUMs, MIN/MAXes, FIRST/LASTs and COUNT-DISTINCTs. ``needs_raw``: some rule
        reads a ROWS window or a window that is not a multiple of the pane width, so the raw
        events must be given too (``apply_panes(..., raw=...)``). The spec changes when rules
        are added or removed: ask again after each change."""
        if self.pane_ms is None:
            raise ValueError("pane_spec needs an Evaluator(pane_ms=...)")
        st = self._state_of(stream, key)
        if st is None:
            raise KeyError(f"no rule reads {stream}" + (f" by {key}" if key else ""))
        return self._spec(st, None)  # type: ignore[return-value]

    def _retention(self, stream: str) -> int | None:
        """How far back raw batches are kept (None: everything, a ROWS window is in use)."""
        if self.history_ms is not None:
            return self.history_ms
        longest = 0
        for st in self.states.values():
            if st.stream != stream:
                continue
            for s in st.structs.values():
                h = s.horizon()
                if h is None:
                    return None
                longest = max(longest, h)
        return longest

    def _retain(self, stream: str, unit: _Unit) -> None:
        hist = self._history.setdefault(stream, [])
        if hist:
            hist[-1].source = None  # only the newest unit can be joined
        hist.append(unit)
        keep = self._retention(stream)
        if keep is None:
            return
        cutoff = self._max_ts[stream] - keep
        while hist and hist[0].max_ts() <= cutoff:
            hist.pop(0)

    def expire(self, now: int) -> None:
        """Drop rows no window in use can read any more (windows end at ``now`` or later)."""
        for st in self.states.values():
            for feed, dom_rint in st.domains.items():
                dom = [
                    w
                    for n, w in st.domain_users.items()
                    if w is not None and st.domain_readers.get(n, True) == feed
                ]
                if dom and st.domain_live[feed]:
                    dom_rint.expire(now - max(dom))
            for s in st.structs.values():
                h = s.horizon()
                if h is not None and h > 0:
                    s.obj.expire(now - h)

    def _maybe_expire(self, now: int) -> None:
        longest = 0
        for st in self.states.values():
            for s in st.structs.values():
                longest = max(longest, s.horizon() or 0)
        every = max(1000, longest // 8)
        if self._last_expire is None or now - self._last_expire >= every:
            self.expire(now)
            self._last_expire = now

    # ------------------------------------------------------------ lookups
    def step(self, now: int) -> Changes:
        """Look every rule up at ``now`` (all events with ts <= now applied) and return the
        changes of each rule's result since its previous lookup."""
        self.stats["lookups"] += 1
        ctx = _Lookup(self, now)
        changes = Changes(now)
        for g in self.groups.values():
            self._lookup_group(g, now, changes)
        for rule in self.rules.values():
            if rule.group is not None:
                continue
            cur = ctx.evaluate(rule)
            enter = sorted_diff(cur, rule.prev)
            exit_ = sorted_diff(rule.prev, cur)
            for ids, kind in ((enter, "ENTER"), (exit_, "EXIT")):
                if ids.shape[0]:
                    changes.add(
                        np.full(ids.shape[0], rule.name, dtype=object), rule.state.key_values(ids), kind
                    )
            rule.prev = cur
        self._maybe_expire(now)
        return changes

    def _lookup_group(self, g: _Group, now: int, changes: Changes) -> None:
        """One index lookup at the group's loosest range, one exact pass, per-rule ranges by bisection."""
        if g.arrays is None:
            g.prepare()
        assert g.arrays is not None
        names, los, his, lo_strict, hi_strict, uids, (loosest_lo, ls, hi_arg, hs) = g.arrays
        cand = g.index.obj.candidates(g.T, now, loosest_lo, hi_arg, ls, hs)
        self.stats["candidates"] += int(cand.shape[0])
        self.stats["post_checked"] += int(cand.shape[0])
        if cand.shape[0]:
            cnt, sums = g.exact.obj.window(cand, now - g.T, now)
            vals = np.ascontiguousarray(sums[:, 0]) if g.sum_kind else cnt.astype(np.float64)
            cand = np.ascontiguousarray(cand, dtype=np.int64)
        else:
            vals = np.zeros(0, np.float64)
            cand = _EMPTY
        if not g.extras:
            pairs, enter, exit_ = _group_pass(cand, vals, los, his, lo_strict, hi_strict, uids, g.prev_pairs)
        else:
            # members "driver AND more atoms": their pairs that fail an extra atom are dropped
            pairs = _group_pass(cand, vals, los, his, lo_strict, hi_strict, uids, _EMPTY)[0]
            if pairs.shape[0]:
                ctx = _Lookup(self, now)
                uid_of, key_of = pairs >> _SHIFT, pairs & np.int64(0xFFFFFFFF)
                drop = [d for t in g.extra_tables or [] if (d := t.check(ctx, uid_of, key_of)) is not None]
                if drop:
                    pairs = np.delete(pairs, np.concatenate(drop))
            pairs, enter, exit_ = _pair_diff(np.ascontiguousarray(pairs), g.prev_pairs)
        g.prev_pairs = pairs
        for arr, kind in ((enter, "ENTER"), (exit_, "EXIT")):
            if arr.shape[0]:
                names = g.name_of(arr >> _SHIFT)
                changes.add(names, g.state.key_values(arr & np.int64(0xFFFFFFFF)), kind)

    def lookup(self, now: int) -> dict[str, set[str]]:
        """Current result set of every rule at ``now`` (as key values); advances the change state."""
        self.step(now)
        ids: dict[str, np.ndarray] = {}
        for g in self.groups.values():
            by_uid = {u: n for n, u in g.uids.items()}
            pairs = g.prev_pairs
            bounds = np.flatnonzero(np.diff(pairs >> _SHIFT)) + 1
            for chunk in np.split(pairs, bounds) if pairs.size else []:
                ids[by_uid[int(chunk[0] >> _SHIFT)]] = chunk & np.int64(0xFFFFFFFF)
        out: dict[str, set[str]] = {}
        for name, rule in self.rules.items():
            cur = rule.prev if rule.group is None else ids.get(name, _EMPTY)
            out[name] = set(rule.state.interner.keys(cur))
        return out

    def current_ids(self, name: str) -> list[str]:
        """The rule's result at its last lookup, as key values."""
        rule = self.rules[name]
        if rule.group is not None:
            g = self.groups[rule.group]
            uid = g.uids[name]
            ids = g.prev_pairs[(g.prev_pairs >> _SHIFT) == uid] & np.int64(0xFFFFFFFF)
        else:
            ids = rule.prev
        return rule.state.interner.keys(ids)

    def evaluate_now(self, name: str, now: int) -> set[str]:
        """PSoup: the rule's result at ``now`` from the state held, without touching change state."""
        rule = self.rules[name]
        return set(rule.state.interner.keys(_Lookup(self, now).evaluate(rule)))

    def values(
        self, name: str, keys: Iterable[str], now: int
    ) -> dict[str, dict[str, float | int | str | None]]:
        """The aggregates rule ``name`` compares, per key at ``now`` (the values that made an
        alert fire): ``{key: {aggregate text: value}}`` with COUNT / COUNT DISTINCT as int, other
        aggregates as float and NULL (e.g. AVG of an empty window) as None. Reads the state as
        it is, so call it right after the lookup at ``now``, before further events are applied;
        keys never seen get the values of an empty window."""
        return self.values_many({name: list(keys)}, now)[name]

    def values_many(
        self, wanted: dict[str, list[str]], now: int
    ) -> dict[str, dict[str, dict[str, float | int | str | None]]]:
        """:meth:`values` of many rules at once: ``{rule: {key: {aggregate text: value}}}``.

        Rules reading the same aggregate (structure, function, window) share one computation
        over the union of their keys -- thousands of rules firing at one lookup cost one
        structure read per distinct aggregate, not one per rule."""
        ctx = _Lookup(self, now)
        reqs: list[tuple[_Rule, list[str]]] = []
        # aggregate signature -> (structure, spec, [(request, atom position)], [key ids])
        sigs: dict[tuple[Any, ...], tuple[_Structure, AggSpec, list[tuple[int, int]], list[np.ndarray]]] = {}
        for name, keys in wanted.items():
            rule = self.rules[name]
            st = rule.state
            n_ids = len(st.interner)
            ids = np.fromiter((st._ids.get(k, n_ids) for k in keys), np.int64, len(keys))
            for j, spec in enumerate(rule.plan.aggs):
                s = rule.agg_structs[spec.id]
                ent = sigs.setdefault((id(s), spec.func, spec.window), (s, spec, [], []))
                ent[2].append((len(reqs), j))
                ent[3].append(ids)
            reqs.append((rule, keys))
        # one structure read, one gather and one conversion to Python values per signature,
        # then each rule's column is a slice of that list (no per-rule NumPy calls)
        cols: list[list[list[Any]]] = [[[] for _ in rule.plan.aggs] for rule, _ in reqs]
        for s, spec, members, lists in sigs.values():
            allids = np.concatenate(lists)
            u, inv = np.unique(allids, return_inverse=True)
            v = ctx._agg(spec, s, u) if u.shape[0] else np.zeros(0)
            x = np.asarray(v, np.float64)[inv.reshape(-1)]
            nan = np.isnan(x)
            integral = spec.func in ("COUNT", "DISTINCT")  # COUNTs as int
            if nan.any():  # NULL (e.g. AVG of an empty window) as None
                o = (np.where(nan, 0, x).astype(np.int64) if integral else x).astype(object)
                o[nan] = None
                flat = o.tolist()
            else:
                flat = x.astype(np.int64).tolist() if integral else x.tolist()
            pos = 0
            for (ri, j), ids in zip(members, lists, strict=True):
                n = ids.shape[0]
                cols[ri][j] = flat[pos : pos + n]
                pos += n
        out: dict[str, dict[str, dict[str, float | int | str | None]]] = {}
        for (rule, keys), rc in zip(reqs, cols, strict=True):
            texts = [spec.text for spec in rule.plan.aggs]
            rows = zip(*rc, strict=True) if rc else ((),) * len(keys)
            out[rule.name] = {
                k: dict(zip(texts, row, strict=True)) for k, row in zip(keys, rows, strict=True)
            }
        return out

    @property
    def nbytes(self) -> int:
        """Bytes held by every shared structure and index."""
        n = 0
        for st in self.states.values():
            n += sum(d.nbytes for d in st.domains.values()) + st.interner.nbytes
            n += sum(int(s.obj.nbytes) for s in st.structs.values())
        return n

    def structure_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for st in self.states.values():
            for s in st.structs.values():
                out[s.kind] = out.get(s.kind, 0) + 1
        return out


# ---------------------------------------------------------------- one lookup
class _Lookup:
    """Evaluation of rules at one ``now``: aggregates over key arrays, the NNF condition."""

    def __init__(self, ev: Evaluator, now: int) -> None:
        self.ev = ev
        self.now = now
        self._domains: dict[tuple[int, int | None], np.ndarray] = {}

    def domain(self, st: _KeyState, W: int | None) -> np.ndarray:
        """Key ids with >= 1 event (before WHERE) in (now - W, now]; every key seen if W is None."""
        k = (id(st), W)
        d = self._domains.get(k)
        if d is None:
            K = len(st.interner)
            allk = np.arange(K, dtype=np.int64)
            if W is None:
                d = allk
            else:
                cnt, _ = st.domains[st.feed_raw(W)].window(allk, self.now - W, self.now)
                d = allk[cnt > 0]
            self._domains[k] = d
        return d

    def evaluate(self, rule: _Rule) -> np.ndarray:
        """Sorted key ids satisfying the rule at now."""
        plan = rule.plan
        proven = _EMPTY
        if self.ev.strategy == "shared" and plan.driver:
            # a key the index proves in a driving atom that is the condition itself or one of its
            # top-level disjuncts satisfies the rule: only the other candidates are post-checked
            top = [plan.cond] if plan.cond[0] == "atom" else plan.cond[1] if plan.cond[0] == "or" else []
            direct = {n[1] for n in top if n[0] == "atom"}
            cands, sure = [], []
            for i in plan.driver:
                a = plan.atoms[i]
                c, s = rule.index_structs[i].obj.lookup(
                    a.window_ms, self.now, a.lo, a.hi, a.lo_strict, a.hi_strict
                )
                cands.append(c)
                if i in direct and s.any():
                    sure.append(c[s])
            keys = cands[0] if len(cands) == 1 else np.unique(np.concatenate(cands))
            keys = np.sort(keys)
            if sure:
                proven = np.unique(np.concatenate(sure))
                keys = sorted_diff(keys, proven)
            # no domain check: a key satisfying the rule satisfies a driving atom, so it has an
            # event in that atom's window, which lies inside (now - W, now]
            self.ev.stats["candidates"] += int(keys.shape[0] + proven.shape[0])
        else:
            keys = self.domain(rule.state, plan.domain_ms)
        if keys.shape[0] == 0:
            return proven
        self.ev.stats["post_checked"] += int(keys.shape[0])
        memo: dict[int, np.ndarray] = {}
        ok = self._cond(plan.cond, rule, keys, memo)
        if proven.shape[0] == 0:
            return keys[ok]
        return np.union1d(keys[ok], proven)

    # --- the condition, vectorized over keys
    def _cond(self, n: Any, rule: _Rule, keys: np.ndarray, memo: dict[int, np.ndarray]) -> np.ndarray:
        if n[0] == "atom":
            return self._atom(rule.plan.atoms[n[1]], rule, keys, memo)
        parts = n[1]
        if n[0] == "and":
            out = self._cond(parts[0], rule, keys, memo)
            for p in parts[1:]:
                if not out.any():
                    break
                out = out & self._cond(p, rule, keys, memo)
            return out
        out = self._cond(parts[0], rule, keys, memo)
        for p in parts[1:]:
            if out.all():
                break
            out = out | self._cond(p, rule, keys, memo)
        return out

    def _atom(self, a: Atom, rule: _Rule, keys: np.ndarray, memo: dict[int, np.ndarray]) -> np.ndarray:
        left = self._expr(a.left, rule, keys, memo)
        right = self._expr(a.right, rule, keys, memo)
        with np.errstate(invalid="ignore"):
            r = _compare(left, a.op, right)
            if a.op == "!=":
                r = r & ~np.isnan(left) & ~np.isnan(right)
        r = np.broadcast_to(np.asarray(r, dtype=bool), keys.shape)
        return ~r if a.negated else r.copy()

    def _expr(self, e: A.Expr, rule: _Rule, keys: np.ndarray, memo: dict[int, np.ndarray]) -> Any:
        if isinstance(e, A.Num):
            return np.float64(e.value)
        if isinstance(e, A.Agg):
            i = rule.plan.agg_id(e)
            v = memo.get(i)
            if v is None:
                v = self._agg(rule.plan.aggs[i], rule.agg_structs[i], keys)
                memo[i] = v
            return v
        if isinstance(e, A.Neg):
            return -self._expr(e.operand, rule, keys, memo)
        if isinstance(e, A.BinOp):
            x = self._expr(e.left, rule, keys, memo)
            y = self._expr(e.right, rule, keys, memo)
            with np.errstate(all="ignore"):
                if e.op == "+":
                    return x + y
                if e.op == "-":
                    return x - y
                if e.op == "*":
                    return x * y
                y = np.asarray(y, dtype=np.float64)
                return np.where(y == 0, np.nan, np.asarray(x, dtype=np.float64) / np.where(y == 0, 1.0, y))
        raise TypeError(e)

    def _agg(self, spec: AggSpec, s: _Structure, keys: np.ndarray) -> np.ndarray:
        w = spec.window
        obj = s.obj
        rows = isinstance(w, A.RowsWindow)
        if not rows:
            lo, hi = self.now - w.start_ms, self.now - w.end_ms  # type: ignore[union-attr]
        f = spec.func
        if f == "COUNT":
            cnt, _ = obj.rows(keys, w.n) if rows else obj.window(keys, lo, hi)  # type: ignore[union-attr]
            return cnt.astype(np.float64)
        if f in ("SUM", "AVG"):
            cnt, sums = obj.rows(keys, w.n) if rows else obj.window(keys, lo, hi)  # type: ignore[union-attr]
            tot = sums[:, 0].astype(np.float64)
            if f == "SUM":
                return tot
            with np.errstate(all="ignore"):
                return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)
        if f in ("FIRST", "LAST"):
            col = s.first_col if f == "FIRST" else s.last_col
            first, last = obj.first_last_rows(keys, w.n, col) if rows else obj.first_last(keys, lo, hi, col)  # type: ignore[union-attr]
            return first if f == "FIRST" else last
        if f in ("MIN", "MAX"):
            mn, mx = obj.rows(keys, w.n) if rows else obj.window(keys, lo, hi)  # type: ignore[union-attr]
            return mn if f == "MIN" else mx
        if f == "DISTINCT":
            d = obj.rows(keys, w.n) if rows else obj.window(keys, lo, hi)  # type: ignore[union-attr]
            return np.asarray(d, dtype=np.float64)
        raise ValueError(f)
