"""The values alerts carry, for every rule with alerts at one lookup, in one vectorized pass.

An alert says which aggregates made its rule fire and what they were at the lookup time (PSoup's
"results with their data", read from the shared structures of Arasu & Widom, section 4: one
structure per aggregate, read for many keys at once).  A lookup of 10,000 rules changes the
results of thousands of them by a key or two each, so what costs is not the alerts but the
rules: :func:`value_columns` does per rule only what its output needs (a slice per label), and
everything else over all the lookup's alerts at once --

* what each rule reads -- its labels, its aggregates' signatures, its key state -- from a
  :class:`ValuePlan` made once for the evaluator's rules as they are (:func:`plan_for`), found
  for the lookup's rules by one NumPy index;
* the keys to key ids: one ``dict.get`` pass (in C) over the keys of every rule of a key state;
* each (alert, aggregate) pair to its *signature* (structure, aggregate text): a table of the
  rules' signatures indexed by each alert's rule, the pairs grouped by a radix sort;
* each structure's aggregate read by one call for all its windows (the signatures of one
  *read*, :func:`_reads`), for the distinct (signature, key id) pairs
  (:func:`engine.evaluation.lookup.aggregate_over`), and scattered into one matrix of doubles with
  one of type tags beside it (COUNT and COUNT DISTINCT as ``int``, others as ``float``, NULL --
  NaN -- as ``None``: :data:`engine.messages.INT` ...).

:func:`value_table` hands the lookup's block those arrays as they are (no Python object per
value: the sinks read them as arrays); :func:`value_columns` makes the Python numbers, rule by
rule.  The result is what :meth:`engine.evaluation.evaluator.Evaluator.value_columns` promises;
the brute force it is checked against (one rule and one key at a time) is in
``tests/engine/evaluation/test_alert_values.py``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, compress, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from engine.evaluation.lookup import aggregate_over
from engine.evaluation.rules import unique_ids
from engine.messages import FLOAT, INT, NULL, entry_layout, typed_objects
from subscriptions.rule_ast import RowsWindow

if TYPE_CHECKING:
    from engine.evaluation.rules import Rule
    from engine.evaluation.state import KeyState, Structure
    from subscriptions.compiler import AggSpec

#: ``{rule: (labels, columns)}``: the value of ``labels[j]`` for the i-th key asked is ``columns[j][i]``
ValueColumns = dict[str, tuple[list[str], list[list[Any]]]]


class KeysByRule(Mapping[str, list[str]]):
    """``{rule: keys}`` held flat, as a lookup's checked changes come
    (:class:`engine.lookup_changes.Accepted`): rule ``names[r]`` has ``sizes[r]`` keys, the next
    ones of ``flat_keys``.  A read-only mapping for any reader; :func:`value_table` and
    :func:`value_columns` take its flat columns as they are (no list per rule)."""

    def __init__(self, names: list[str], sizes: np.ndarray, keys: list[str]) -> None:
        self.names, self.sizes, self.flat_keys = names, sizes, keys
        self._at: dict[str, tuple[int, int]] | None = None

    def span(self, name: str) -> tuple[int, int]:
        """Where rule ``name``'s keys are in ``flat_keys`` (``[a, b)``)."""
        if self._at is None:  # made on a reader's first ask (the values' fallbacks, rule by rule)
            ends = np.cumsum(self.sizes).tolist()
            self._at = {
                n: (b - int(k), b) for n, k, b in zip(self.names, self.sizes.tolist(), ends, strict=True)
            }
        return self._at[name]

    def __getitem__(self, name: str) -> list[str]:
        a, b = self.span(name)
        return self.flat_keys[a:b]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _flat(wanted: Mapping[str, list[str]]) -> tuple[np.ndarray, list[str]]:
    """``(sizes, keys)``: each rule's count of keys and all the keys, in order."""
    if isinstance(wanted, KeysByRule):
        return np.asarray(wanted.sizes, np.int64), wanted.flat_keys
    lists = list(wanted.values())
    return np.fromiter(map(len, lists), np.int64, len(lists)), list(chain.from_iterable(lists))


class ValueTable(NamedTuple):
    """The values of a lookup's alerts for many rules as flat columns (:func:`value_table`): rule
    ``i`` of ``wanted`` has ``label_counts[i]`` labels, ``labels`` holding every rule's one after
    another; ``doubles`` and ``tags`` hold every alert's values one after another -- the rules in
    the order of ``wanted``, each rule's keys in their order, each alert's values in its rule's
    label order -- as typed doubles (:func:`engine.messages.typed_objects` makes them Python
    numbers)."""

    label_counts: np.ndarray
    labels: list[str]
    doubles: np.ndarray
    tags: np.ndarray


def value_columns(
    rules: dict[str, Rule], wanted: Mapping[str, list[str]], now: int, plan: ValuePlan | None = None
) -> ValueColumns:
    """The values of the aggregates of each rule of ``wanted`` (``{rule name: keys}``) for its keys
    at ``now``, read from the structures as they are (call right after the lookup at ``now``).

    Per rule: its distinct aggregate texts as labels, in first-appearance order, each with the
    value of its *last* occurrence (``dict(zip(texts, values))``), and one column per label, row
    ``i`` for ``wanted[rule][i]``.  A key the rule's state never saw reads as an empty window.
    Rules reading the same aggregate share one read over the union of their keys.  ``plan``:
    the :class:`ValuePlan` of ``rules`` (made for the rules of ``wanted`` if not given)."""
    if not wanted:
        return {}
    plan, rows, starts, doubles, tags = _matrix(rules, wanted, now, plan)
    values = typed_objects(doubles.reshape(-1), tags.reshape(-1)).reshape(doubles.shape)
    out: ValueColumns = {}
    for i, (name, row) in enumerate(zip(wanted, rows.tolist(), strict=True)):
        labels, at = plan.layouts[row]
        block = values[starts[i] : starts[i + 1]]
        if len(at) == 1:
            out[name] = (labels, [block[:, at[0]].tolist()])
            continue
        columns = block.T.tolist()
        out[name] = (labels, [columns[j] for j in at])
    return out


def value_table(
    rules: dict[str, Rule], wanted: Mapping[str, list[str]], now: int, plan: ValuePlan | None = None
) -> ValueTable:
    """:func:`value_columns` as one :class:`ValueTable` for all the rules of ``wanted``: the same
    labels and values, gathered out of the lookup's value matrix by one NumPy index (no list per
    rule or per label): what a lookup's alerts carry as one block
    (:class:`engine.messages.LookupBlock`); ``plan`` as for :func:`value_columns`."""
    if not wanted:
        return ValueTable(np.zeros(0, np.int64), [], np.zeros(0, np.float64), np.zeros(0, np.int8))
    plan, rows, starts, doubles, tags = _matrix(rules, wanted, now, plan)
    m = plan.label_counts[rows]
    width = doubles.shape[1]
    labels = list(chain.from_iterable(map(plan.labels.__getitem__, rows.tolist())))
    if (m == width).all() and (plan.in_order[rows]).all():
        return ValueTable(m, labels, doubles.reshape(-1), tags.reshape(-1))  # every column, in order
    cols = plan.columns[rows, :width][np.arange(width) < m[:, None]]  # each rule's, row by row
    _, entry, label = entry_layout(np.diff(starts), m)  # each value entry's alert and label
    at = entry * width + cols[label]
    return ValueTable(m, labels, doubles.reshape(-1)[at], tags.reshape(-1)[at])


class ValuePlan:
    """What :func:`value_table` reads of each rule, made once for a set of rules (not once per
    lookup: with 10,000 rules, making it at every lookup for the rules with alerts took about a
    quarter of the evaluation thread in a profile, docs/measurements/engine.md, Dec 2 evening) --
    per rule, by row (``row_of[rule.uid]``):

    * its layout (:func:`_layout`): ``labels[row]``, ``label_counts[row]`` and ``columns[row]``
      (the value matrix's column of each label, padded with 0), ``in_order[row]`` when it reads
      every column in order;
    * ``sig_of[row, j]``: the signature of its aggregate ``j`` (-1 past its last), an index of
      ``sigs``, one (structure, spec) per distinct (structure, aggregate text) of all the rules
      (:func:`_signatures`); ``n_aggs[row]``;
    * ``state_of[row]``: its key state, an index of ``states``;
    * ``read_of[g]``: signature ``g``'s *read*, an index of ``reads`` -- one (structure, function,
      ROWS or not) per structure and function: the signatures of one read differ only in their
      window, ``sig_a[g]`` and ``sig_b[g]`` (a time window's start and end before the lookup
      time, in ms; a ROWS window's n and 0), and are read by one call (:func:`_reads`).

    A plan is only valid for the rules it was made of, as they were: the evaluator asks for it
    with :func:`plan_for`, drops it with :func:`forget_plan` when a rule is added or removed, and
    never writes it into a snapshot; a rule it was not made for raises ``ValueError``."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        rs = list(rules)
        self.row_of = np.full(max((r.uid for r in rs), default=-1) + 1, -1, np.int64)
        self.row_of[[r.uid for r in rs]] = np.arange(len(rs))
        self.layouts = [_layout(r) for r in rs]
        self.labels = [labels for labels, _ in self.layouts]
        self.label_counts = np.array([len(at) for _, at in self.layouts], np.int64).reshape(-1)
        self.sig_of, self.sigs = _signatures(rs)
        self.read_of, self.reads, self.sig_a, self.sig_b = _reads(self.sigs)
        width = self.sig_of.shape[1]
        self.n_aggs = np.array([len(r.plan.aggs) for r in rs], np.int64).reshape(-1)
        self.columns = np.zeros((len(rs), width), np.int64)
        for i, (_, at) in enumerate(self.layouts):
            self.columns[i, : len(at)] = at
        self.in_order = (self.label_counts == self.n_aggs) & (self.columns == np.arange(width)[None, :]).all(
            axis=1, where=np.arange(width)[None, :] < self.n_aggs[:, None]
        )
        state_ids: dict[int, int] = {}
        self.states: list[KeyState] = []
        for r in rs:
            if state_ids.setdefault(id(r.state), len(self.states)) == len(self.states):
                self.states.append(r.state)
        self.state_of = np.array([state_ids[id(r.state)] for r in rs], np.int64).reshape(-1)

    def rows(self, rs: list[Rule]) -> np.ndarray:
        """The rows of ``rs`` (rules of this plan)."""
        uids = np.fromiter(map(attrgetter("uid"), rs), np.int64, len(rs))
        rows = self.row_of[uids] if len(uids) and uids.max() < len(self.row_of) else None
        if rows is None or (rows < 0).any():
            raise ValueError("a rule the value plan was not made for")
        return rows


#: each owner's (evaluator's) plan of its rules as they are, held beside it -- not an attribute:
#: a snapshot carries the rules, never a cache of them (a plan restored under code whose
#: :class:`ValuePlan` changed would be read wrong)
_PLANS: weakref.WeakKeyDictionary[Any, ValuePlan] = weakref.WeakKeyDictionary()


def plan_for(owner: Any, rules: dict[str, Rule]) -> ValuePlan:
    """The :class:`ValuePlan` of ``owner``'s ``rules``, made at the first call after
    :func:`forget_plan` (which ``owner`` calls whenever a rule is added or removed)."""
    plan = _PLANS.get(owner)
    if plan is None:
        plan = _PLANS[owner] = ValuePlan(rules.values())
    return plan


def forget_plan(owner: Any) -> None:
    """Drop ``owner``'s plan: its rules changed."""
    _PLANS.pop(owner, None)


def _starts(n: np.ndarray) -> np.ndarray:
    """``[0, n0, n0 + n1, ...]``: where each of consecutive runs of lengths ``n`` starts."""
    out = np.zeros(len(n) + 1, np.int64)
    np.cumsum(n, out=out[1:])
    return out


def _layout(rule: Rule) -> tuple[list[str], list[int]]:
    """A rule's labels -- its distinct aggregate texts, in first-appearance order -- and for each
    the column of the value matrix it reads (its text's *last* occurrence: ``dict(zip(...))``)."""
    aggs = rule.plan.aggs
    if len(aggs) == 1:
        return [aggs[0].text], [0]
    at = {spec.text: j for j, spec in enumerate(aggs)}
    return list(at), list(at.values())


def _matrix(
    rules: dict[str, Rule], wanted: Mapping[str, list[str]], now: int, plan: ValuePlan | None
) -> tuple[ValuePlan, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(plan, rows, starts, doubles, tags)``: ``plan`` (made for the rules of ``wanted`` if
    none is given), its rows of the rules of ``wanted`` (in its order), where each one's alerts
    start (``starts[i]:starts[i + 1]``, the keys of ``wanted[name]`` in order) and the matrices
    of every alert's aggregates (row: alert, column: the rule's aggregate ``j``) as doubles and
    their type tags (:func:`_read`; past a rule's last aggregate: 0.0, NULL)."""
    rs = [rules[n] for n in wanted]
    plan = plan or ValuePlan(rs)
    rows = plan.rows(rs)
    sizes, keys = _flat(wanted)
    starts = _starts(sizes)
    ids = _key_ids(plan, rows, keys, sizes)
    width = int(plan.n_aggs[rows].max())
    doubles = np.zeros((int(starts[-1]), width), np.float64)
    tags = np.full((int(starts[-1]), width), NULL, np.int8)
    if doubles.size:
        # (alert, aggregate) -> signature, the padding (-1) left out
        pair_sig = plan.sig_of[np.repeat(rows, np.diff(starts)), :width].ravel()
        at = np.flatnonzero(pair_sig >= 0)
        sig = pair_sig[at]
        read = plan.read_of[sig]
        if len(plan.reads) < 2**15:  # NumPy's stable sort of 16-bit integers is a radix sort: O(pairs)
            read = read.astype(np.int16)
        order = np.argsort(read, kind="stable")
        # sorted, read r's pairs are order[cut[r]:cut[r + 1]]
        cut = _starts(np.bincount(read, minlength=len(plan.reads)))
        flat, flat_tags = doubles.reshape(-1), tags.reshape(-1)
        for r in np.flatnonzero(cut[1:] > cut[:-1]).tolist():  # only the reads used
            sel = order[cut[r] : cut[r + 1]]
            pos = at[sel]
            flat[pos], flat_tags[pos] = _read(plan.reads[r], plan, sig[sel], ids[pos // width], now)
    return plan, rows, starts, doubles, tags


def _key_ids(plan: ValuePlan, rows: np.ndarray, keys: list[str], sizes: np.ndarray) -> np.ndarray:
    """Each wanted key's id in its rule's key state (the state's size for a key never seen), in
    order (rule ``rows[r]`` has ``sizes[r]`` of ``keys``): one ``dict.get`` pass per key state
    over all its rules' keys."""
    n = len(keys)
    state_of = plan.state_of[rows]
    used = np.unique(state_of).tolist()
    if len(used) == 1:
        st = plan.states[used[0]]
        return np.fromiter(map(st._ids.get, keys, repeat(len(st.interner))), np.int64, n)
    ids = np.empty(n, np.int64)
    of_key = np.repeat(state_of, sizes)
    for k in used:
        st = plan.states[k]
        m = of_key == k
        ids[m] = np.fromiter(
            map(st._ids.get, compress(keys, m.tolist()), repeat(len(st.interner))), np.int64, int(m.sum())
        )
    return ids


def _signatures(rs: list[Rule]) -> tuple[np.ndarray, list[tuple[Structure, AggSpec]]]:
    """``(sig_of, sigs)``: ``sig_of[i, j]`` the signature of rule ``i``'s aggregate ``j`` (-1 past
    its last), an index of ``sigs`` -- one (structure, spec) per distinct (structure, aggregate
    text): rules reading the same aggregate share its read.  The structure fixes what is
    aggregated (kind, row predicate, attribute), the text the function and the window; two texts
    of one aggregate (``60 SECONDS``, ``1 MINUTES``) are read twice, equal."""
    width = max((len(r.plan.aggs) for r in rs), default=0)
    index: dict[tuple[int, str], int] = {}
    sigs: list[tuple[Structure, AggSpec]] = []
    flat: list[int] = []
    for r in rs:
        aggs, structs = r.plan.aggs, r.agg_structs
        for spec in aggs:
            s = structs[spec.id]
            key = (id(s), spec.text)  # the text says the function and the window (its hash is kept)
            g = index.get(key)
            if g is None:
                g = index[key] = len(sigs)
                sigs.append((s, spec))
            flat.append(g)
        if len(aggs) < width:
            flat.extend(repeat(-1, width - len(aggs)))
    return np.asarray(flat, np.int64).reshape(len(rs), width), sigs


def _reads(
    sigs: list[tuple[Structure, AggSpec]],
) -> tuple[np.ndarray, list[tuple[Structure, str, bool]], np.ndarray, np.ndarray]:
    """``(read_of, reads, a, b)`` of the signatures ``sigs``: ``reads`` one (structure, function,
    ROWS window or not) per distinct such triple, ``read_of[g]`` signature ``g``'s; ``a[g]``,
    ``b[g]`` its window's bounds -- a time window's ``start_ms`` and ``end_ms`` (it holds the
    rows with ``now - a < ts <= now - b``), a ROWS window's ``n`` and 0."""
    index: dict[tuple[int, str, bool], int] = {}
    reads: list[tuple[Structure, str, bool]] = []
    read_of = np.zeros(len(sigs), np.int64)
    a = np.zeros(len(sigs), np.int64)
    b = np.zeros(len(sigs), np.int64)
    for g, (s, spec) in enumerate(sigs):
        w = spec.window
        rows = isinstance(w, RowsWindow)
        key = (id(s), spec.func, rows)
        r = index.get(key)
        if r is None:
            r = index[key] = len(reads)
            reads.append((s, spec.func, rows))
        read_of[g] = r
        a[g], b[g] = (w.n, 0) if rows else (w.start_ms, w.end_ms)  # type: ignore[union-attr]
    return read_of, reads, a, b


def _read(
    read: tuple[Structure, str, bool], plan: ValuePlan, sig: np.ndarray, ids: np.ndarray, now: int
) -> tuple[np.ndarray, np.ndarray]:
    """The aggregates of one read (``plan.reads[r]``: one structure and function) for pairs of
    signature ``sig[i]`` and key id ``ids[i]`` at ``now``, in one call for all the read's
    windows, as ``(doubles, tags)``: COUNT / COUNT DISTINCT tagged ``int`` (their doubles
    truncated, as ``int()`` would), others ``float``, NULL (NaN) tagged ``None`` with 0.0; each
    distinct (signature, key id) read once."""
    s, func, rows = read
    top = int(ids.max()) + 1 if len(ids) else 1
    u, inv = unique_ids(sig * top + ids)
    g, k = np.divmod(u, top)
    a, b = plan.sig_a[g], plan.sig_b[g]
    if rows:
        got = aggregate_over(func, s, k, n=a)
    else:
        got = aggregate_over(func, s, k, lo=now - a, hi=now - b)
    x = np.asarray(got, np.float64)[inv.reshape(-1)]
    nan = np.isnan(x)
    integral = func in ("COUNT", "DISTINCT")
    tags = np.full(len(x), INT if integral else FLOAT, np.int8)
    if nan.any():
        x = np.where(nan, 0.0, x)
        tags[nan] = NULL
    return (np.trunc(x) if integral else x), tags
