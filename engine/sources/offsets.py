"""Which Kafka offsets a micro-batch covers: Spark's offset log and the engine's batch log.

Spark's Kafka source writes, before it runs micro-batch ``N``, the end offsets of every
partition of every subscribed topic to its offset log ``<spark checkpoint>/offsets/N`` (a
write-ahead log: a restarted query re-runs batch ``N`` over exactly these offsets).  Batch
``N`` covers ``[end of N-1, end of N)`` per partition.  The file is ``v1``, a line of batch
metadata, then one line per source -- for the Kafka source a JSON object
``{topic: {partition: end offset}}`` (``-`` for a source with no offsets yet).

The engine logs, before it commits batch ``N``, a :class:`BatchLog` in
``<checkpoint>/tidewatch/batches/N.json``: the ``[first, last]`` offsets of the records it
read (what a restart re-reads, :func:`engine.sources.readers.read_ranges`) and Spark's end
offsets of the batch.  The end offsets serve twice:

* with ``waiting`` (which partitions had records written but not yet readable), so that
  such a partition no record has come from yet holds the watermark back for one batch
  (:meth:`engine.core.EngineCore.process`); a replay from the log makes the same decision;
* **a batch is recognised by the offsets it covers, not by its id** (:func:`check_batch`): a
  re-delivered batch id is skipped only when Spark's offsets for it are the ones the state
  holds; otherwise the state and Spark's checkpoint disagree (a checkpoint deleted, or
  restored from an older backup): :func:`checkpoint_agrees` finds it at start, and the engine
  replaces Spark's checkpoint by one that starts at the state's end offsets (an
  :class:`Epoch`), so exactly the offsets after the state are read; found during a run, the
  engine stops rather than skip batches it never processed (DESIGN: "when state and
  checkpoint disagree, replay or refuse to start; never skip").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import CheckpointMismatch

#: ``{topic: {partition: offset}}``
Ends = dict[str, dict[int, int]]
#: ``{topic: {partition: [first, last]}}`` (as JSON writes it: partitions as str)
Ranges = dict[str, dict[str, list[int]]]


def spark_end_offsets(spark_checkpoint: Path, batch_id: int) -> Ends | None:
    """The end offsets of micro-batch ``batch_id`` from Spark's offset log (None if Spark has
    no log of that batch -- e.g. the checkpoint was deleted -- or it has no Kafka offsets)."""
    path = Path(spark_checkpoint) / "offsets" / str(int(batch_id))
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 3 or lines[2].strip() in ("", "-"):
        return None
    doc = json.loads(lines[2])
    return {str(t): {int(p): int(o) for p, o in ps.items()} for t, ps in doc.items()}


def last_spark_batch(spark_checkpoint: Path) -> int | None:
    """The newest batch id in Spark's offset log (None: no offset log -- a new checkpoint)."""
    d = Path(spark_checkpoint) / "offsets"
    if not d.is_dir():
        return None
    ids = [int(f.name) for f in d.iterdir() if f.name.isdigit()]
    return max(ids) if ids else None


@dataclass
class BatchLog:
    """What the engine logs of one batch before committing it (see module docstring)."""

    ranges: Ranges
    #: Spark's end offsets of the batch (None in a log written before they were kept)
    ends: Ends | None = None
    #: (stream, partition)s no event had come from with records written but not yet readable
    #: when the batch was taken (:meth:`engine.core.EngineCore.process` ``waiting``)
    waiting: list[tuple[str, int]] = field(default_factory=list)

    def to_json(self) -> bytes:
        ends = (
            None
            if self.ends is None
            else {t: {str(p): o for p, o in ps.items()} for t, ps in self.ends.items()}
        )
        waiting = [list(k) for k in self.waiting]
        return json.dumps({"ranges": self.ranges, "ends": ends, "waiting": waiting}).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> BatchLog:
        """Read a log (also the older form: the ranges alone, no ``ends``)."""
        doc = json.loads(data)
        if {"ranges", "ends"} <= set(doc) and isinstance(doc["ranges"], dict):
            ends = doc["ends"]
            return cls(
                doc["ranges"],
                None
                if ends is None
                else {t: {int(p): int(o) for p, o in ps.items()} for t, ps in ends.items()},
                [(str(st), int(p)) for st, p in doc.get("waiting", [])],
            )
        return cls(doc, None)

    @classmethod
    def read(cls, path: Path) -> BatchLog:
        return cls.from_json(Path(path).read_bytes())


def stream_partitions(
    ends: Ends | None, topics: dict[str, str], streams: Collection[str]
) -> list[tuple[str, int]] | None:
    """``(stream, partition)`` of every partition of the event streams' topics in ``ends``
    (``topics``: role -> topic name); None when ``ends`` is None (not known)."""
    if ends is None:
        return None
    by_topic = {t: role for role, t in topics.items() if role in streams}
    return sorted((by_topic[t], p) for t, ps in ends.items() if t in by_topic for p in ps)


def check_batch(batch_id: int, spark_ends: Ends | None, logged: BatchLog | None, *, where: str) -> None:
    """Refuse a re-delivered batch id whose offsets are not the ones the state holds.

    ``spark_ends``: Spark's end offsets of ``batch_id``; ``logged``: the engine's log of the
    batch with that id.  Equal end offsets: the same batch, re-delivered after a restart (the
    caller skips it).  Otherwise raise :class:`CheckpointMismatch` (``where`` names the
    checkpoint and state directories for the message)."""
    if logged is not None and logged.ends is not None and spark_ends == logged.ends:
        return
    got = "no offsets" if spark_ends is None else json.dumps(spark_ends, sort_keys=True)
    had = "no offset log" if logged is None else json.dumps(logged.ends, sort_keys=True)
    raise CheckpointMismatch(
        f"Spark's checkpoint and the engine's state disagree about batch {batch_id}: Spark's batch "
        f"covers up to {got}, the state's batch {batch_id} covered up to {had}. Spark's checkpoint "
        f"was deleted or restored from another point in time ({where}). Batches are never "
        "skipped on their id alone: the engine stops; start it again and it replaces Spark's "
        "checkpoint with one that starts where its state ends (the old one is kept aside)."
    )


@dataclass
class Epoch:
    """Which Spark checkpoint the engine's batch ids follow: engine batch id = Spark's batch id
    + ``base``.  A new epoch starts when the engine replaces a Spark checkpoint that disagrees
    with its state (:func:`checkpoint_agrees`): the new checkpoint's batch 0 is the state's next
    batch, and it starts at ``start``, the state's end offsets (None: the topics' beginning)."""

    base: int = 0
    start: Ends | None = None

    def to_json(self) -> bytes:
        start = (
            None
            if self.start is None
            else {t: {str(p): o for p, o in ps.items()} for t, ps in self.start.items()}
        )
        return json.dumps({"base": self.base, "start": start}).encode()

    @classmethod
    def read(cls, path: Path) -> Epoch:
        """The epoch in ``path`` (the first epoch when there is no file)."""
        try:
            doc = json.loads(Path(path).read_bytes())
        except FileNotFoundError:
            return cls()
        start = doc.get("start")
        return cls(
            int(doc["base"]),
            None
            if start is None
            else {t: {int(p): int(o) for p, o in ps.items()} for t, ps in start.items()},
        )


def checkpoint_agrees(
    state_batch: int,
    state_ends: Ends | None,
    newest_spark: int | None,
    epoch: Epoch,
    spark_ends: Callable[[int], Ends | None],
) -> bool:
    """Whether Spark's checkpoint can carry on from the engine's state.

    ``state_batch``: the state's last batch (-1: none) and ``state_ends`` its end offsets (None:
    not known -- a log of an older engine, then the batch ids are trusted); ``newest_spark``:
    the newest batch of Spark's offset log (None: no checkpoint) and ``spark_ends(m)`` the end
    offsets of its batch ``m``.  Spark next runs its newest batch again (if not committed) or
    the one after it, so they agree when that batch is the state's last one with the same end
    offsets, or the state's next one starting where the state ended.  Anything else -- a
    checkpoint deleted, or older or newer than the state -- would skip or repeat offsets."""
    if newest_spark is None:
        return state_batch < 0
    e = newest_spark + epoch.base
    if e not in (state_batch, state_batch + 1):
        return False
    if state_batch < 0:
        return newest_spark == 0 and epoch.start is None
    if state_ends is None:
        return True
    if e == state_batch:
        return spark_ends(newest_spark) == state_ends
    before = epoch.start if newest_spark == 0 else spark_ends(newest_spark - 1)
    return before == state_ends


def starting_offsets(start: Ends | None, partitions: dict[str, list[int]]) -> str:
    """Spark's ``startingOffsets`` for a checkpoint that starts at ``start`` (the state's end
    offsets; None: ``earliest``): JSON naming every partition of ``partitions`` (topic -> its
    partitions now; Spark requires them all), -2 (earliest) for one the state has no offset of
    (a partition added since)."""
    if start is None:
        return "earliest"
    return json.dumps(
        {t: {str(p): int(start.get(t, {}).get(p, -2)) for p in sorted(ps)} for t, ps in partitions.items()}
    )
