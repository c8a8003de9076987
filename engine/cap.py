"""The per-subscription cap on alerts per lookup (``engine_alert_cap_per_lookup``; off: 0).

When one subscription's result changes at one lookup time ``tau`` by more than ``cap`` keys (a
rule subscribed with a threshold everything crosses, a market-wide move), the alert log and the
``alerts`` topic get the first ``cap`` of its alerts in the engine's order (key order; a new or
changed rule's ENTERs before its EXITs) and ONE record saying how many were withheld:

    Alert(sid, rule_name, stream, key="", kind="CAPPED", as_of=tau,
          values={"withheld": n, "withheld_enter": e, "withheld_exit": x, "cap": cap})

(its stable id ``sid||CAPPED|tau`` is unique: a real alert's kind is ENTER or EXIT).  The
withheld alerts, with their values, go to :attr:`engine.messages.BatchOutput.withheld`: the
sinks still apply them to ``current_results`` and the compacted ``results`` topic, which stay
exact (docs/engine.md, "Alert cap").

The budget is per (subscription, lookup time) over the whole batch: a subscription changed twice
in one batch (two versions diffed at the same time) shares one cap and one CAPPED record.  So for
every (subscription, key) the alerts kept precede the ones withheld in the engine's order, and the
kept alerts followed by the withheld ones, stably sorted by ``as_of``, are every change in an
order where each (subscription, key)'s last change is its last (what the sinks rely on).

Pure: no I/O, no NumPy; cap off means this module is not called (the output is unchanged).
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from engine.messages import CAPPED, Alert, BatchOutput

__all__ = ["CAPPED", "cap_alerts", "capped_record", "mark_segment", "republished_results"]

#: the parts of a segment (:attr:`engine.messages.BatchOutput.segments`): a lookup's own changes,
#: in (subscription, key, kind) order; a whole-result diff, per subscription ENTERs then EXITs,
#: each in key order
LOOKUP_PART, DIFF_PART = 0, 1


def mark_segment(out: BatchOutput, part: int, *, same: bool = False) -> None:
    """The alerts appended to ``out`` from here on are ``part`` of a new segment (``same``: of
    the segment marked last) -- where the core caps (:func:`cap_alerts`): each lookup, each new
    rule's diff.  Every shard of a sharded engine runs the same lookups and rule changes, so the
    numbers agree across shards (:mod:`engine.shards.capped`)."""
    seg = out.segments[-1][1] if out.segments else -1
    out.segments.append((len(out.alerts), seg if same else seg + 1, part))


def capped_record(like: Alert, tau: int, withheld: int, withheld_enter: int, cap: int) -> Alert:
    """The CAPPED record of ``like``'s subscription at ``tau`` (see the module docstring)."""
    values: dict[str, float | int | None] = {
        "withheld": withheld,
        "withheld_enter": withheld_enter,
        "withheld_exit": withheld - withheld_enter,
        "cap": cap,
    }
    return Alert(like.subscription_id, like.rule_name, like.stream, "", CAPPED, tau, values)


def _merged(old: Alert, withheld: int, withheld_enter: int) -> Alert:
    """``old`` (a CAPPED record) counting ``withheld`` more alerts, ``withheld_enter`` of them ENTERs."""
    v = old.values
    n, e = int(v["withheld"] or 0) + withheld, int(v["withheld_enter"] or 0) + withheld_enter
    return capped_record(old, old.as_of, n, e, int(v["cap"] or 0))


def cap_alerts(out: BatchOutput, first: int, cap: int) -> None:
    """Cap the alerts ``out.alerts[first:]`` (just made by one lookup or one rule's diff, values
    attached; each subscription's alerts in one run) at ``cap`` per (subscription, lookup time),
    counting what this batch kept before (``out.cap_state``): the alerts past the cap move to
    ``out.withheld`` (in order) and a CAPPED record follows the kept ones of their subscription
    (or the one already made for it in this batch counts them).  ``cap <= 0``: nothing done."""
    seg = out.alerts[first:]
    if cap <= 0 or not seg:
        return
    kept: list[Alert] = []
    for (sid, tau), grp in groupby(seg, key=lambda a: (a.subscription_id, a.as_of)):
        items = list(grp)
        state = out.cap_state.setdefault((sid, tau), [0, -1])  # [alerts kept, CAPPED record's index]
        room = max(cap - state[0], 0)
        if len(items) <= room:
            kept.extend(items)
            state[0] += len(items)
            continue
        kept.extend(items[:room])
        state[0] += room
        held = items[room:]
        out.withheld.extend(held)
        enters = sum(a.kind == "ENTER" for a in held)
        at = state[1]
        if at < 0:
            state[1] = first + len(kept)
            kept.append(capped_record(items[0], tau, len(held), enters, cap))
        elif at >= first:  # made in this segment (its subscription's alerts came in two runs)
            kept[at - first] = _merged(kept[at - first], len(held), enters)
        else:
            out.alerts[at] = _merged(out.alerts[at], len(held), enters)
    out.alerts[first:] = kept


def republished_results(
    rows: list[dict[str, Any]],
    withheld: dict[str, list[str]],
    current: dict[tuple[str, str], tuple[int, dict[str, Any]]],
) -> list[dict[str, Any]] | None:
    """The result changes of a batch re-published from PostgreSQL (:meth:`engine.app.EngineApp.recover`),
    as alert rows (:meth:`engine.sinks.store.Store.alerts_of_batch`'s form), or None when it
    withheld nothing (its alert rows are its result changes).  ``withheld``: the batch's
    ``engine_batches.withheld``; ``current``: ``current_results`` of those keys, (subscription,
    key) -> (since ms, values) -- the state after the batch, since only the last committed batch is
    ever re-published, before any later commit.  The rows but the CAPPED ones, then per withheld
    key its state now: present (kind ENTER, ``as_of`` its ``since``, its values) or absent (kind
    EXIT: ``present=false`` and a tombstone; ``as_of`` the latest CAPPED record of its
    subscription in the batch)."""
    if not withheld:
        return None
    out = [r for r in rows if r["kind"] != CAPPED]
    capped_at: dict[str, int] = {}
    for r in rows:
        if r["kind"] == CAPPED:
            capped_at[r["subscription_id"]] = max(capped_at.get(r["subscription_id"], r["as_of"]), r["as_of"])
    for sid, keys in withheld.items():
        for key in keys:
            got = current.get((sid, key))
            if got is None:
                at = capped_at.get(sid, max(capped_at.values(), default=0))
                out.append({"id": f"{sid}|{key}|EXIT|{at}", "subscription_id": sid, "key": key,
                            "kind": "EXIT", "as_of": at, "values": {}})  # fmt: skip
            else:
                out.append({"id": f"{sid}|{key}|ENTER|{got[0]}", "subscription_id": sid, "key": key,
                            "kind": "ENTER", "as_of": got[0], "values": dict(got[1])})  # fmt: skip
    return out
