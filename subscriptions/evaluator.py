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
together (one index lookup at the loosest threshold, one exact pass, per-rule ranges by binary
search).  ``strategy="naive"`` evaluates every rule, one by one, on every key of its key domain
from the same per-key structures, with no collective index.  Both give identical answers.

Batches are dicts of NumPy columns (one micro-batch); within a batch rows may come in any order,
across batches each key's timestamps must not decrease.  New rules are evaluated against the
state already held (PSoup, Chandrasekaran & Franklin 2002): structures a new rule needs that do
not exist yet are built from the retained history of raw batches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from engine.algorithms import CICount, CISum, DistinctCount, KeyInterner, MinMax, RInt
from subscriptions import ast as A
from subscriptions.compiler import AggSpec, Atom, Plan
from subscriptions.schema import STREAMS

_EMPTY = np.zeros(0, np.int64)
_SHIFT = np.int64(32)  # (rule uid << 32) | key id encodes a (rule, key) pair


# ---------------------------------------------------------------- batches and predicates
class BatchView:
    """A micro-batch of one stream with per-batch caches (factorized strings, predicate masks)."""

    def __init__(self, stream: str, cols: dict[str, np.ndarray]) -> None:
        self.stream = stream
        self.cols = cols
        self.n = int(np.asarray(cols["ts"]).shape[0])
        self._fact: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._masks: dict[str, np.ndarray] = {}

    def factorized(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(codes, uniques) of a column (hash-based, one pass)."""
        f = self._fact.get(name)
        if f is None:
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
    """One shared per-key structure and the rules / windows that use it."""

    kind: str  # count | values | minmax | distinct | ci_count | ci_sum
    predicate: A.RowCond | None
    attr: str  # "*" or field name
    obj: Any
    users: dict[str, int] = field(default_factory=dict)  # rule name -> longest time window it needs
    rows_users: set[str] = field(default_factory=set)  # rules reading ROWS windows (no expiry)

    def horizon(self) -> int | None:
        """Longest time window in use (None: must not expire, a ROWS window reads it)."""
        if self.rows_users:
            return None
        return max(self.users.values(), default=0)


class _KeyState:
    """Everything held for one (stream, key field): interner, domain R-INT, structures, indexes."""

    def __init__(self, stream: str, key: str, ci_p: int) -> None:
        self.stream = stream
        self.key = key
        self.ci_p = ci_p
        self.interner = KeyInterner()
        self.domain = RInt(0)  # every event (before WHERE), for key domains
        #: the domain R-INT is kept only while a rule reads it (naive, or a rule without a driver:
        #: an index-driven rule's answer lies inside its key domain by construction)
        self.domain_live = False
        self.domain_users: dict[str, int | None] = {}
        self.structs: dict[tuple[str, str, str], _Structure] = {}
        self.value_ids: dict[str, KeyInterner] = {}  # per string field, for COUNT DISTINCT
        self._ids: dict[Any, int] = {}  # key value -> id (mirror of the interner, for fast lookups)
        self._key_arr = np.zeros(0, dtype=object)  # id -> key value (capacity doubles)
        self._key_n = 0

    def struct(self, kind: str, predicate: A.RowCond | None, attr: str) -> tuple[_Structure, bool]:
        """The shared structure for (kind, predicate, attribute), created when missing.

        COUNT is served by an existing R-INT of values under the same predicate when there is
        one (its count column holds the same rows), so one R-INT serves COUNT and SUM alike."""
        pred = A.row_text(predicate)
        k = (kind, pred, attr)
        s = self.structs.get(k)
        if s is not None:
            return s, False
        if kind == "count":
            for (kind2, pred2, _), s2 in self.structs.items():
                if kind2 == "values" and pred2 == pred:
                    return s2, False
        obj: Any
        if kind == "count":
            obj = RInt(0)
        elif kind == "values":
            obj = RInt(1)
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
        s = _Structure(kind, predicate, attr, obj)
        self.structs[k] = s
        return s, True

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

    def key_ids(self, batch: BatchView) -> np.ndarray:
        codes, uniques = batch.factorized(self.key)
        if batch.n == 0:
            return np.zeros(0, np.int64)
        get = self._ids.get
        ids = np.fromiter((get(u, -1) for u in uniques), np.int64, uniques.shape[0])
        new = ids < 0
        if new.any():  # first-seen order within the batch (uniques are in order of appearance)
            fresh = uniques[new].astype(str)
            got = self.interner.ids(fresh)
            ids[new] = got
            self._ids.update(zip(uniques[new].tolist(), got.tolist(), strict=True))
        return ids[codes]

    def distinct_values(self, batch: BatchView, name: str) -> np.ndarray:
        f = STREAMS[self.stream].fields[name]
        if f.numeric:
            v = batch.numeric(name)
            if f.type == "int":
                return v.astype(np.int64)
            return (v.astype(np.float64) + 0.0).view(np.int64)
        codes, uniques = batch.factorized(name)
        it = self.value_ids.setdefault(name, KeyInterner())
        if batch.n == 0:
            return np.zeros(0, np.int64)
        return it.ids(uniques.astype(str))[codes]

    def apply(
        self, batch: BatchView, structs: Iterable[_Structure] | None = None, domain: bool | None = None
    ) -> None:
        """Apply a ts-sorted batch to every structure (or the given ones) and, when ``domain``
        (default: all structures and the domain R-INT is live), to the domain R-INT."""
        ids = self.key_ids(batch)
        ts = np.asarray(batch.cols["ts"], dtype=np.int64)
        if domain is None:
            domain = structs is None and self.domain_live
        if domain:
            self.domain.append(ids, ts)
        if structs is None:
            structs = self.structs.values()
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
class _Group:
    """Single-atom threshold rules on one (index, window): looked up together."""

    state: _KeyState
    index: _Structure
    exact: _Structure  # R-INT with the exact counts / sums
    sum_kind: bool
    T: int
    members: dict[str, Atom] = field(default_factory=dict)  # rule name -> its atom
    uids: dict[str, int] = field(default_factory=dict)
    prev_pairs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    arrays: tuple[Any, ...] | None = None  # per-member ranges, rebuilt when members change

    def prepare(self) -> None:
        names = list(self.members)
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
    """

    def __init__(
        self, strategy: str = "shared", ci_p: int | None = None, history_ms: int | None = None
    ) -> None:
        if strategy not in ("shared", "naive"):
            raise ValueError("strategy must be 'shared' or 'naive'")
        if ci_p is None:
            from tidewatch.settings import get_settings

            ci_p = get_settings().ci_p
        self.strategy = strategy
        self.ci_p = int(ci_p)
        self.history_ms = history_ms
        self.states: dict[tuple[str, str], _KeyState] = {}
        self.rules: dict[str, _Rule] = {}
        self.groups: dict[tuple[Any, ...], _Group] = {}
        self._uid = 0
        self._history: dict[str, list[dict[str, np.ndarray]]] = {}
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
            st = _KeyState(plan.stream, plan.key, self.ci_p)
            self.states[(plan.stream, plan.key)] = st
            new_state = True
        else:
            new_state = False
        st.domain_users[name] = plan.domain_ms
        needs_domain = plan.domain_ms is not None and (self.strategy == "naive" or not plan.driver)
        domain_fresh = needs_domain and not st.domain_live and not new_state
        if needs_domain:
            st.domain_live = True
        fresh: list[_Structure] = []

        def use(kind: str, pred: A.RowCond | None, attr: str, window: A.Window | int) -> _Structure:
            s, created = st.struct(kind, pred, attr)
            if created:
                fresh.append(s)
            if isinstance(window, A.RowsWindow):
                s.rows_users.add(name)
                s.users.setdefault(name, 0)
            else:
                w = window.start_ms if isinstance(window, A.TimeWindow) else int(window)
                s.users[name] = max(s.users.get(name, 0), w)
            return s

        agg_structs = [use(a.structure[0], a.predicate, a.structure[2], a.window) for a in plan.aggs]
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
            self._replay(st, fresh, new_state, domain_fresh)
        if self.strategy == "shared" and plan.single_atom:
            atom = plan.atoms[plan.driver[0]]
            idx = index_structs[atom.id]
            gkey = (plan.stream, plan.key, idx.kind, A.row_text(idx.predicate), idx.attr, atom.window_ms)
            g = self.groups.get(gkey)
            if g is None:
                g = _Group(st, idx, agg_structs[atom.agg_id], idx.kind == "ci_sum", atom.window_ms)  # type: ignore[index]
                self.groups[gkey] = g
            g.members[name] = atom
            g.uids[name] = rule.uid
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
        if rule.group is not None:
            g = self.groups[rule.group]
            g.members.pop(name)
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

    def _replay(self, st: _KeyState, fresh: list[_Structure], new_state: bool, domain_fresh: bool) -> None:
        """PSoup: fill new structures (and the domain R-INT when it starts being read) from history."""
        for cols in self._history.get(st.stream, []):
            b = BatchView(st.stream, cols)
            if new_state:
                st.apply(b)
            else:
                st.apply(b, fresh, domain=domain_fresh)

    # ------------------------------------------------------------ events
    def apply(self, stream: str, batch: dict[str, np.ndarray]) -> None:
        """Apply one micro-batch of a stream (columns of equal length; any order within it)."""
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        ts = np.asarray(batch["ts"], dtype=np.int64)
        n = ts.shape[0]
        if n == 0:
            return
        if n > 1 and np.any(ts[1:] < ts[:-1]):
            order = np.argsort(ts, kind="stable")
            cols = {k: np.asarray(v)[order] for k, v in batch.items()}
        else:
            cols = {k: np.asarray(v) for k, v in batch.items()}
        cols["ts"] = np.asarray(cols["ts"], dtype=np.int64)
        view = BatchView(stream, cols)
        for st in self.states.values():
            if st.stream == stream:
                st.apply(view)
        self.stats["events"] += n
        self._max_ts[stream] = max(self._max_ts.get(stream, int(ts.min())), int(cols["ts"][-1]))
        self._retain(stream, cols)

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

    def _retain(self, stream: str, cols: dict[str, np.ndarray]) -> None:
        hist = self._history.setdefault(stream, [])
        hist.append(cols)
        keep = self._retention(stream)
        if keep is None:
            return
        cutoff = self._max_ts[stream] - keep
        while hist and int(hist[0]["ts"][-1]) <= cutoff:
            hist.pop(0)

    def expire(self, now: int) -> None:
        """Drop rows no window in use can read any more (windows end at ``now`` or later)."""
        for st in self.states.values():
            dom = [w for w in st.domain_users.values() if w is not None]
            if dom and st.domain_live:
                st.domain.expire(now - max(dom))
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
            vals = sums[:, 0] if g.sum_kind else cnt.astype(np.float64)
            order = np.argsort(vals, kind="stable")
            v = vals[order]
            c = cand[order]
            a = np.where(lo_strict, np.searchsorted(v, los, "right"), np.searchsorted(v, los, "left"))
            b = np.where(hi_strict, np.searchsorted(v, his, "left"), np.searchsorted(v, his, "right"))
            lens = np.maximum(b - a, 0)
            total = int(lens.sum())
            if total:
                starts = np.cumsum(lens) - lens
                pos = np.arange(total, dtype=np.int64) - np.repeat(starts - a, lens)
                pairs = (np.repeat(uids, lens) << _SHIFT) | c[pos]
                pairs.sort()
            else:
                pairs = np.zeros(0, np.int64)
        else:
            pairs = np.zeros(0, np.int64)
        enter = sorted_diff(pairs, g.prev_pairs)
        exit_ = sorted_diff(g.prev_pairs, pairs)
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

    @property
    def nbytes(self) -> int:
        """Bytes held by every shared structure and index."""
        n = 0
        for st in self.states.values():
            n += st.domain.nbytes + st.interner.nbytes
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
                cnt, _ = st.domain.window(allk, self.now - W, self.now)
                d = allk[cnt > 0]
            self._domains[k] = d
        return d

    def evaluate(self, rule: _Rule) -> np.ndarray:
        """Sorted key ids satisfying the rule at now."""
        plan = rule.plan
        if self.ev.strategy == "shared" and plan.driver:
            cands = [
                rule.index_structs[i].obj.candidates(
                    a.window_ms, self.now, a.lo, a.hi, a.lo_strict, a.hi_strict
                )
                for i in plan.driver
                for a in (plan.atoms[i],)
            ]
            keys = cands[0] if len(cands) == 1 else np.unique(np.concatenate(cands))
            keys = np.sort(keys)
            # no domain check: a key satisfying the rule satisfies a driving atom, so it has an
            # event in that atom's window, which lies inside (now - W, now]
            self.ev.stats["candidates"] += int(keys.shape[0])
        else:
            keys = self.domain(rule.state, plan.domain_ms)
        if keys.shape[0] == 0:
            return keys
        self.ev.stats["post_checked"] += int(keys.shape[0])
        memo: dict[int, np.ndarray] = {}
        ok = self._cond(plan.cond, rule, keys, memo)
        return keys[ok]

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
            first, last = obj.first_last_rows(keys, w.n, 0) if rows else obj.first_last(keys, lo, hi, 0)  # type: ignore[union-attr]
            return first if f == "FIRST" else last
        if f in ("MIN", "MAX"):
            mn, mx = obj.rows(keys, w.n) if rows else obj.window(keys, lo, hi)  # type: ignore[union-attr]
            return mn if f == "MIN" else mx
        if f == "DISTINCT":
            d = obj.rows(keys, w.n) if rows else obj.window(keys, lo, hi)  # type: ignore[union-attr]
            return np.asarray(d, dtype=np.float64)
        raise ValueError(f)
