"""A shard's snapshot file (engine/shards/processor.py, no Spark): written when due by the shard's
writer, named in the state store by the shard's next batch with the log trimmed after it, older
files than the committed one deleted; restored only when the named file is there and whole."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from engine.core import EngineCore, default_core
from engine.errors import CheckpointMismatch
from engine.shards.processor import _WRITERS, ShardProcessor
from engine.sources.readers import split_topics, subscription_changes
from tests.engine.shards.support import TOPICS, alert_rows, scenario_batches
from tidewatch.settings import Settings, get_settings


class _Value:
    """The two calls of a Spark value state the processor makes, over a Python value."""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> Any:
        return self.value

    def update(self, value: Any) -> None:
        self.value = value


class _List:
    """The calls of a Spark list state the processor makes, over a Python list."""

    def __init__(self, items: list[Any]) -> None:
        self.items = list(items)

    def exists(self) -> bool:
        return bool(self.items)

    def get(self) -> list[Any]:
        return list(self.items)

    def clear(self) -> None:
        self.items = []

    def put(self, items: list[Any]) -> None:
        self.items = list(items)


def _settings(fork: bool) -> Settings:
    return get_settings().model_copy(
        update={
            "pane_ms": 1000,
            "allowed_lateness_ms": 2_000,
            "snapshot_every_batches": 2,
            "engine_snapshot_fork": fork,
        }
    )


def _core(s: Settings, batches: int) -> EngineCore:
    core = default_core(s)
    for b, tbl in enumerate(scenario_batches()[0][:batches]):
        parts = split_topics(tbl, TOPICS)
        core.process(b, parts, subscription_changes(parts.pop("subscriptions")))
    return core


def _processor(s: Settings, tmp: Path, snapshot: Any, log: list[Any]) -> ShardProcessor:
    p = ShardProcessor(s, f"{tmp}|e", "run-1", [0], TOPICS, "127.0.0.1:1", str(tmp / "shards"))
    p.snapshot, p.log = _Value(snapshot), _List(log)  # type: ignore[assignment]
    return p


@pytest.mark.parametrize("fork", [False, True])
def test_a_written_snapshot_is_named_by_the_next_batch(tmp_path: Path, fork: bool) -> None:
    s = _settings(fork)
    core = _core(s, 6)
    folder = tmp_path / "shards" / "shard-0"
    folder.mkdir(parents=True)
    (folder / f"{1:012d}.bin").write_bytes(b"old")  # older than the committed snapshot (3): deleted
    (folder / f"{3:012d}.bin").write_bytes(b"x" * 10)
    log = [(b, b"{}", b"") for b in (4, 5, 6)]
    p = _processor(s, tmp_path, (3, f"{3:012d}.bin", 10), log)
    since, start_s, named = p._snapshot(0, 5, core)  # due: 5 - 3 >= 2
    assert (since, named) == (3, 0) and start_s > 0
    _, writer = _WRITERS[(p.engine, 0)]
    deadline = time.monotonic() + 60
    while writer.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writer.written and writer.written[-1][0] == 5
    since, start_s, named = p._snapshot(0, 6, core)
    size = (folder / f"{5:012d}.run-1.bin").stat().st_size
    assert since == 5 and named == size > 1000 and start_s == 0.0
    assert p.snapshot.get() == (5, f"{5:012d}.run-1.bin", size)
    assert [int(e[0]) for e in p.log.get()] == [6]  # the batches after the snapshot
    assert sorted(f.name for f in folder.glob("*.bin")) == [f"{3:012d}.bin", f"{5:012d}.run-1.bin"]
    restored = p._restore(0)
    assert restored.last_batch == core.last_batch == 5 and len(restored.rules) == len(core.rules)
    nxt = scenario_batches()[0][6]  # both go on the same
    outs = []
    for c in (core, restored):
        parts = split_topics(nxt, TOPICS)
        outs.append(alert_rows(c.process(6, parts, subscription_changes(parts.pop("subscriptions"))).alerts))
    assert outs[0] == outs[1] and outs[0]


def test_a_missing_or_cut_snapshot_file_is_refused(tmp_path: Path) -> None:
    s = _settings(False)
    core = _core(s, 3)
    data = core.to_bytes()
    p = _processor(s, tmp_path, (2, f"{2:012d}.bin", len(data)), [])
    with pytest.raises(CheckpointMismatch, match="missing"):
        p._restore(0)
    path = tmp_path / "shards" / "shard-0" / f"{2:012d}.bin"
    path.parent.mkdir(parents=True)
    path.write_bytes(data[:-10])
    with pytest.raises(CheckpointMismatch, match=f"{len(data) - 10} bytes"):
        p._restore(0)
    path.write_bytes(data)
    assert p._restore(0).last_batch == core.last_batch


def test_a_snapshot_written_in_another_worker_of_the_run_is_named_and_none_of_another_run(
    tmp_path: Path,
) -> None:
    """Spark runs a shard's next batch in any idle Python worker: the file another worker of the
    same run wrote (whole: under its final name) is named by it; a file of an earlier run of the
    query, or of the batch running now or later, is not."""
    s = _settings(False)
    core = _core(s, 6)
    folder = tmp_path / "shards" / "shard-0"
    folder.mkdir(parents=True)
    data = core.to_bytes()
    (folder / f"{4:012d}.run-1.bin").write_bytes(data)  # the other worker's, of batch 4
    (folder / f"{5:012d}.run-0.bin").write_bytes(b"an earlier run's")
    (folder / f"{6:012d}.run-1.bin").write_bytes(b"this batch's: not before it")
    (folder / f"{4:012d}.run-1.bin.123.tmp").write_bytes(b"half")  # a temporary: never named
    log = [(b, b"{}", b"") for b in (2, 3, 4, 5)]
    p = _processor(s, tmp_path, (1, f"{1:012d}.bin", 10), log)
    _WRITERS.pop((p.engine, 0), None)  # this worker wrote nothing
    since, _, named = p._snapshot(0, 6, core)
    assert (since, named) == (4, len(data))
    assert p.snapshot.get() == (4, f"{4:012d}.run-1.bin", len(data))
    assert [int(e[0]) for e in p.log.get()] == [5]
    assert p._restore(0).last_batch == core.last_batch
    # no file of this run after the named one and before the batch: nothing else named
    other = _processor(s, tmp_path, (4, f"{4:012d}.run-1.bin", len(data)), [(5, b"{}", b"")])
    other.run = "run-2"
    _WRITERS.pop((other.engine, 0), None)
    assert other._snapshot(0, 7, core)[:1] == (4,) and other.snapshot.get()[0] == 4  # type: ignore[index]
