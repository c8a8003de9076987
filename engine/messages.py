"""The engine's messages: subscription changes in, alerts and a micro-batch's output out.

* :class:`SubscriptionChange` -- one record of the ``subscriptions`` topic (JSON from the
  outbox relay, :mod:`subscriptions.outbox`), parsed by :func:`parse_subscription_change`;
  applied before anything else in its micro-batch (PSoup, Chandrasekaran & Franklin 2002,
  section 3).
* :class:`RuleInfo` -- an active subscription as the engine knows it.
* :class:`Alert` -- a change of one subscription's result set at one lookup time (``ENTER`` /
  ``EXIT``), with the stable id ``subscription|key|kind|as_of`` the sinks deduplicate on.
* :class:`LookupBlock` / :class:`AlertSeq` -- a batch's alerts as the core makes them: one block
  of columns per lookup time (:class:`AlertBlock`: one per subscription and lookup time),
  :class:`Alert` objects made only for a reader that asks for them one by one (the sinks read the
  blocks as columns, issue #22).
* :class:`BatchOutput` -- everything one micro-batch produced (:meth:`engine.core.EngineCore.process`),
  what the sinks write (:mod:`engine.sinks.store`, :mod:`engine.sinks.publish`).

Plain data, no Spark, no I/O: imported by the core, the sinks and the sources alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, compress, islice, repeat
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from engine.dead_letter import DeadLetters

if TYPE_CHECKING:
    from engine.sinks.alert_columns import AlertColumns

#: the kind of the alert cap's record (:mod:`engine.cap`): a subscription's alerts at one lookup
#: time past ``engine_alert_cap_per_lookup`` were withheld from the alert log
CAPPED = "CAPPED"
_AS_OF = attrgetter("as_of")

#: an alert value's type, as a tag beside its double (a lookup's values, :class:`LookupBlock`; the
#: rows of ``engine_outputs``, :mod:`engine.sinks.output_block`): None, an int, a float
NULL, INT, FLOAT = 0, 1, 2
_TAG_OF: dict[type, int] = {type(None): NULL, int: INT, float: FLOAT}
#: ints whose double is exact (|x| < 2**53): what an INT tag can stand for
_EXACT_INT = 2.0**53


@dataclass
class RuleInfo:
    """An active subscription as the engine knows it."""

    subscription_id: str
    name: str
    text: str
    stream: str
    version: int | None = None
    #: how far apart (ms) the overload policy may space its lookups (None: never)
    staleness_budget_ms: int | None = None


@dataclass(frozen=True)
class Alert:
    """A change of one subscription's result set at one lookup time."""

    subscription_id: str
    rule_name: str
    stream: str
    key: str
    kind: str  # ENTER | EXIT (| CAPPED: the alert cap's record, :mod:`engine.cap`)
    as_of: int
    #: the aggregates the rule compares, for this key at ``as_of`` (what made it fire):
    #: aggregate text -> value (None for NULL); empty when the evaluator cannot say
    values: dict[str, float | int | None] = field(default_factory=dict, compare=False, hash=False)

    @property
    def id(self) -> str:
        return f"{self.subscription_id}|{self.key}|{self.kind}|{self.as_of}"


@dataclass
class AlertBlock:
    """The alerts of one subscription at one lookup time, as columns: alert ``i`` is
    ``Alert(subscription_id, rule_name, stream, keys[i], kinds[i], as_of, values)`` with ``values``
    = ``{labels[j]: columns[j][i]}`` (``labels`` distinct; none: the evaluator could not say)."""

    subscription_id: str
    rule_name: str
    stream: str
    as_of: int
    keys: list[str]
    kinds: list[str]
    labels: list[str] = field(default_factory=list)
    columns: list[list[Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)

    def compress(self, mask: Iterable[Any]) -> AlertBlock:
        """The block of the alerts whose ``mask`` entry is true, in order (``itertools.compress``
        over each column: no per-alert Python)."""
        mask = list(mask)
        return AlertBlock(
            self.subscription_id,
            self.rule_name,
            self.stream,
            self.as_of,
            list(compress(self.keys, mask)),
            list(compress(self.kinds, mask)),
            list(self.labels),
            [list(compress(c, mask)) for c in self.columns],
        )

    def alerts(self) -> list[Alert]:
        """The block's :class:`Alert` objects (each with its own values dict)."""
        sid, name, stream, tau, labels = (
            self.subscription_id,
            self.rule_name,
            self.stream,
            self.as_of,
            self.labels,
        )
        if not labels:
            return [
                Alert(sid, name, stream, k, kind, tau) for k, kind in zip(self.keys, self.kinds, strict=True)
            ]
        rows = zip(*self.columns, strict=True)
        return [
            Alert(sid, name, stream, k, kind, tau, dict(zip(labels, row, strict=True)))
            for k, kind, row in zip(self.keys, self.kinds, rows, strict=True)
        ]


def value_tags(values: list[Any]) -> np.ndarray | None:
    """The tag (:data:`NULL`, :data:`INT`, :data:`FLOAT`) of each of ``values`` by its type, or
    None when one is of another type (a bool, a NumPy number, a str...)."""
    tags = np.fromiter(map(_TAG_OF.get, map(type, values), repeat(-1)), np.int8, len(values))
    return None if (tags < 0).any() else tags


def typed_values(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as ``(doubles, tags)`` (:func:`typed_objects` gives them back): each value's
    double (0.0 for None) and its type's tag; ValueError when one is not None, an int a double
    holds exactly or a float."""
    tags = value_tags(values)
    if tags is None:
        raise ValueError("a lookup's values are None, int or float")
    past = "an int of a lookup's values is past 2**53: a double does not hold it exactly"
    try:
        doubles = np.array([0.0 if v is None else float(v) for v in values], np.float64)
    except OverflowError:  # an int past a double's range at all
        raise ValueError(past) from None
    if not ints_exact(doubles, tags):
        raise ValueError(past)
    return doubles, tags


def ints_exact(doubles: np.ndarray, tags: np.ndarray) -> bool:
    """Whether every value tagged :data:`INT` is an int its double holds exactly (|x| < 2**53)."""
    return not bool((np.abs(doubles[tags == INT]) >= _EXACT_INT).any())


def typed_objects(doubles: np.ndarray, tags: np.ndarray) -> np.ndarray:
    """The values ``(doubles, tags)`` say, as an object array of Python numbers: None, ``int``
    and ``float`` by their tags."""
    out = np.full(len(doubles), None, dtype=object)
    f, i = tags == FLOAT, tags == INT
    out[f] = doubles[f]  # Python floats
    out[i] = doubles[i].astype(np.int64)  # Python ints
    return out


def entry_layout(sizes: np.ndarray, label_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The value entries of a lookup's alerts laid out alert by alert: rule ``r`` has ``sizes[r]``
    alerts and ``label_counts[r]`` labels (the next ones of the rules' labels, one after
    another), each of its alerts one entry per label.  Returns ``(rule, alert, label)``: each
    alert's rule, and for each entry its alert and the index of its label among all the rules'
    labels -- by NumPy, no Python per rule or per alert (:class:`LookupBlock`,
    :func:`engine.evaluation.alert_values.value_table`, the sinks' columns)."""
    rule = np.repeat(np.arange(len(sizes)), sizes)
    per_alert = label_counts[rule]
    alert = np.repeat(np.arange(len(rule)), per_alert)
    first_label = np.zeros(len(label_counts) + 1, np.int64)
    np.cumsum(label_counts, out=first_label[1:])
    first_entry = np.zeros(len(rule) + 1, np.int64)
    np.cumsum(per_alert, out=first_entry[1:])
    label = first_label[rule[alert]] + (np.arange(len(alert), dtype=np.int64) - first_entry[alert])
    return rule, alert, label


@dataclass(eq=False)
class LookupBlock:
    """The alerts of MANY subscriptions at one lookup time, as flat columns (what the core makes
    of a lookup: :meth:`engine.core.EngineCore._emit`, one block where :class:`AlertBlock` made
    one per subscription -- a storm of thousands of subscriptions with an alert or two each made
    thousands of small objects, each read field by field again by the sinks).

    Rule ``r`` (``subscription_ids[r]``, ``rule_names[r]``, ``streams[r]``) has ``sizes[r]``
    alerts, the next ones of ``keys`` / ``kinds``, and ``label_counts[r]`` labels, the next ones of
    ``labels``; alert ``i`` of rule ``r`` carries ``label_counts[r]`` values, the next ones of
    ``doubles`` / ``tags``, in its rule's label order: ``Alert(..., values=dict(zip(its labels, its
    values)))`` (:func:`engine.evaluation.alert_values.value_table`).  The values are typed
    doubles, not Python objects: each one's double and its type's tag (:data:`NULL`, :data:`INT`,
    :data:`FLOAT`), so that the sinks take them as arrays (:attr:`values` makes the objects, for a
    reader that asks)."""

    as_of: int
    subscription_ids: list[str]
    rule_names: list[str]
    streams: list[str]
    sizes: np.ndarray
    keys: list[str]
    kinds: list[str]
    label_counts: np.ndarray
    labels: list[str]
    doubles: np.ndarray
    tags: np.ndarray

    def __post_init__(self) -> None:
        n_rules, n = len(self.subscription_ids), len(self.keys)
        if not (
            len(self.rule_names) == len(self.streams) == len(self.sizes) == len(self.label_counts) == n_rules
        ):
            raise ValueError("a lookup block's per-rule columns differ in length")
        if (
            int(self.sizes.sum()) != n
            or len(self.kinds) != n
            or int(self.label_counts.sum()) != len(self.labels)
        ):
            raise ValueError("a lookup block's alerts or labels do not add up")
        if not int(np.dot(self.sizes, self.label_counts)) == len(self.doubles) == len(self.tags):
            raise ValueError("a lookup block's values do not fit its alerts' labels")

    @classmethod
    def of(
        cls,
        as_of: int,
        changes: dict[str, tuple[list[str], list[str]]],
        infos: list[RuleInfo],
        label_counts: np.ndarray,
        labels: list[str],
        doubles: np.ndarray,
        tags: np.ndarray,
    ) -> LookupBlock:
        """The block of ``changes`` (``{subscription: (keys, kinds)}``, in order) of the rules
        ``infos`` (in the same order), with their labels and values as
        :func:`~engine.evaluation.alert_values.value_table` gives them."""
        pairs = list(changes.values())
        return cls(
            as_of,
            list(changes),
            [i.name for i in infos],
            [i.stream for i in infos],
            np.fromiter(map(len, map(itemgetter(0), pairs)), np.int64, len(pairs)),
            list(chain.from_iterable(map(itemgetter(0), pairs))),
            list(chain.from_iterable(map(itemgetter(1), pairs))),
            label_counts,
            labels,
            doubles,
            tags,
        )

    @classmethod
    def of_blocks(cls, blocks: list[AlertBlock]) -> LookupBlock:
        """The one block of ``blocks`` (one subscription each, all at one lookup time), their
        alerts in order: what the core makes of a lookup (tests, ``bench/delivery_bench.py``);
        ValueError when a value is not None, an int a double holds exactly or a float
        (:func:`typed_values`)."""
        if len({b.as_of for b in blocks}) > 1:
            raise ValueError("the blocks of one lookup block have one lookup time")
        return cls(
            blocks[0].as_of if blocks else 0,
            [b.subscription_id for b in blocks],
            [b.rule_name for b in blocks],
            [b.stream for b in blocks],
            np.array([len(b) for b in blocks], np.int64),
            [k for b in blocks for k in b.keys],
            [k for b in blocks for k in b.kinds],
            np.array([len(b.labels) for b in blocks], np.int64),
            [label for b in blocks for label in b.labels],
            *typed_values([v for b in blocks for row in zip(*b.columns, strict=True) for v in row]),
        )

    def __len__(self) -> int:
        return len(self.keys)

    def compress(self, mask: Iterable[Any]) -> LookupBlock:
        """The block of the alerts whose ``mask`` entry is true, in order (rules left with no
        alert dropped): NumPy and ``itertools.compress``, no per-alert Python."""
        keep = np.fromiter(map(bool, mask), np.bool_, len(self))
        rule, alert, _ = entry_layout(self.sizes, self.label_counts)
        sizes = np.bincount(rule[keep], minlength=len(self.sizes)).astype(np.int64)
        rules = (sizes > 0).tolist()
        entries = keep[alert]
        return LookupBlock(
            self.as_of,
            list(compress(self.subscription_ids, rules)),
            list(compress(self.rule_names, rules)),
            list(compress(self.streams, rules)),
            sizes[sizes > 0],
            list(compress(self.keys, keep.tolist())),
            list(compress(self.kinds, keep.tolist())),
            self.label_counts[sizes > 0],
            list(compress(self.labels, np.repeat(sizes > 0, self.label_counts).tolist())),
            self.doubles[entries],
            self.tags[entries],
        )

    @property
    def values(self) -> list[Any]:
        """The values as Python objects (None, ``int``, ``float``), alert by alert."""
        return typed_objects(self.doubles, self.tags).tolist()  # type: ignore[no-any-return]

    def alerts(self) -> list[Alert]:
        """The block's :class:`Alert` objects (each with its own values dict)."""
        out: list[Alert] = []
        keys, kinds, labels, values, tau = (
            iter(self.keys),
            iter(self.kinds),
            self.labels,
            self.values,
            self.as_of,
        )
        first_label = first_value = 0
        for sid, name, stream, n, m in zip(
            self.subscription_ids, self.rule_names, self.streams, self.sizes.tolist(),
            self.label_counts.tolist(), strict=True,
        ):  # fmt: skip
            its = labels[first_label : first_label + m]
            for k, kind in zip(islice(keys, n), islice(kinds, n), strict=True):
                vals = dict(zip(its, values[first_value : first_value + m], strict=True))
                out.append(Alert(sid, name, stream, k, kind, tau, vals))
                first_value += m
            first_label += m
        return out


class AlertSeq:
    """A batch's alerts in order: blocks of columns (:class:`LookupBlock`, one per lookup time,
    appended by the core with :meth:`add_block`; :class:`AlertBlock`, one per subscription and
    lookup time) and runs of :class:`Alert` objects.  It behaves as a ``list`` of
    Alert (``len``, iteration, indexing and slicing, ``append``, ``extend``, item and slice
    assignment, ``sort``, ``==`` with a list); a reader that iterates gets Alert objects made
    block by block, and any access by position first turns the whole sequence into one list of
    Alert objects (kept from then on).  :meth:`blocks` is what the sinks read as columns
    (:meth:`engine.sinks.alert_columns.AlertColumns.of`), with no per-alert Python.  A block can
    also be an :class:`~engine.sinks.alert_columns.AlertColumns` of many subscriptions and lookup
    times (a sharded batch's merged alerts, :func:`engine.shards.step.merge_outputs`)."""

    def __init__(self, alerts: Iterable[Alert] = ()) -> None:
        rows = list(alerts)
        self._blocks: list[AlertBlock | LookupBlock | list[Alert] | AlertColumns] = [rows] if rows else []
        self._n = len(rows)

    # ---------------------------------------------------------------- building
    def add_block(self, block: AlertBlock | LookupBlock | AlertColumns) -> None:
        if len(block):
            self._blocks.append(block)
            self._n += len(block)

    def append(self, alert: Alert) -> None:
        last = self._blocks[-1] if self._blocks else None
        if isinstance(last, list):
            last.append(alert)
        else:
            self._blocks.append([alert])
        self._n += 1

    def extend(self, alerts: Iterable[Alert]) -> None:
        if isinstance(alerts, AlertSeq):
            # copied first: ``seq.extend(seq)`` as a list does it
            for b in [list(b) if isinstance(b, list) else b for b in alerts._blocks]:
                if isinstance(b, list):
                    for a in b:
                        self.append(a)
                else:
                    self.add_block(b)
            return
        for a in alerts:
            self.append(a)

    def __iadd__(self, alerts: Iterable[Alert]) -> AlertSeq:
        self.extend(alerts)
        return self

    def blocks(self) -> list[AlertBlock | LookupBlock | list[Alert] | AlertColumns]:
        """The blocks, in order (read only)."""
        return self._blocks

    # ---------------------------------------------------------------- as a list
    def _flat(self) -> list[Alert]:
        if len(self._blocks) != 1 or not isinstance(self._blocks[0], list):
            rows = list(self)
            self._blocks = [rows]
        got = self._blocks[0]
        assert isinstance(got, list)
        return got

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Alert]:
        for b in self._blocks:
            yield from (b if isinstance(b, list) else b.alerts())

    @overload
    def __getitem__(self, i: int) -> Alert: ...
    @overload
    def __getitem__(self, i: slice) -> list[Alert]: ...
    def __getitem__(self, i: int | slice) -> Alert | list[Alert]:
        return self._flat()[i]

    def __setitem__(self, i: Any, value: Any) -> None:
        rows = self._flat()
        rows[i] = value
        self._n = len(rows)

    def __delitem__(self, i: int | slice) -> None:
        rows = self._flat()
        del rows[i]
        self._n = len(rows)

    def insert(self, i: int, alert: Alert) -> None:
        self._flat().insert(i, alert)
        self._n += 1

    def pop(self, i: int = -1) -> Alert:
        got = self._flat().pop(i)
        self._n -= 1
        return got

    def sort(self, *, key: Any = None, reverse: bool = False) -> None:
        self._flat().sort(key=key, reverse=reverse)

    def sort_by_as_of(self) -> None:
        """``sort(key=as_of)`` (stable) without making the blocks' Alert objects: a block is one
        lookup time, so it moves whole; the Alert objects of the runs move one by one.  A
        sequence holding blocks of columns of many lookup times (a sharded batch's, from its
        shards' tables) becomes one block of columns, joined and sorted by Arrow and NumPy
        (:meth:`AlertColumns.sorted_by_as_of <engine.sinks.alert_columns.AlertColumns.sorted_by_as_of>`)."""
        if not all(isinstance(b, list | AlertBlock | LookupBlock) for b in self._blocks):
            from engine.sinks.alert_columns import AlertColumns  # it imports this module

            cols = AlertColumns.of(self, slot=None).sorted_by_as_of()
            self._blocks, self._n = ([cols] if len(cols) else []), len(cols)
            return
        items: list[AlertBlock | LookupBlock | Alert] = []
        for b in self._blocks:
            if isinstance(b, list):
                items.extend(b)
            else:
                assert isinstance(b, AlertBlock | LookupBlock)
                items.append(b)
        times = [it.as_of for it in items]
        if times == sorted(times):  # in order already (e.g. one shard's)
            return
        items.sort(key=_AS_OF)
        n, self._blocks = self._n, []
        for it in items:
            if isinstance(it, AlertBlock | LookupBlock):
                self._blocks.append(it)
            else:
                self.append(it)
        self._n = n

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AlertSeq | list):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"AlertSeq({list(self)!r})"


@dataclass(frozen=True)
class SubscriptionChange:
    """One record of the ``subscriptions`` topic, parsed.

    ``op`` is ``upsert`` (new or changed rule, active), ``pause`` or ``delete``.
    """

    subscription_id: str
    op: str
    name: str = ""
    text: str = ""
    plan: Any = None
    version: int | None = None  # the subscription's version; a replay of an older one is ignored
    #: how far apart (ms) the engine may space this subscription's lookups when overloaded (None: never)
    staleness_budget_ms: int | None = None


def parse_subscription_change(key: bytes | None, value: bytes | None) -> SubscriptionChange:
    """Parse a ``subscriptions`` topic record (JSON from the outbox relay; null value = delete).

    Accepted value fields: ``id`` / ``subscription_id``, ``name``, ``rule`` / ``text``,
    ``plan`` (the compiled plan's JSON, optional), ``op`` (upsert | delete | pause) or
    ``status`` / ``active``, ``staleness_budget_ms`` (a positive integer or null).
    """
    sid = key.decode() if key else ""
    if value is None:
        return SubscriptionChange(sid, "delete")
    doc = json.loads(value)
    sid = str(doc.get("subscription_id") or doc.get("id") or sid)
    if not sid:
        raise ValueError("subscription change without an id")
    op = str(doc.get("op") or "").lower()
    status = str(doc.get("status") or "").lower()
    if op in ("delete", "deleted", "remove") or status in ("deleted", "delete"):
        op = "delete"
    elif op == "pause" or status in ("paused", "inactive") or doc.get("active") is False:
        op = "pause"
    else:
        op = "upsert"
    version = doc.get("version")
    budget = doc.get("staleness_budget_ms")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise ValueError(f"staleness_budget_ms must be a positive integer or null, not {budget!r}")
    return SubscriptionChange(
        sid,
        op,
        str(doc.get("name") or sid),
        str(doc.get("rule") or doc.get("rule_text") or doc.get("text") or ""),
        doc.get("plan"),
        None if version is None else int(version),
        budget,
    )


@dataclass
class BatchOutput:
    """Everything one micro-batch produced."""

    batch_id: int
    #: a list of Alert given here becomes an :class:`AlertSeq` of it
    alerts: AlertSeq = field(default_factory=AlertSeq)
    dead: DeadLetters = field(default_factory=DeadLetters)
    lookups: list[int] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # subscriptions deleted / paused
    #: the keys each removed subscription had in its result when it was removed (the compacted
    #: ``results`` topic gets a tombstone for each: :meth:`engine.sinks.publish.Publisher.publish`)
    removed_keys: dict[str, list[str]] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)  # subscriptions whose result set changed
    events: dict[str, int] = field(default_factory=dict)  # valid events per stream
    rule_errors: list[tuple[str, str]] = field(default_factory=list)
    #: the alerts the alert cap kept out of ``alerts`` (``engine_alert_cap_per_lookup``,
    #: :mod:`engine.cap`), in the engine's order, with their values: ``current_results`` and the
    #: ``results`` topic still get them; ``alerts`` has a CAPPED record for them instead
    withheld: list[Alert] = field(default_factory=list)
    #: the alert cap's bookkeeping: (subscription, lookup time) -> [alerts kept, index in
    #: ``alerts`` of its CAPPED record or -1] (:func:`engine.cap.cap_alerts`)
    cap_state: dict[tuple[str, int], list[int]] = field(default_factory=dict, repr=False)
    #: the overload policy (:mod:`engine.overload`): ``{subscription: stride}`` (> 1 only) this
    #: batch's lookups used (``engine_batches.strides``: a replay uses them again) ...
    strides: dict[str, int] = field(default_factory=dict)
    #: ... and per strided subscription ``{"every_ms": stride * L, "budget_ms": its budget}``
    #: (``engine_metrics.degraded``: Health's "degraded" list)
    degraded: dict[str, dict[str, int]] = field(default_factory=dict)
    #: where the alert cap's segments start (:mod:`engine.cap`): ``(index in alerts, segment,
    #: part)`` -- one segment per lookup and per new rule's whole-result diff, numbered in the
    #: batch; part 0 a lookup's own changes, 1 a whole-result diff (:func:`engine.cap.mark_segment`).
    #: Recorded by a core without the cap (a shard's: the sharded batch's driver caps the shards'
    #: alerts in the one core's order by them, :mod:`engine.shards.capped`); empty with the cap
    segments: list[tuple[int, int, int]] = field(default_factory=list, repr=False)
    _changes: list[Alert] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.alerts, AlertSeq):
            self.alerts = AlertSeq(self.alerts)

    def result_changes(self) -> AlertSeq | list[Alert]:
        """Every change of the subscriptions' results in this batch, what ``current_results`` and
        the ``results`` topic get: ``alerts`` itself when the cap withheld nothing; else the alerts
        but the CAPPED records, then the withheld ones, stably sorted by ``as_of`` -- each
        (subscription, key)'s changes in their order (:mod:`engine.cap`).  Made once per batch."""
        if not self.withheld:
            return self.alerts
        if self._changes is None:
            merged = [a for a in self.alerts if a.kind != CAPPED]
            merged += self.withheld
            merged.sort(key=_AS_OF)
            self._changes = merged
        return self._changes
