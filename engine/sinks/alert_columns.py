"""A batch's alerts as columns, built once per batch for both sinks.

:class:`AlertColumns` holds what :mod:`engine.sinks.store` (one ``COPY`` into ``alerts``) and
:mod:`engine.sinks.alert_wire` (the Avro records) read: the string fields as Arrow arrays, the
lookup times as one NumPy array and every alert's values flattened (entries per alert, their
labels, their values).  The core's alerts (an :class:`~engine.messages.AlertSeq` of
:class:`~engine.messages.AlertBlock`) are read one field at a time over all the blocks, with
list operations done in C; :class:`~engine.messages.Alert` objects, where a reader made them, by
a comprehension per field (the one per-alert Python left, off the core's path); a sequence of
both, run by run, the runs' columns joined; everything derived from them -- the stable alert
ids, the subscriptions' UUID text, the values' JSON text, the ENTER flags -- is computed
column-wise (Arrow compute, NumPy).  :func:`AlertColumns.of` keeps the columns of the
last list it was given, so the PostgreSQL commit and the Kafka transaction of a batch build them
once (:meth:`engine.sinks.deliver.Delivery.deliver` builds them before the two start, and hands the
columns themselves to the Kafka side).

The values' JSON text is the text ``json.dumps(alert.values)`` gives (tests/engine/sinks/
test_alert_columns.py): each distinct label encoded once by :func:`engine.sinks.store`'s JSON
encoder, numbers by ``repr`` (what ``json`` writes for ``int`` and ``float``), and any entry
whose ``repr`` is not a JSON number (None, NaN, infinities, booleans, other types) encoded by
``json`` itself.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import chain, groupby
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.messages import (
    INT,
    NULL,
    Alert,
    AlertBlock,
    AlertSeq,
    LookupBlock,
    entry_layout,
    ints_exact,
    typed_objects,
    value_tags,
)

_S = pa.large_string()
#: subscriptions per batch whose alert counts :meth:`AlertColumns.top_subscriptions` keeps
TOP_SUBSCRIPTIONS = 3
_NS = uuid.UUID("6f1d1c1e-7a0e-4a5e-9a57-7469646577a7")
#: the text ``str(uuid.UUID(s))`` gives: a subscription id so written is its own UUID text
_UUID_TEXT = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
#: what ``repr`` gives for an ``int`` or a finite ``float``: exactly what ``json`` writes for it
_JSON_NUMBER = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?(e[+-][0-9]+)?$"


@lru_cache(maxsize=65536)
def subscription_uuid(sid: str) -> uuid.UUID:
    """The UUID of a subscription id (ids that are not UUIDs map to a stable uuid5); cached:
    a batch's thousands of alerts come from far fewer subscriptions."""
    try:
        return uuid.UUID(sid)
    except ValueError:
        return uuid.uuid5(_NS, sid)


@lru_cache(maxsize=65536)
def uuid_text(sid: str) -> str:
    return str(subscription_uuid(sid))


def _json_encoder() -> Any:
    """``json.dumps`` with its defaults, minus its per-call set-up (the C encoder made once).
    Falls back to ``json.dumps`` where the C encoder is missing or does not give the same text."""
    import json.encoder as je

    make = getattr(je, "c_make_encoder", None)
    if make is None:
        return json.dumps
    try:
        enc = make(
            None, je.JSONEncoder().default, je.encode_basestring_ascii, None, ": ", ", ", False, False, True
        )
        probe = {'a\u00e9\\"': 1.5, "b": None, "c": 3, "d": float("nan"), "e": 1e-7}
        if "".join(enc(probe, 0)) != json.dumps(probe):
            return json.dumps
    except TypeError:  # another signature
        return json.dumps
    return lambda obj: "".join(enc(obj, 0))


#: ``json.dumps`` of an alert's values (or of one value), as the sinks have always written it
values_json = _json_encoder()


def typed_json(doubles: np.ndarray, tags: np.ndarray) -> pa.Array:
    """``json.dumps`` of each value ``(doubles, tags)`` say (None, ``int`` or ``float`` by its
    tag, as :func:`~engine.messages.typed_objects` makes them), as a ``large_string`` array made
    by Arrow: an int's text by a cast; a float's by Arrow's cast, which writes the shortest digits
    that read back as the same double -- the digits of Python's ``repr`` --, taken where that
    text has no exponent and the value lies where ``repr`` writes positionally (``1e-4 <= |x| <
    1e16``), with the ``.0`` that ``repr`` gives a whole number; any other float (an exponent,
    NaN, an infinity, zero) by :data:`values_json` itself.  Equal to ``values_json(v)`` for every
    value (tests/engine/sinks/test_alert_columns.py)."""
    doubles = np.asarray(doubles, np.float64)
    is_int, null = tags == INT, tags == NULL
    flt = ~is_int & ~null
    ftxt = pc.cast(pa.array(doubles), _S)
    mag = np.abs(doubles)
    with np.errstate(invalid="ignore"):
        plain = (mag >= 1e-4) & (mag < 1e16) & ~np.asarray(pc.match_substring(ftxt, "e"), np.bool_)
    whole = flt & plain & ~np.asarray(pc.match_substring(ftxt, "."), np.bool_)
    if whole.any():
        ftxt = pc.if_else(
            pa.array(whole), pc.binary_join_element_wise(ftxt, pa.scalar(".0", _S), pa.scalar("", _S)), ftxt
        )
    if is_int.any():
        itxt = pc.cast(pa.array(np.where(is_int, doubles, 0.0).astype(np.int64)), _S)
        ftxt = pc.if_else(pa.array(is_int), itxt, ftxt)
    out = pc.if_else(pa.array(null), pa.scalar("null", _S), ftxt)
    slow = flt & ~plain
    if slow.any():
        at = np.flatnonzero(slow)
        fixed = pa.array([values_json(v) for v in typed_objects(doubles[at], tags[at]).tolist()], _S)
        out = pc.replace_with_mask(out, pa.array(slow), fixed)
    return out


def large_utf8(values: Sequence[Any] | pa.Array, what: str) -> pa.Array:
    """A column of ``str`` as an Arrow ``large_string`` array (ValueError if one is missing)."""
    arr = values.cast(_S) if isinstance(values, pa.Array) else pa.array(values, _S)
    if arr.null_count:
        raise ValueError(f"alert {what} missing")
    return arr


def utf8_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(data uint8, offsets int64 starting at 0)`` of a ``large_string`` / ``large_binary`` array."""
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], np.int64, arr.offset + len(arr) + 1)[arr.offset :]
    if bufs[2] is None or offs[-1] == offs[0]:
        return np.zeros(0, np.uint8), np.zeros(len(arr) + 1, np.int64)
    data = np.frombuffer(bufs[2], np.uint8, int(offs[-1]))[int(offs[0]) :]
    return data, offs - offs[0]


def table_column(t: pa.Table, name: str) -> pa.Array:
    """Column ``name`` of ``t`` as one array, a dictionary-encoded one decoded."""
    got = t.column(name).combine_chunks()
    return got.dictionary_decode() if pa.types.is_dictionary(got.type) else got


def split_bytes(data: np.ndarray, offs: np.ndarray) -> list[bytes]:
    """``[data[offs[i]:offs[i+1]] as bytes]``, the slicing done by Arrow (in C: its NumPy
    conversion, ≈ 1.4x faster than ``to_pylist``'s scalars)."""
    n = len(offs) - 1
    arr = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(np.ascontiguousarray(offs, np.int64)), pa.py_buffer(data)]
    )
    out: list[bytes] = arr.to_numpy(zero_copy_only=False).tolist()
    return out


def _fields(al: Sequence[Alert]) -> list[list[Any]]:
    """Subscription, rule, stream, key, kind, as_of and values of Alert objects, one list each."""
    return [
        [a.subscription_id for a in al],
        [a.rule_name for a in al],
        [a.stream for a in al],
        [a.key for a in al],
        [a.kind for a in al],
        [a.as_of for a in al],
        [a.values for a in al],
    ]


def _seq_of(chunks: Iterable[AlertBlock | LookupBlock | list[Alert] | AlertColumns]) -> AlertSeq:
    """The chunks (blocks, runs of Alert objects) as one :class:`~engine.messages.AlertSeq`, in order
    (a run's Alert objects appended, a block added as it is)."""
    seq = AlertSeq()
    for b in chunks:
        if isinstance(b, list):
            seq.extend(b)
        else:
            seq.add_block(b)
    return seq


def _entries(values: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """The values dicts flattened, alert by alert: ``(labels, values)``."""
    return [k for v in values for k in v], [x for v in values for x in v.values()]


@dataclass(eq=False)
class AlertColumns:
    """The alerts of one batch, column by column (see the module docstring); alert ``i`` is row
    ``i`` of every column, in the batch's order."""

    subscription_id: pa.Array
    rule_name: pa.Array
    stream: pa.Array
    key: pa.Array
    kind: pa.Array
    as_of: np.ndarray
    #: the values' entries per alert, their labels (``None``: a label that is not a ``str``) and values
    counts: np.ndarray
    value_labels: pa.Array | None
    #: the entries' Python values as given (:attr:`value_items`); None when given as typed
    #: doubles (:attr:`typed`) or built from a shard's tables (:meth:`from_tables`: its derived
    #: columns, :attr:`values_json` and :attr:`value_floats`, came with them)
    given_items: list[Any] | None
    #: each alert's values dict (for the rare entries the columns cannot say), as :meth:`_build`
    #: reads them; empty when built from the core's blocks (:meth:`_from_blocks`: their labels are
    #: ``str``, the columns say all) or from tables (:meth:`from_rows`, :meth:`concat`: a sequence
    #: of blocks and runs of Alert objects, :meth:`_from_seq`)
    values: list[dict[str, Any]]
    #: the stable ids, when given (rows read back from PostgreSQL); else computed
    given_ids: pa.Array | None = None
    #: the entries' values as typed doubles ``(doubles, tags)``, when so given (the core's
    #: :class:`~engine.messages.LookupBlock`: no Python object per value on the sinks' path)
    typed: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.as_of)

    # ---------------------------------------------------------------- building
    @classmethod
    def of(
        cls,
        alerts: AlertColumns | AlertSeq | Sequence[Alert] | Sequence[dict[str, Any]],
        slot: str | None = "alerts",
    ) -> AlertColumns:
        """The columns of ``alerts`` (the core's :class:`~engine.messages.AlertSeq`, read block by
        block with no per-alert Python: :meth:`_from_seq`; Alert objects; or alert rows of
        :meth:`engine.sinks.store.Store.alerts_of_batch`: dicts without rule or stream); the
        columns of the last list given are kept and returned again for the same list (a batch's
        alerts are not changed once its output is made: the sinks only read them).  One list is
        kept per ``slot`` (``"withheld"``: :attr:`engine.messages.BatchOutput.withheld`'s); none
        for ``slot=None`` (a sequence about to change: :meth:`engine.messages.AlertSeq.sort_by_as_of`),
        nor for a sequence of one block of columns (returned as it is: the expansion of the batch
        before, on its own thread, must not evict the batch being delivered)."""
        if isinstance(alerts, AlertColumns):
            return alerts
        if isinstance(alerts, AlertSeq):  # columns already (one block): as they are, not cached,
            blocks = alerts.blocks()  # so another thread's batch keeps its cached columns
            if len(blocks) == 1 and isinstance(blocks[0], AlertColumns):
                return blocks[0]
        last = _LAST.get(slot) if slot is not None else None
        if last is not None and last[0] is alerts and len(last[1]) == len(alerts):
            return last[1]
        cols = cls._from_seq(alerts) if isinstance(alerts, AlertSeq) else cls._build(alerts)
        if slot is not None:
            _LAST[slot] = (alerts, cols)
        return cols

    @classmethod
    def _from_seq(cls, seq: AlertSeq) -> AlertColumns:
        """The columns of the core's alerts: blocks alone by :meth:`_from_blocks`; a sequence
        holding columns by :meth:`_from_chunks`; else (runs of Alert objects among the blocks)
        split into runs -- each run of consecutive blocks by :meth:`_from_blocks`, each run of
        Alert objects as :meth:`_build` reads them -- joined in order by :meth:`concat`, the
        entries' Python values (:attr:`value_items`) kept.  A label that is not a ``str``
        anywhere: the whole sequence as :meth:`_build` reads its Alert objects, as before."""
        blocks = seq.blocks()
        if any(isinstance(b, AlertColumns) for b in blocks):
            return cls._from_chunks(seq)
        if blocks and all(isinstance(b, LookupBlock) for b in blocks):
            return cls._from_lookups(blocks)  # type: ignore[arg-type]  # checked just above
        if not any(isinstance(b, list | LookupBlock) for b in blocks):
            return cls._from_blocks(seq)
        parts = [
            cls._build([a for b in run if isinstance(b, list) for a in b])
            if kind is list
            else cls._from_lookups(list(run))  # type: ignore[arg-type]  # a run of its kind
            if kind is LookupBlock
            else cls._from_blocks(_seq_of(run))
            for kind, run in groupby(blocks, key=type)
        ]
        if any(p.value_labels is None for p in parts):  # a label that is not a str: as before
            return cls._build(list(seq))
        out = cls.concat(parts)
        if out.value_items is None:  # joined through the tables: the entries' values kept
            out.given_items = [x for p in parts for x in p.value_items or ()]
            out.__dict__.pop("value_items", None)
        return out

    @classmethod
    def _from_lookups(cls, blocks: list[LookupBlock]) -> AlertColumns:
        """The columns of the core's lookup blocks (one per lookup time, many subscriptions each:
        :class:`~engine.messages.LookupBlock`), a few list joins in C and NumPy / Arrow gathers:
        no Python per subscription or per alert.  Each rule's fields are given once and taken
        for its alerts; each alert's labels are its rule's, taken from the blocks' labels.  A
        label that is not a ``str``: the blocks as :meth:`_build` reads their Alert objects."""

        def cat(lists: Iterable[list[Any]]) -> list[Any]:  # one block's list as it is (no copy)
            got = list(lists)
            return got[0] if len(got) == 1 else list(chain.from_iterable(got))

        try:
            rule_labels = pa.array(cat(b.labels for b in blocks), _S)
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # a label that is not a str: as before
            return cls._build([a for b in blocks for a in b.alerts()])
        sizes = np.concatenate([b.sizes for b in blocks]).astype(np.int64, copy=False)
        label_counts = np.concatenate([b.label_counts for b in blocks]).astype(np.int64, copy=False)
        rule, _, label_at = entry_layout(sizes, label_counts)
        at = pa.array(rule)
        return cls(
            subscription_id=large_utf8(cat(b.subscription_ids for b in blocks), "subscription_id").take(at),
            rule_name=large_utf8(cat(b.rule_names for b in blocks), "rule_name").take(at),
            stream=large_utf8(cat(b.streams for b in blocks), "stream").take(at),
            key=large_utf8(cat(b.keys for b in blocks), "key"),
            kind=large_utf8(cat(b.kinds for b in blocks), "kind"),
            as_of=np.repeat(np.array([b.as_of for b in blocks], np.int64), [len(b) for b in blocks]),
            counts=label_counts[rule],
            value_labels=rule_labels.take(pa.array(label_at)),
            given_items=None,
            values=[],
            typed=(
                np.concatenate([b.doubles for b in blocks]).astype(np.float64, copy=False),
                np.concatenate([b.tags for b in blocks]).astype(np.int8, copy=False),
            ),
        )

    @classmethod
    def _from_blocks(cls, seq: AlertSeq) -> AlertColumns:
        """The columns of the core's blocks alone (no Alert objects among them: a sequence of
        blocks, or a run of blocks of :meth:`_from_seq`), with one pass per field over all the
        blocks, not one pass of many steps per block: a storm of many subscriptions makes blocks
        of one or two alerts, where the steps per block cost more than the alerts (each block's
        fields given once and repeated by Arrow ``take`` and NumPy ``repeat``; keys, kinds,
        labels and values -- a block's value columns interleaved alert by alert -- joined by
        ``chain`` in C).  A label that is not a ``str``: the blocks as :meth:`_build` reads their
        Alert objects, as before."""
        blocks: list[AlertBlock] = seq.blocks()  # type: ignore[assignment]  # only blocks: see the callers
        ns = np.fromiter((len(b.keys) for b in blocks), np.int64, len(blocks))
        at = np.repeat(np.arange(len(blocks)), ns)
        ms = np.fromiter((len(b.labels) for b in blocks), np.int64, len(blocks))
        labels = list(chain.from_iterable([b.labels * len(b.keys) for b in blocks]))
        try:
            value_labels = pa.array(labels, _S)
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # a label that is not a str: as before
            return cls._build(list(seq))
        items = list(chain.from_iterable(chain.from_iterable(zip(*b.columns, strict=True) for b in blocks)))
        keys = list(chain.from_iterable([b.keys for b in blocks]))
        return cls(
            subscription_id=large_utf8([b.subscription_id for b in blocks], "subscription_id").take(at),
            rule_name=large_utf8([b.rule_name for b in blocks], "rule_name").take(at),
            stream=large_utf8([b.stream for b in blocks], "stream").take(at),
            key=large_utf8(keys, "key"),
            kind=large_utf8(list(chain.from_iterable([b.kinds for b in blocks])), "kind"),
            as_of=np.repeat(np.fromiter((b.as_of for b in blocks), np.int64, len(blocks)), ns),
            counts=np.repeat(ms, ns),
            value_labels=value_labels,
            given_items=items,
            values=[],
        )

    @classmethod
    def _from_chunks(cls, seq: AlertSeq) -> AlertColumns:
        """The columns of a sequence holding columns already (a sharded batch's merged alerts,
        :func:`engine.shards.step.merge_outputs`): those columns as they are, each run of other
        chunks between them read as :meth:`_from_seq` reads it (a label that is not a ``str``
        there: that run as :meth:`_build` reads its Alert objects), all joined in order by
        :meth:`concat`."""
        parts: list[AlertColumns] = []
        for columns, run in groupby(seq.blocks(), key=lambda b: isinstance(b, AlertColumns)):
            if columns:
                parts += [b for b in run if isinstance(b, AlertColumns)]
            else:
                part = _seq_of(run)
                if len(part):
                    parts.append(cls._from_seq(part))
        return cls.concat(parts)

    @classmethod
    def _build(cls, alerts: Sequence[Alert] | Sequence[dict[str, Any]]) -> AlertColumns:
        ids: pa.Array | None = None
        if alerts and isinstance(alerts[0], Alert):
            *f, values = _fields(alerts)  # type: ignore[arg-type]
        else:
            rows: Sequence[dict[str, Any]] = alerts  # type: ignore[assignment]
            ids = large_utf8([r["id"] for r in rows], "id")
            f = [
                [r["subscription_id"] for r in rows],
                [r.get("rule_name", "") for r in rows],
                [r.get("stream", "") for r in rows],
                [r["key"] for r in rows],
                [r["kind"] for r in rows],
                [r["as_of"] for r in rows],
            ]
            values = [r.get("values") or {} for r in rows]
        counts = np.fromiter(map(len, values), np.int64, len(values))
        keys, items = _entries(values)
        labels: pa.Array | None
        try:
            labels = pa.array(keys, _S)
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # a label that is not a str
            labels = None
        return cls._make(f, counts, labels, items, values, ids)

    @classmethod
    def _make(
        cls,
        f: list[list[Any]],
        counts: np.ndarray,
        labels: pa.Array | None,
        items: list[Any],
        values: list[dict[str, Any]],
        ids: pa.Array | None = None,
    ) -> AlertColumns:
        """The columns of the fields ``f`` (subscription, rule, stream, key, kind, as_of lists)."""
        return cls(
            subscription_id=large_utf8(f[0], "subscription_id"),
            rule_name=large_utf8(f[1], "rule_name"),
            stream=large_utf8(f[2], "stream"),
            key=large_utf8(f[3], "key"),
            kind=large_utf8(f[4], "kind"),
            as_of=np.asarray(f[5], np.int64).reshape(len(f[3])),
            counts=counts.reshape(len(f[3])),
            value_labels=labels,
            given_items=items,
            values=values,
            given_ids=ids,
        )

    # ---------------------------------------------------------------- derived columns
    @cached_property
    def value_items(self) -> list[Any] | None:
        """The entries' values as Python objects, alert by alert (made from :attr:`typed` when so
        given: for the values' JSON text, off the commit's path); None when built from a shard's
        tables (:meth:`from_tables`)."""
        if self.given_items is not None:
            return self.given_items
        if self.typed is not None:
            return typed_objects(*self.typed).tolist()  # type: ignore[no-any-return]
        return None

    @cached_property
    def value_tags(self) -> np.ndarray | None:
        """Each entry's type tag (:data:`~engine.messages.NULL`, :data:`~engine.messages.INT`,
        :data:`~engine.messages.FLOAT`): as given (:attr:`typed`), else by the type of each of
        :attr:`value_items`; None when one is of another type or an int past 2**53 (its double is
        not exact), or the columns came from a shard's tables."""
        if self.typed is not None:
            return self.typed[1]
        items = self.value_items
        tags = None if items is None else value_tags(items)
        if tags is None:
            return None
        bits, _ = self.value_floats
        return tags if ints_exact(bits.view(np.float64), tags) else None

    @cached_property
    def ids(self) -> pa.Array:
        """The stable alert ids ``subscription|key|kind|as_of`` (:attr:`engine.messages.Alert.id`)."""
        if self.given_ids is not None:
            return self.given_ids
        bar = pa.scalar("|", _S)
        ms = pc.cast(pa.array(self.as_of, pa.int64()), _S)
        return pc.binary_join_element_wise(self.subscription_id, self.key, self.kind, ms, bar)

    @cached_property
    def subscription_uuid_text(self) -> pa.Array:
        """Each alert's subscription as the text of its UUID (:func:`subscription_uuid`)."""
        canon = np.asarray(pc.match_substring_regex(self.subscription_id, _UUID_TEXT), np.bool_)
        if canon.all():  # already a UUID's text (the registry's ids): as they are
            return self.subscription_id
        enc = self.subscription_id.dictionary_encode()
        texts = pa.array([uuid_text(s) for s in enc.dictionary.to_pylist()], _S)
        return texts.take(enc.indices)

    def top_subscriptions(self, n: int = TOP_SUBSCRIPTIONS) -> dict[str, int]:
        """``{subscription UUID text: alerts}`` of the (at most) ``n`` subscriptions with the most
        alerts in the batch, most first, ties by subscription id; counted by Arrow
        (``value_counts``), sorted over the distinct subscriptions only, no per-alert Python
        (``engine_metrics.top_alerts``: who an alert storm comes from)."""
        if not len(self) or n <= 0:
            return {}
        vc = pc.value_counts(self.subscription_id)
        sids, counts = vc.field("values"), np.asarray(vc.field("counts"), np.int64)
        if len(counts) > n:  # only the subscriptions at or above the n-th largest count are sorted
            keep = np.flatnonzero(counts >= np.partition(counts, len(counts) - n)[len(counts) - n])
            sids, counts = sids.take(pa.array(keep)), counts[keep]
        tbl = pa.table({"sid": sids, "n": counts})
        top = tbl.sort_by([("n", "descending"), ("sid", "ascending")]).slice(0, n)
        return {
            uuid_text(sid): int(c)
            for sid, c in zip(top.column("sid").to_pylist(), top.column("n").to_pylist(), strict=True)
        }

    @cached_property
    def present(self) -> np.ndarray:
        """``kind == "ENTER"`` per alert (bool)."""
        return np.asarray(pc.equal(self.kind, pa.scalar("ENTER", _S)).fill_null(False), np.bool_)

    @cached_property
    def value_floats(self) -> tuple[np.ndarray, np.ndarray]:
        """``(bits uint64, null bool)`` of the flattened values as doubles (COUNTs as doubles)."""
        if self.typed is not None:
            doubles, tags = self.typed
            null = tags == NULL
            return np.where(null, 0.0, doubles).view(np.uint64), null
        vals = self.value_items
        assert vals is not None  # else given by from_tables
        try:
            arr = pa.array(vals, pa.float64())
        except (pa.ArrowTypeError, pa.ArrowInvalid, TypeError, ValueError, OverflowError):
            arr = pa.array([None if x is None else float(x) for x in vals], pa.float64())
        vnull = np.asarray(arr.is_null(), np.bool_)
        vbits = arr.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64).view(np.uint64)
        return vbits, vnull

    @cached_property
    def values_json(self) -> pa.Array:
        """``json.dumps(values)`` of every alert, as a ``large_string`` array."""
        n = len(self)
        if self.value_labels is None:  # labels json would convert: per alert, as before
            return pa.array([values_json(v) for v in self.values], _S)
        labels = self.value_labels.dictionary_encode()
        label_json = pa.array([values_json(s) for s in labels.dictionary.to_pylist()], _S)
        lj = label_json.take(labels.indices)
        if self.typed is not None:  # the core's typed doubles: by Arrow, no Python per value
            vt = typed_json(*self.typed)
        else:
            assert self.value_items is not None  # else given by from_tables
            vt = pa.array(list(map(repr, self.value_items)), _S)
            bad = np.asarray(pc.invert(pc.match_substring_regex(vt, _JSON_NUMBER)), np.bool_)
            if bad.any():
                at = np.flatnonzero(bad)
                fixed = pa.array([values_json(self.value_items[i]) for i in at.tolist()], _S)
                vt = pc.replace_with_mask(vt, pa.array(bad), fixed)
        entries = pc.binary_join_element_wise(lj, vt, pa.scalar(": ", _S))
        offs = np.zeros(n + 1, np.int64)
        np.cumsum(self.counts, out=offs[1:])
        joined = pc.binary_join(pa.LargeListArray.from_arrays(pa.array(offs), entries), pa.scalar(", ", _S))
        return pc.binary_join_element_wise(pa.scalar("{", _S), joined, pa.scalar("}", _S), pa.scalar("", _S))

    # ---------------------------------------------------------------- as tables (a shard's output)
    def to_tables(self) -> tuple[pa.Table, pa.Table]:
        """The columns as two Arrow tables, what a shard sends the driver
        (:func:`engine.shards.step.encode_output`): one row per alert (its string fields,
        ``as_of``, its value entries' count and the values' JSON text) and one per value entry
        (its label, the value as a double's bits, null); the derived columns are computed where
        this is called -- in a shard's task, not in the driver."""
        vbits, vnull = self.value_floats
        labels = self.value_labels
        if labels is None:  # labels that are not str: as str, as the Avro records have them
            labels = pa.array([str(k) for v in self.values for k in v], _S)
        rows = pa.table(
            {
                "subscription_id": self.subscription_id, "rule_name": self.rule_name,
                "stream": self.stream, "key": self.key, "kind": self.kind,
                "as_of": pa.array(self.as_of, pa.int64()), "counts": pa.array(self.counts, pa.int64()),
                "values_json": self.values_json,
            }
        )  # fmt: skip
        items = pa.table({"label": labels, "bits": pa.array(vbits, pa.uint64()), "null": pa.array(vnull)})
        return rows, items

    @classmethod
    def from_rows(
        cls, rows: pa.Table, items: pa.Table, typed: tuple[np.ndarray, np.ndarray] | None = None
    ) -> AlertColumns:
        """The columns of ``rows``, one per alert (its string fields, plain or dictionary-encoded,
        ``as_of`` and ``counts``, its value entries' count), with ``items``, one per value entry
        (its ``label``), and the entries' values as typed doubles when given (else the derived
        columns are the caller's to set); ValueError when the two tables do not fit together."""
        counts = np.asarray(table_column(rows, "counts"), np.int64)
        if int(counts.sum()) != items.num_rows or (counts < 0).any():
            raise ValueError(f"{int(counts.sum())} value entries counted, {items.num_rows} given")
        return cls(
            subscription_id=large_utf8(table_column(rows, "subscription_id"), "subscription_id"),
            rule_name=large_utf8(table_column(rows, "rule_name"), "rule_name"),
            stream=large_utf8(table_column(rows, "stream"), "stream"),
            key=large_utf8(table_column(rows, "key"), "key"),
            kind=large_utf8(table_column(rows, "kind"), "kind"),
            as_of=np.asarray(table_column(rows, "as_of"), np.int64),
            counts=counts,
            value_labels=large_utf8(table_column(items, "label"), "value label"),
            given_items=None,
            values=[],
            typed=typed,
        )

    @classmethod
    def from_tables(cls, rows: pa.Table, items: pa.Table) -> AlertColumns:
        """The columns :meth:`to_tables` wrote (their derived columns as they came: no per-alert
        work); ValueError when the two tables do not fit together."""
        col = table_column
        out = cls.from_rows(rows, items)
        # the cached derived columns, as computed where the tables were written
        out.__dict__["values_json"] = large_utf8(col(rows, "values_json"), "values")
        out.__dict__["value_floats"] = (
            np.asarray(col(items, "bits"), np.uint64),
            np.asarray(col(items, "null"), np.bool_),
        )
        return out

    @classmethod
    def concat(cls, parts: Sequence[AlertColumns]) -> AlertColumns:
        """``parts`` one after another, as one (through :meth:`to_tables`)."""
        if len(parts) == 1:
            return parts[0]
        tables = [p.to_tables() for p in parts]
        if not tables:
            return cls._build([])
        return cls.from_tables(
            pa.concat_tables([r for r, _ in tables]), pa.concat_tables([i for _, i in tables])
        )

    def sorted_by_as_of(self) -> AlertColumns:
        """The alerts stably sorted by ``as_of`` (``self`` when in order already): each key's
        changes keep their order.  By NumPy and Arrow, no per-alert Python."""
        t = self.as_of
        if len(t) < 2 or not bool((t[1:] < t[:-1]).any()):
            return self
        return self.take(np.argsort(t, kind="stable"))

    def take(self, perm: np.ndarray) -> AlertColumns:
        """The alerts ``perm`` (indices, each at most once) in that order, with their values; by
        Arrow and NumPy."""
        perm = np.asarray(perm, np.int64)
        t = self.as_of
        rows, items = self.to_tables()
        offs = np.zeros(len(t) + 1, np.int64)
        np.cumsum(self.counts, out=offs[1:])
        lens = self.counts[perm]
        starts = np.repeat(offs[:-1][perm] - (np.cumsum(lens) - lens), lens)
        at = starts + np.arange(int(lens.sum()), dtype=np.int64)
        return AlertColumns.from_tables(rows.take(pa.array(perm)), items.take(pa.array(at)))

    def alerts(self) -> list[Alert]:
        """The :class:`~engine.messages.Alert` objects (values read back from their JSON text);
        for a reader that asks one by one, not the sinks' path."""
        f = [c.to_pylist() for c in (self.subscription_id, self.rule_name, self.stream, self.key, self.kind)]
        vals = self.values or [json.loads(v) for v in self.values_json.to_pylist()]
        return [
            Alert(sid, name, stream, key, kind, t, v)
            for sid, name, stream, key, kind, t, v in zip(*f, self.as_of.tolist(), vals, strict=True)
        ]


#: per slot, the last list :meth:`AlertColumns.of` was given and its columns
_LAST: dict[str, tuple[Any, AlertColumns]] = {}
