"""The evaluator's shared window state, per (stream, key field): never per rule.

State is shared (Arasu & Widom 2004, sections 3-4): a :class:`KeyState` per (stream, key
field) holds

* the key interner and a domain R-INT of every event (before WHERE), for the key domain of
  RULES.md;
* per (predicate = WHERE AND FILTER, attribute, kind) one :class:`Structure` -- R-INT counts,
  R-INT running sums and values (SUM/AVG/FIRST/LAST), MIN/MAX, COUNT DISTINCT -- serving every
  rule that needs it;
* per (predicate, attribute) one collective index, CI-COUNT (section 4.1, Figure 7) or CI-SUM
  (section 4.2), serving every indexable atom on it (any window, any threshold).

With a pane width g, structures of time windows that are multiples of g are fed one row per
(key, pane) -- Golab et al. 2003's basic windows, as multiplicities (section 4.2) -- built here
from a batch (:meth:`KeyState.one_pane_rows`) or given as :class:`engine.evaluation.panes.PaneRows`;
the others are fed raw events.  Which rules use a structure, and over which windows, decides
how far it may expire (:meth:`Structure.horizon`, and :meth:`Structure.rows_keep` rows per key
for ROWS windows: :meth:`Structure.expire`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from engine.algorithms import CICount, CISum, DistinctCount, KeyInterner, MinMax, RInt
from engine.algorithms.fixed128 import exact_group_sums
from engine.evaluation.batches import BatchView
from engine.evaluation.panes import PaneAggregates, PaneRows, SharedKeyIds
from subscriptions import rule_ast as A
from tidewatch.schema import STREAMS


@dataclass
class Structure:
    """One shared per-key structure and the rules / windows that use it.

    ``raw``: fed with raw events (always so without panes; with panes only when a window it
    serves is a ROWS window or not a multiple of the pane width), else fed with pane rows."""

    kind: str  # count | values | firstlast | minmax | distinct | ci_count | ci_sum
    predicate: A.RowCond | None
    attr: str  # "*" or field name
    obj: Any
    raw: bool = True
    users: dict[str, int] = field(default_factory=dict)  # rule name -> longest time window it needs
    rows_n: dict[str, int] = field(default_factory=dict)  # rule name -> its longest ROWS window

    def horizon(self) -> int:
        """Longest time window in use (0: only ROWS windows read the structure)."""
        return max(self.users.values(), default=0)

    def rows_keep(self) -> int | None:
        """Rows per key a ROWS window in use can read: the largest n of the ``LAST n ROWS``
        windows reading the structure (None: no ROWS window reads it)."""
        return max(self.rows_n.values()) if self.rows_n else None

    def expire(self, now: int) -> None:
        """Drop the rows no window in use can read any more (windows end at ``now`` or later):
        rows older than the longest time window, except, while ROWS windows read the
        structure, each key's newest :meth:`rows_keep` rows (Arasu & Widom 2004, section 2: a
        tuple-based window ``S_k[N, 0]`` of substream k holds its last N tuples, so a row older
        than its key's newest N_max is never read again; section 3.2)."""
        h = self.horizon()
        n = self.rows_keep()
        if n is not None:
            self.obj.expire(now - h, keep_rows=n)
        elif h > 0:
            self.obj.expire(now - h)

    @property
    def first_col(self) -> int:
        """Value column of the R-INT read for FIRST (pane-fed ``firstlast``: the pane's first)."""
        return 0

    @property
    def last_col(self) -> int:
        """Value column of the R-INT read for LAST (pane-fed ``firstlast``: the pane's last)."""
        return 1 if self.kind == "firstlast" else 0


def set_name(predicate: A.RowCond | None) -> str:
    """Name of the pane column set of a predicate ("all" without one)."""
    return "all" if predicate is None else A.row_text(predicate)


class KeyState:
    """Everything held for one (stream, key field): interner, domain R-INTs, structures, indexes.

    With panes (``pane_ms``), structures come in two feeds (see :class:`Structure`) and so
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
        self.structs: dict[tuple[str, str, str, bool], Structure] = {}
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
    ) -> tuple[Structure, bool]:
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
        s = Structure(kind, predicate, attr, self.new_obj(kind, attr, raw), raw)
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

    def row_ids(self, rows: PaneRows) -> np.ndarray:
        """The key id of each of ``rows``' keys, new keys interned in first-seen order: by
        ``rows.key_codes`` (once per distinct key) and ``rows.key_global`` (once per key per cut)
        where the rows carry them, else by hashing the keys."""
        kc = rows.key_codes
        if kc is None:
            return self.ids_of(rows.keys)
        if rows.key_global is not None:
            return self._shared_ids(kc, *rows.key_global)
        return self._intern(*kc)

    def _shared_ids(
        self, kc: tuple[np.ndarray, np.ndarray], present: np.ndarray, shared: SharedKeyIds
    ) -> np.ndarray:
        """:meth:`_intern` of ``kc`` (codes, uniques) through the ids of the cut's keys the
        earlier parts interned (``present``: each unique's position among them): only the keys
        this key state has not looked up in this cut go through the dictionary (new ones in
        first-seen order, as :meth:`_intern` gives them)."""
        codes, uniques = kc
        if shared.owner is None:
            shared.owner = self
        elif shared.owner is not self:  # another key state's ids: not ours to read
            return self._intern(codes, uniques)
        return self._cached_ids(shared.ids, present, uniques)[codes]

    def _cached_ids(self, cache: np.ndarray, present: np.ndarray, uniques: np.ndarray) -> np.ndarray:
        """The ids of ``uniques``, the keys at positions ``present`` of an array whose ids
        ``cache`` holds (-1: not looked up yet); the missing ones interned (:meth:`_intern`, in
        the order of ``uniques``) and filled into ``cache``."""
        ids = cache[present]
        miss = np.flatnonzero(ids < 0)
        if miss.shape[0]:
            got = self._intern(np.arange(miss.shape[0], dtype=np.int64), uniques[miss])
            ids[miss] = got
            cache[present[miss]] = got
        return ids

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
        return codes, self._cached_ids(cache[1], present, uniques)

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
        self, batch: BatchView, structs: Iterable[Structure] | None = None, domain: bool | None = None
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
    def pane_structs(self) -> list[Structure]:
        return [s for s in self.structs.values() if not s.raw]

    def column_sets(
        self, structs: Iterable[Structure] | None = None
    ) -> list[tuple[A.RowCond | None, dict[str, set[str]]]]:
        """(predicate, {"sums"|"minmax"|"firstlast"|"distinct": fields}) of the pane-fed structures."""
        out: dict[str, tuple[A.RowCond | None, dict[str, set[str]]]] = {}
        for s in self.pane_structs() if structs is None else structs:
            name = set_name(s.predicate)
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

    def _reserve(self, s: Structure) -> None:
        """Capacity hint for collective indexes that take one (``reserve_keys``): room for every
        key id interned so far, so key growth does not re-copy their slot tables batch by batch."""
        reserve = getattr(s.obj, "reserve_keys", None)
        if reserve is not None:
            reserve(max(len(self.interner), self.key_hint))

    def one_pane_rows(
        self, batch: BatchView, structs: list[Structure], pane: int
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
            sets[set_name(pred)] = agg
        total = np.bincount(codes, minlength=K).astype(np.int64)
        rows = PaneRows(keys=uniques, pane=np.full(K, pane, np.int64), total=total, sets=sets)
        return rows, ids

    def apply_panes(
        self,
        rows: PaneRows,
        structs: Iterable[Structure] | None = None,
        domain: bool | None = None,
        ids: np.ndarray | None = None,
    ) -> list[Structure]:
        """Apply (key, pane) rows to every pane-fed structure (or the given ones) and, when
        ``domain`` (default: all structures and the pane domain R-INT is live), to the pane
        domain R-INT. Each row stands for its pane's events at ``ts = pane`` (its end), with
        multiplicities (Arasu & Widom 2004, section 4.2). Returns the structures whose column
        set was missing from ``rows`` (left untouched)."""
        if len(rows) == 0:
            return []
        if ids is None:
            ids = self.row_ids(rows)
        ts = np.asarray(rows.pane, dtype=np.int64)
        if domain is None:
            domain = structs is None and self.domain_live[False]
        if domain:
            tot = np.asarray(rows.total, dtype=np.int64)
            live = tot > 0
            self.domains[False].append(ids[live], ts[live], mult=tot[live])
        missing: list[Structure] = []
        for s in self.pane_structs() if structs is None else structs:
            self._reserve(s)
            agg = rows.sets.get(set_name(s.predicate))
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
