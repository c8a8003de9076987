"""The alert cap over a sharded batch: the shards' alerts capped as the one core caps them.

The cap (:mod:`engine.cap`, ``engine_alert_cap_per_lookup``) keeps, per (subscription, lookup
time), the first ``cap`` alerts in the engine's order and one CAPPED record for the rest.  A
subscription's alerts at one lookup come from every shard, so no shard can cap them: the shards
run uncapped and record where each segment of their alerts starts
(:attr:`engine.messages.BatchOutput.segments`: one per lookup and per new rule's whole-result
diff, numbered alike in every shard, as every shard runs the batch's lookups and rule changes).
The driver puts the union of the shards' alerts in the one core's order -- by segment, part
(a lookup's own changes before the whole-result diffs of the rules added at it), subscription,
then (key, kind) for a lookup's changes and (kind, key) for a diff (ENTERs, then EXITs, each in
key order) -- and caps it: per (subscription, lookup time) the first ``cap`` are kept, the rest
withheld, counted in one CAPPED record (:func:`engine.cap.capped_record`).  So the kept alerts,
the CAPPED records and the withheld alerts are the one core's (tests/engine/shards/test_step.py).

The order, the ranks and the kept / withheld split are Arrow and NumPy; Python runs per CAPPED
record, and per withheld alert for :attr:`~engine.messages.BatchOutput.withheld`'s Alert
objects (as in the one core).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.cap import LOOKUP_PART, capped_record
from engine.errors import SnapshotUnreadable
from engine.messages import Alert, AlertSeq, BatchOutput
from engine.sinks.alert_columns import AlertColumns

__all__ = ["cap_merged"]


def _segments_of(out: BatchOutput, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per alert of ``out`` (``n`` of them) its segment and part."""
    if not out.segments or out.segments[0][0] != 0:
        raise SnapshotUnreadable(f"a shard's {n} alerts with segments {out.segments[:3]}...: not from 0")
    starts = np.array([s for s, _, _ in out.segments], np.int64)
    if (np.diff(starts) < 0).any() or starts[-1] > n:
        raise SnapshotUnreadable("a shard's alert segments out of order")
    at = np.searchsorted(starts, np.arange(n, dtype=np.int64), side="right") - 1
    segs = np.array([g for _, g, _ in out.segments], np.int64)[at]
    parts = np.array([p for _, _, p in out.segments], np.int8)[at]
    return segs, parts


def _ranks(sids: pa.Array, times: np.ndarray) -> np.ndarray:
    """Per alert (in order) how many alerts of its (subscription, ``as_of``) come before it."""
    n = len(times)
    codes = np.asarray(pc.dictionary_encode(sids).indices.to_numpy(zero_copy_only=False), np.int64)
    t_vals, t_codes = np.unique(times, return_inverse=True)
    group = codes * len(t_vals) + t_codes.astype(np.int64)
    order = np.argsort(group, kind="stable")
    g = group[order]
    first = np.ones(n, np.bool_)
    first[1:] = g[1:] != g[:-1]
    run_start = np.maximum.accumulate(np.where(first, np.arange(n, dtype=np.int64), 0))
    ranks = np.empty(n, np.int64)
    ranks[order] = np.arange(n, dtype=np.int64) - run_start
    return ranks


def cap_merged(outs: Sequence[BatchOutput], cap: int) -> tuple[AlertSeq, list[Alert]]:
    """The kept alerts with the CAPPED records, and the withheld alerts (in the one core's
    order), of the shards' uncapped outputs ``outs`` of one batch (module docstring)."""
    parts_cols, segs, parts = [], [], []
    for out in outs:
        if not len(out.alerts):
            continue
        cols = AlertColumns.of(out.alerts, slot=None)
        s, p = _segments_of(out, len(cols))
        parts_cols.append(cols)
        segs.append(s)
        parts.append(p)
    if not parts_cols:
        return AlertSeq(), []
    cols = AlertColumns.concat(parts_cols)
    part = np.concatenate(parts)
    lookup = pa.array(part == LOOKUP_PART)
    order = pc.sort_indices(
        pa.table(
            {
                "seg": np.concatenate(segs),
                "part": part,
                "sid": cols.subscription_id,
                "first": pc.if_else(lookup, cols.key, cols.kind),
                "second": pc.if_else(lookup, cols.kind, cols.key),
            }
        ),
        sort_keys=[("seg", "ascending"), ("part", "ascending"), ("sid", "ascending"),
                   ("first", "ascending"), ("second", "ascending")],
    )  # fmt: skip
    cols = cols.take(np.asarray(order, np.int64))
    ranks = _ranks(cols.subscription_id, cols.as_of)
    held = ranks >= cap
    kept = AlertSeq()
    if not held.any():
        kept.add_block(cols)
        return kept, []
    kept_cols = cols.take(np.flatnonzero(~held))
    held_cols = cols.take(np.flatnonzero(held))
    withheld = held_cols.alerts()
    if len(kept_cols):
        kept.add_block(kept_cols)
    # one CAPPED record per (subscription, lookup time) that withheld any, in the order met
    counts: dict[tuple[str, int], list[int]] = {}
    first_of: dict[tuple[str, int], Alert] = {}
    for a in withheld:
        got = counts.setdefault((a.subscription_id, a.as_of), [0, 0])
        got[0] += 1
        got[1] += a.kind == "ENTER"
        first_of.setdefault((a.subscription_id, a.as_of), a)
    kept.extend(capped_record(first_of[g], g[1], n, e, cap) for g, (n, e) in counts.items())
    return kept, withheld
