"""The overload policy over shards: the driver decides the strides, every shard uses them.

The overload policy (:mod:`engine.overload`) spaces the lookups of subscriptions with a staleness
budget when batches take more than their share of the trigger interval.  With shards the load is
the slowest shard's evaluation, which only the driver sees, and every shard must look a
subscription up at the same times (one alert log, one lookup schedule).  So the driver runs the
controller (:func:`engine.overload.decide`) after each delivered batch ``b`` and writes the
strides of batch ``b + 1`` -- before ``foreachBatch`` returns, so before Spark commits ``b`` and
plans ``b + 1`` -- to this file of the engine's checkpoint directory (storage every executor
shares, as the shards' snapshots are); each shard's task reads the strides of its batch from it,
and so does a shard rebuilt from its log (the batches since its snapshot run again with the
strides they ran with: exact).

The file, ``<checkpoint>/tidewatch/strides.json``, replaced whole (:func:`~engine.runtime.snapshot_writer.atomic_write`): the
controller's state after the last decision and ``entries``, ``[from batch, {subscription:
stride}]`` in batch order, one per change of the strides.  A batch's strides are those of the
last entry from at most its id (none: no stride).  Recording from ``b + 1`` drops the entries
from later batches: a batch Spark runs again after a restart (not committed) is decided again,
and no batch after it has been committed yet.  Entries older than ``keep`` batches before the
newest are dropped but the last of them (the shards' logs are a few batches long: their
snapshots come every ``snapshot_every_batches``); a batch older than the entries kept is refused,
never run with a guess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import CheckpointMismatch
from engine.overload import Marks, Overload, batch_strides, decide, ladder
from engine.runtime.snapshot_writer import atomic_write
from engine.shards.json_file import read_json

__all__ = ["StrideFile"]

#: batches of entries kept before the newest: a shard's log (its batches since its last
#: snapshot, taken every ``snapshot_every_batches``) must be shorter; an older batch is refused
KEEP_BATCHES = 1_000


def _shaped(doc: Any) -> dict[str, Any]:
    """The document as :meth:`StrideFile._record` writes it, checked whole -- the controller's
    ``level`` and ``calm`` (integers), ``entries`` of ``[batch, {subscription: stride}]`` in
    increasing batch order, ``pruned`` a boolean -- so that a damaged one is refused when read,
    not met later as a bare error halfway through a batch.  ValueError / TypeError otherwise."""
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise ValueError("no list of entries")
    for name in ("level", "calm"):
        if not isinstance(doc.get(name, 0), int) or isinstance(doc.get(name, 0), bool):
            raise TypeError(f"{name} is not an integer")
    if not isinstance(doc.get("pruned", False), bool):
        raise TypeError("pruned is not true or false")
    last = None
    for i, e in enumerate(doc["entries"]):
        ok = isinstance(e, list) and len(e) == 2 and type(e[0]) is int and isinstance(e[1], dict)
        if not ok or not all(isinstance(k, str) and type(v) is int and v > 0 for k, v in e[1].items()):
            raise ValueError(f"entry {i} is not [batch, {{subscription: stride}}]")
        if last is not None and e[0] <= last:
            raise ValueError(f"entry {i}'s batch {e[0]} does not follow {last}")
        last = e[0]
    return doc


def _state_of(doc: dict[str, Any]) -> Overload:
    return Overload(int(doc.get("level", 0)), int(doc.get("calm", 0)))


class StrideFile:
    """The strides file of one engine checkpoint (module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, Any]:
        return read_json(
            self.path, "the overload policy's strides file", {"level": 0, "calm": 0, "entries": []}, _shaped
        )

    def strides_for(self, batch: int) -> dict[str, int]:
        """The strides batch ``batch`` runs with ({}: none); :class:`CheckpointMismatch` for a
        batch older than the entries kept (a shard's log longer than :data:`KEEP_BATCHES`)."""
        got: dict[str, int] = {}
        doc = self._read()
        if doc.get("pruned") and (not doc["entries"] or batch < int(doc["entries"][0][0])):
            raise CheckpointMismatch(
                f"batch {batch} runs again, but the overload policy's strides file {self.path} "
                f"keeps only the last {KEEP_BATCHES} batches: a shard went that long without a "
                "snapshot. Start the engine with a new checkpoint directory and a new --engine-id."
            )
        for b, st in doc["entries"]:
            if int(b) > batch:
                break
            got = {str(k): int(v) for k, v in st.items()}
        return got

    def state(self) -> Overload:
        """The controller's state after the last decision (level 0 when none was made)."""
        return _state_of(self._read())

    def decide(
        self, batch: int, budgets: dict[str, int], load: float | None, lookup_ms: int, marks: Marks
    ) -> dict[str, int]:
        """The controller fed batch ``batch``'s ``load`` (its slowest shard's evaluation over the
        trigger interval; None: unknown), ``budgets`` the subscriptions' that declared one: the
        strides of batch ``batch + 1``, recorded (:meth:`record`) and returned."""
        doc = self._read()
        state = decide(_state_of(doc), load, len(ladder(budgets, lookup_ms)), marks)
        strides, _ = batch_strides(state.level, budgets, lookup_ms)
        self._record(doc, batch + 1, strides, state)
        return strides

    def record(self, batch: int, strides: dict[str, int], state: Overload) -> None:
        """Batch ``batch`` and the ones after it run with ``strides`` (until the next record);
        ``state``: the controller's after this decision.  Written only when something changed."""
        self._record(self._read(), batch, strides, state)

    def _record(self, doc: dict[str, Any], batch: int, strides: dict[str, int], state: Overload) -> None:
        entries = [e for e in doc["entries"] if int(e[0]) < batch]
        current = entries[-1][1] if entries else {}
        if current != strides:
            entries.append([batch, dict(sorted(strides.items()))])
        old = [i for i, e in enumerate(entries) if int(e[0]) < batch - KEEP_BATCHES]
        pruned = bool(doc.get("pruned")) or len(old) > 1
        if len(old) > 1:
            entries = entries[old[-1] :]
        new = {"level": state.level, "calm": state.calm, "entries": entries, "pruned": pruned}
        if new == doc:
            return
        atomic_write(self.path, json.dumps(new).encode())
