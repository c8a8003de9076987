"""One shard's micro-batch, and the shards' outputs merged into the batch's (issue #23).

A shard is an :class:`engine.core.EngineCore` over the keys it owns (:mod:`engine.shards.route`),
run on its records with the driver path of the core (:meth:`EngineCore.process`: decode,
validation, ``late`` dead letters, the evaluator with its retained history for PSoup, ROWS
windows) and the whole batch's clock (``span``), so every shard looks up at the lookup times a
single engine would, and the union of the shards' alerts is the single engine's alert log --
``tidewatch backtest`` on the same events (tests/engine/shards).

What a shard changes after :meth:`EngineCore.process` (:func:`run_shard`):

* records it got only for a second key field (``packets``' destination address, routed also to
  the destination's shard: not *primary* here) are not counted as its events, and their ``late``
  dead letters are left to their primary shard: each event counted once, dead-lettered once;
* a stream with several key fields holds, for a rule grouped by one of them, keys it does not
  own (the other field's events brought them, without all their events): their alerts and
  removed keys are dropped; the owner's are exact.

The output crosses from the executors to the driver in the snapshot format
(:mod:`engine.runtime.state_codec`: versioned, runs no code when read), its alerts as two Arrow
tables of columns made in the shard's task (:meth:`AlertColumns.to_tables
<engine.sinks.alert_columns.AlertColumns.to_tables>`: the values' JSON text and doubles computed
there): the driver reads them without an object per alert or per block, and merges the shards'
by Arrow and NumPy (:func:`merge_outputs`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain, compress
from typing import Any

import numpy as np
import pyarrow as pa

from engine.core import EngineCore
from engine.dead_letter import DeadLetters
from engine.decode import STREAMS
from engine.errors import CheckpointMismatch, SnapshotUnreadable
from engine.messages import Alert, AlertBlock, AlertSeq, BatchOutput, LookupBlock
from engine.runtime import state_codec
from engine.shards.capped import cap_merged
from engine.shards.route import PRIMARY, shard_of, split_span
from engine.sinks.alert_columns import AlertColumns
from engine.sources.readers import split_topics, subscription_changes

log = logging.getLogger("tidewatch.engine")
#: streams with several key fields: their events reach the shards of every key field
MULTI_KEY = frozenset(s for s, spec in STREAMS.items() if len(spec.keys) > 1)


@dataclass
class ShardMeta:
    """What the driver learns of a shard with its output (Health, tests, the batch's metrics)."""

    shard: int
    batch_id: int
    applied_until: int | None = None
    watermark: int | None = None
    max_ts: int | None = None
    rules: int = 0
    state_bytes: int = 0
    seconds: float = 0.0  #: the shard's evaluation of the batch (its task's Python part)
    #: where the shard's core came from: ``live`` (kept by the worker), ``caught up`` (the worker's
    #: core brought forward by batches another worker ran) or ``rebuilt`` (from the snapshot)
    how: str = "live"
    pid: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: the batch of the shard's snapshot in Spark's state store after this batch (-1: none yet)
    snapshot_of: int = -1
    #: the size of the snapshot this batch stored in the state store (0: none stored by it)
    snapshot_bytes: int = 0
    #: the whole batch's Kafka offset ranges as the shard's task got them from the Router (every
    #: routing task sends every shard its ranges: :func:`engine.shards.route.merge_ranges` of
    #: them): the driver finds the offsets lost to retention from them (``ShardedEngine``)
    ranges: dict[str, Any] = field(default_factory=dict)
    #: the staleness budgets of the shard's subscriptions that have one (every shard holds every
    #: rule): the driver's overload controller steps through them (:mod:`engine.shards.strides`)
    budgets: dict[str, int] = field(default_factory=dict)
    #: the key page's chart requests of its keys the shard answered after this batch: request id
    #: -> (answer, None) or (None, error code) (:mod:`engine.shards.charts`)
    charts: dict[int, tuple[Any, str | None]] = field(default_factory=dict)
    #: on pane rows (:mod:`engine.shards.panes`), shard 0's only: the parameters of the next batch
    #: (:func:`engine.shards.panes.params_bytes` of :meth:`EngineCore.batch_params` after this
    #: one), which the driver hands to the next batch's routing tasks unread
    next_params: bytes = b""
    #: what the shard evaluated: ``panes`` (the routing tasks' pane rows), ``read again`` (pane
    #: rows made by the shard from the batch read again from Kafka: the routing had no or other
    #: parameters) or ``records`` (``engine_shard_input = "records"``)
    input: str = "records"
    #: what the shard's task did with its Kafka output (``engine_shard_delivery = "tasks"``,
    #: :func:`engine.shards.produce.publish_shard`): ``published``, ``before`` (its marker showed
    #: the batch published by an earlier run), ``empty``; "" when the driver delivers
    published: str = ""


def run_shard(
    core: EngineCore,
    batch_id: int,
    shard: int,
    n: int,
    records: pa.Table,
    span: dict[tuple[str, int], tuple[int, int]],
    topics: dict[str, str],
    strides: dict[str, int] | None = None,
) -> BatchOutput:
    """Shard ``shard`` of ``n`` runs batch ``batch_id``: ``records`` are its routed records
    (:func:`engine.shards.route.route_records`, with the ``primary`` flag), ``span`` the whole
    batch's (:func:`engine.shards.route.merge_spans`: the partitions marked present are the
    core's ``waiting``), ``strides`` the overload policy's for the batch, the driver's decision
    (:mod:`engine.shards.strides`; None: none); see the module docstring."""
    parts = split_topics(records, topics)
    changes = subscription_changes(parts.pop("subscriptions", records.slice(0, 0)))
    streams = {r: t for r, t in parts.items() if r in STREAMS}  # empty ones too: events 0, as one core
    times, waiting = split_span(span)
    out = core.process(batch_id, streams, changes, waiting=waiting, strides=strides or {}, span=times)
    for role, t in streams.items():
        prim = np.asarray(t.column(PRIMARY).to_numpy(zero_copy_only=False), np.bool_)
        if not len(prim) or prim.all():
            continue
        others = set(
            zip(
                t.column("partition").filter(pa.array(~prim)).to_pylist(),
                t.column("offset").filter(pa.array(~prim)).to_pylist(),
                strict=True,
            )
        )
        topic = topics[role]
        keep = [
            i
            for i in range(len(out.dead))
            if out.dead.source_topic[i] != topic
            or (out.dead.source_partition[i], out.dead.source_offset[i]) not in others
        ]
        late_elsewhere = len(out.dead) - len(keep)
        if late_elsewhere:
            out.dead = _take(out.dead, keep)
        out.events[role] = out.events.get(role, 0) - (len(others) - late_elsewhere)
    if n > 1:
        drop_unowned(out, shard, n, any(r.stream in MULTI_KEY for r in core.rules.values()))
    return out


def _take(dead: DeadLetters, idx: list[int]) -> DeadLetters:
    kept = DeadLetters()
    for name in DeadLetters.__dataclass_fields__:
        col = getattr(dead, name)
        setattr(kept, name, [col[i] for i in idx])
    return kept


def drop_unowned(out: BatchOutput, shard: int, n: int, multi_key_rules: bool) -> None:
    """Alerts and removed keys of keys this shard does not own (a stream with several key fields
    brings them; for the others every key a shard holds is its own, and nothing is dropped: the
    alerts are not looked at when no active rule reads such a stream)."""
    if out.alerts and multi_key_rules:
        blocks: list[AlertBlock | LookupBlock | list[Alert]] = []
        for b in out.alerts.blocks():
            assert not isinstance(b, AlertColumns)  # the core makes none
            blocks.append(b)
        of_block = [b.keys if isinstance(b, AlertBlock | LookupBlock) else [a.key for a in b] for b in blocks]
        owned = shard_of(list(chain.from_iterable(of_block)), n) == shard
        mine = owned.tolist()
        if not all(mine):
            # the segments' starts, counted in the alerts kept (the driver's cap reads them)
            before = np.concatenate([[0], np.cumsum(owned, dtype=np.int64)])
            out.segments = [(int(before[at]), seg, part) for at, seg, part in out.segments]
            kept, at = AlertSeq(), 0
            for b, ks in zip(blocks, of_block, strict=True):
                m, at = mine[at : at + len(ks)], at + len(ks)
                if isinstance(b, AlertBlock | LookupBlock):
                    kept.add_block(b if all(m) else b.compress(m))
                else:
                    kept.extend(compress(b, m))
            out.alerts = kept
    for sid, keys in out.removed_keys.items():
        if keys:
            owner = shard_of(keys, n)
            out.removed_keys[sid] = [k for k, o in zip(keys, owner, strict=True) if o == shard]


def encode_output(out: BatchOutput, meta: ShardMeta) -> bytes:
    """A shard's output for the driver, in the snapshot format (no pickle); its alerts as the
    two tables of :meth:`AlertColumns.to_tables` (the cached columns of ``out.alerts`` are
    reused, the output itself is left as it was)."""
    alerts = AlertColumns.of(out.alerts).to_tables() if out.alerts else None
    body = dataclasses.replace(out, alerts=AlertSeq())
    return state_codec.dumps({"out": body, "meta": meta, "alerts": alerts})


def decode_output(data: bytes) -> tuple[BatchOutput, ShardMeta]:
    """What :func:`encode_output` wrote: the output's alerts one block of columns
    (:meth:`AlertColumns.from_tables`); :class:`~engine.errors.SnapshotUnreadable` when damaged."""
    doc = state_codec.loads(data)
    out: BatchOutput = doc["out"]
    if doc.get("alerts") is not None:
        try:
            cols = AlertColumns.from_tables(*doc["alerts"])
        except (ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            raise SnapshotUnreadable(f"a shard's alerts that do not fit together ({exc})") from exc
        out.alerts = AlertSeq()
        out.alerts.add_block(cols)
    return out, doc["meta"]


def meta_of(core: EngineCore, shard: int, batch_id: int, seconds: float, how: str, pid: int) -> ShardMeta:
    meta = ShardMeta(
        shard,
        batch_id,
        core.applied_until,
        core.watermark,
        core.max_ts,
        len(core.rules),
        core.state_nbytes(),
        seconds,
        how,
        pid,
    )
    meta.budgets = core.budgets()
    return meta


def merge_outputs(batch_id: int, outs: Iterable[BatchOutput], cap: int = 0) -> BatchOutput:
    """The batch's output from its shards' (every shard ran the same lookups and rule changes):
    alerts stably by lookup time (each key's changes stay in order: a key is one shard's; the
    shards' tables joined and sorted by Arrow and NumPy, :meth:`AlertSeq.sort_by_as_of`), dead
    letters, events summed, removed subscriptions and rule errors once each.  ``cap`` > 0 (the
    alert cap, ``engine_alert_cap_per_lookup``; the shards ran uncapped): the alerts capped as
    the one core caps them (:func:`engine.shards.capped.cap_merged`)."""
    outs = list(outs)
    merged = BatchOutput(batch_id)
    lookups: set[int] = set()
    errors: dict[str, str] = {}
    keys: dict[str, set[str]] = {}
    for out in outs:
        if cap <= 0:
            merged.alerts.extend(out.alerts)
        merged.dead.extend(out.dead)
        lookups.update(out.lookups)
        for sid in out.removed:
            if sid not in merged.removed:
                merged.removed.append(sid)
        for sid, ks in out.removed_keys.items():
            keys.setdefault(sid, set()).update(ks)
        merged.changed |= out.changed
        for s, k in out.events.items():
            merged.events[s] = merged.events.get(s, 0) + k
        for sid, text in out.rule_errors:
            errors.setdefault(sid, text)
    if cap > 0:
        merged.alerts, merged.withheld = cap_merged(outs, cap)
    merged.alerts.sort_by_as_of()
    if outs:  # every shard ran the batch with the driver's strides
        if any(o.strides != outs[0].strides for o in outs):
            raise CheckpointMismatch(
                f"batch {batch_id}: the shards ran with different strides "
                f"({[o.strides for o in outs][:3]}): the checkpoint's strides file is not the "
                "same for every executor. It must be on storage every executor shares."
            )
        merged.strides, merged.degraded = dict(outs[0].strides), dict(outs[0].degraded)
    merged.lookups = sorted(lookups)
    merged.removed_keys = {sid: sorted(keys.get(sid, ())) for sid in merged.removed}
    merged.rule_errors = list(errors.items())
    return merged
