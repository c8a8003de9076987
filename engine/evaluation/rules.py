"""The rules the evaluator holds, the groups they are looked up in, and a lookup's changes.

* :class:`Rule`: a registered rule -- its plan (:mod:`subscriptions.compiler`), its
  :class:`engine.evaluation.state.KeyState`, the shared structures of its aggregates and of its
  driving atoms' collective indexes, and its result at its previous lookup.
* :class:`Group`: rules that are a single threshold atom and share (index, window), and rules
  ``driver AND further aggregate-vs-constant atoms``, looked up together: one index lookup at
  the loosest threshold, one exact pass, per-rule ranges (Arasu & Widom 2004, section 4: one
  collective index serves every indexable atom on it); the other atoms are checked on the
  group's (rule, key) pairs, each distinct aggregate read once for the keys of all rules using
  it (:func:`extra_atoms`, the tables of :class:`Group`) -- Arasu & Widom's sharing carried
  over to the post-check.
* :class:`Changes`: result changes of one lookup, blocks of (rule names, key values) that
  entered / exited.
* :func:`loose_rules`: the rules of no group (each looked up on its own), kept per rule set.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.evaluation.batches import SHIFT, compare
from engine.evaluation.state import KeyState, Structure
from subscriptions import rule_ast as A
from subscriptions.compiler import AggSpec, Atom, Plan

if TYPE_CHECKING:
    from engine.evaluation.lookup import Lookup


@dataclass
class Rule:
    name: str
    plan: Plan
    uid: int
    state: KeyState
    agg_structs: list[Structure]  # by AggSpec id
    index_structs: dict[int, Structure]  # atom id -> CI structure (driving atoms)
    prev: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sorted key ids
    group: tuple[Any, ...] | None = None


#: the comparison operators of threshold atoms; an atom's operator is stored as its index here
OPS = ("<", "<=", ">", ">=", "=", "!=")


@dataclass
class ExtraChecks:
    """Every extra atom of a group's members as one flat table, checked on the group's (rule,
    key) pairs in one pass per lookup: the entries ordered by the aggregate they read, so each
    distinct aggregate is read once for the distinct keys of all its entries' pairs (those of one
    structure and function that differ only in their window in one read, with per-key bounds),
    and the comparisons made once per operator for the whole group --
    not a dozen NumPy calls per table (with 10,000 rules, 180 tables of 10-20 members each took
    three quarters of the evaluator's lookup in a profile of the live run, most of it in calls
    on small arrays).  Arasu & Widom 2004, section 4's sharing carried over to the post-check."""

    aggs: list[tuple[Structure, AggSpec]]  # the distinct aggregates read
    bounds: np.ndarray  # the entries of aggs[a] are [bounds[a], bounds[a + 1])
    uids: np.ndarray  # int64 rule uid of each entry
    codes: np.ndarray  # int8 index into OPS
    consts: np.ndarray  # float64
    agg_left: np.ndarray  # bool
    negated: np.ndarray  # bool

    @classmethod
    def of(
        cls, extras: dict[str, list[tuple[Structure, AggSpec, Atom]]], uids: dict[str, int]
    ) -> ExtraChecks:
        """The table of a group's :attr:`Group.extras` (rule name -> its extra atoms, each with
        the aggregate it reads) and its members' uids: the atoms reading one aggregate
        (structure, function, window) together, in the order the aggregates first occur; within
        one, by (the atom's rank among its rule's atoms on that aggregate, rule uid)."""
        by_agg: dict[tuple[Any, ...], list[tuple[int, int, Atom]]] = {}
        agg_of: dict[tuple[Any, ...], tuple[Structure, AggSpec]] = {}
        for name, items in extras.items():
            seen: dict[tuple[Any, ...], int] = {}
            for s, spec, atom in items:
                sig = (id(s), spec.func, spec.window)
                k = seen.get(sig, 0)
                seen[sig] = k + 1
                by_agg.setdefault(sig, []).append((k, uids[name], atom))
                agg_of.setdefault(sig, (s, spec))
        rows = [r for sig in by_agg for r in sorted(by_agg[sig], key=lambda r: (r[0], r[1]))]
        sides = [_const_side(a) for _, _, a in rows]
        sizes = [len(v) for v in by_agg.values()]
        return cls(
            aggs=[agg_of[sig] for sig in by_agg],
            bounds=np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64),
            uids=np.array([u for _, u, _ in rows], np.int64),
            codes=np.array([OPS.index(str(a.op)) for _, _, a in rows], np.int8),
            consts=np.array([c for c, _ in sides], np.float64),
            agg_left=np.array([left for _, left in sides], bool),
            negated=np.array([a.negated for _, _, a in rows], bool),
        )

    def _reads(self) -> list[list[int]]:
        """The aggregates (indices into :attr:`aggs`) read together: those of one structure and
        one function whose windows are all time windows, or all ROWS windows, differ only in
        their bounds and are one read (:meth:`Lookup.read_over
        <engine.evaluation.lookup.Lookup.read_over>`).  Made per check (a few per group), not
        kept: the table's attributes are what a snapshot holds."""
        by: dict[tuple[int, str, bool], list[int]] = {}
        for a, (struct, spec) in enumerate(self.aggs):
            by.setdefault((id(struct), spec.func, isinstance(spec.window, A.RowsWindow)), []).append(a)
        return list(by.values())

    def check(self, ctx: Lookup, uid_of: np.ndarray, key_of: np.ndarray) -> np.ndarray | None:
        """Indices of the pairs (rule uid, key id) that fail one of their rule's extra atoms, in
        no particular order and possibly repeated (a pair failing two atoms); None when no pair
        is of a member with extra atoms.

        The pairs of a group's pass come sorted (``uid << 32 | key id``), so ``uid_of`` is
        non-decreasing and each entry's pairs are one run, found by two binary searches per
        entry -- O(entries log pairs + selected); unsorted input is sorted first (same
        result).  The selected pairs are laid out entry by entry, so those of one aggregate are
        one slice."""
        if uid_of.shape[0] > 1 and bool((uid_of[1:] < uid_of[:-1]).any()):
            order = np.argsort(uid_of, kind="stable")
            got = self.check(ctx, uid_of[order], key_of[order])
            return None if got is None else order[got]
        lo = np.searchsorted(uid_of, self.uids, "left")
        cnt = np.searchsorted(uid_of, self.uids, "right") - lo
        ends = np.cumsum(cnt)
        total = int(ends[-1]) if ends.shape[0] else 0
        if total == 0:
            return None
        j = np.repeat(np.arange(self.uids.shape[0]), cnt)  # the entry of each selected pair
        sel = lo[j] + (np.arange(total) - (ends - cnt)[j])
        at = np.concatenate([[0], ends])[self.bounds]  # the selected pairs of aggs[a]: at[a]:at[a+1]
        v = np.empty(total, np.float64)
        for members in self._reads():
            spans = [(int(at[a]), int(at[a + 1])) for a in members]
            used = [(a, p0, p1) for a, (p0, p1) in zip(members, spans, strict=True) if p1 > p0]
            if not used:
                continue
            struct, spec = self.aggs[used[0][0]]
            if len(used) == 1:
                _, p0, p1 = used[0]
                keys, inv = unique_ids(key_of[sel[p0:p1]])
                v[p0:p1] = ctx._agg(spec, struct, keys)[inv]
                continue
            # the aggregates of one read: (aggregate's rank in used, key id) made one code
            at_r = np.concatenate([np.arange(p0, p1) for _, p0, p1 in used])
            rank = np.repeat(np.arange(len(used), dtype=np.int64), [p1 - p0 for _, p0, p1 in used])
            keys_r = key_of[sel[at_r]]
            width = int(keys_r.max()) + 1
            codes_r, inv = unique_ids(rank * width + keys_r)
            specs = [self.aggs[a][1] for a, _, _ in used]
            v[at_r] = ctx.read_over(struct, specs, codes_r // width, codes_r % width)[inv]
        codes, c, left = self.codes[j], self.consts[j], self.agg_left[j]
        x, y = np.where(left, v, c), np.where(left, c, v)
        ok = np.empty(total, bool)
        for code in np.flatnonzero(np.bincount(codes, minlength=len(OPS))):
            op = OPS[code]
            m = codes == code
            a, b = x[m], y[m]
            with np.errstate(invalid="ignore"):
                r = np.asarray(compare(a, op, b), dtype=bool)
                if op == "!=":  # as Lookup._atom: NULL (NaN) compares false
                    r &= ~np.isnan(a) & ~np.isnan(b)
            ok[m] = r
        ok ^= self.negated[j]
        out: np.ndarray = sel[~ok]
        return out


def unique_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for non-negative integer ids: by a presence table
    (O(n + largest id)) when the ids are dense enough, else by sorting."""
    n = ids.shape[0]
    if n == 0:
        return ids.astype(np.int64), np.zeros(0, np.int64)
    top = int(ids.max()) + 1
    if int(ids.min()) < 0 or top > 4 * n + 4096:
        u, inv = np.unique(ids, return_inverse=True)
        return u, inv.reshape(-1)
    present = np.zeros(top, bool)
    present[ids] = True
    rank = np.cumsum(present, dtype=np.int64) - 1
    return np.flatnonzero(present), rank[ids]


def _const_side(atom: Atom) -> tuple[float, bool]:
    """(the constant, True if the aggregate is the left side) of an aggregate-vs-constant atom."""
    if isinstance(atom.right, A.Num):
        return float(atom.right.value), True
    assert isinstance(atom.left, A.Num)
    return float(atom.left.value), False


def extra_atoms(plan: Plan) -> list[Atom] | None:
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
class Group:
    """Threshold rules driven by one (index, window), looked up together: single-atom rules and
    rules ``driver AND more threshold atoms`` (the latter in :attr:`extras`)."""

    state: KeyState
    index: Structure
    exact: Structure  # R-INT with the exact counts / sums
    sum_kind: bool
    T: int
    members: dict[str, Atom] = field(default_factory=dict)  # rule name -> its atom
    uids: dict[str, int] = field(default_factory=dict)
    prev_pairs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    arrays: tuple[Any, ...] | None = None  # per-member ranges, rebuilt when members change
    #: members whose condition is the driving atom AND further threshold atoms: rule name ->
    #: those atoms (aggregate structure, its spec, the atom), checked on the group's pairs
    extras: dict[str, list[tuple[Structure, AggSpec, Atom]]] = field(default_factory=dict)
    extra_checks: ExtraChecks | None = None  # the extras as one table, rebuilt with arrays

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
        self.extra_checks = ExtraChecks.of(self.extras, self.uids)
        self.__dict__.pop("extra_tables", None)  # their list before ExtraChecks, in older snapshots

    def carry(self, pairs: np.ndarray, held: np.ndarray) -> np.ndarray:
        """``pairs`` (sorted) with the pairs of the members of uids ``held`` replaced by their
        pairs in :attr:`prev_pairs` (those members were not looked up), sorted."""
        keep = pairs[~np.isin(pairs >> SHIFT, held)]
        old = self.prev_pairs[np.isin(self.prev_pairs >> SHIFT, held)]
        return np.sort(np.concatenate([keep, old]))

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


#: per evaluator: (its rule set's stamp, its rules of no group) -- not in the evaluator, so
#: never in a snapshot
_LOOSE: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int], list[Rule]]] = weakref.WeakKeyDictionary()


def loose_rules(owner: Any, rules: dict[str, Rule], last_uid: int) -> list[Rule]:
    """``owner``'s rules of no group (``rule.group is None``), in the order of ``rules``: made
    again only when the rule set changed, i.e. when ``(len(rules), last_uid)`` did (``last_uid``:
    the uid given to the latest rule added -- an added rule raises it, a removed one lowers the
    count, and a rule's group is set once, when it is added).  A lookup then walks these, not
    every rule (thousands, nearly all in groups)."""
    stamp = (len(rules), int(last_uid))
    got = _LOOSE.get(owner)
    if got is None or got[0] != stamp:
        got = _LOOSE[owner] = (stamp, [r for r in rules.values() if r.group is None])
    return got[1]
