"""The overload policy's strides file of the sharded engine (engine/shards/strides.py): what each
batch runs with, a batch decided again after a restart, the controller's state kept, a damaged
file refused; the driver's decisions step up under load and back down when calm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.errors import CheckpointMismatch
from engine.overload import Marks, Overload, ladder
from engine.shards.strides import StrideFile


def test_each_batch_runs_with_the_last_entry_from_at_most_its_id(tmp_path: Path) -> None:
    f = StrideFile(tmp_path / "tidewatch" / "strides.json")
    assert f.strides_for(0) == {} and f.state() == Overload()
    f.record(3, {"a": 2}, Overload(1, 0))
    f.record(5, {}, Overload(0, 0))
    assert [f.strides_for(b) for b in (2, 3, 4, 5, 9)] == [{}, {"a": 2}, {"a": 2}, {}, {}]
    assert f.state() == Overload(0, 0)
    # batch 4 run again after a restart (Spark had not committed it): decided again, the entry
    # from 5 it had written is dropped (batch 5 never ran committed)
    f.record(5, {"a": 4, "b": 2}, Overload(2, 0))
    assert [f.strides_for(b) for b in (4, 5, 6)] == [{"a": 2}, {"a": 4, "b": 2}, {"a": 4, "b": 2}]
    assert f.state() == Overload(2, 0)


def test_an_unchanged_decision_does_not_write(tmp_path: Path) -> None:
    f = StrideFile(tmp_path / "strides.json")
    f.record(1, {"a": 2}, Overload(1, 0))
    before = f.path.stat().st_mtime_ns
    f.path.touch()
    touched = f.path.stat().st_mtime_ns
    f.record(2, {"a": 2}, Overload(1, 0))
    assert f.path.stat().st_mtime_ns == touched and touched >= before
    assert len(f._read()["entries"]) == 1


def test_a_damaged_file_is_refused(tmp_path: Path) -> None:
    f = StrideFile(tmp_path / "strides.json")
    f.path.write_text('{"entries": [[1, {"a"')
    with pytest.raises(CheckpointMismatch, match="cannot be read"):
        f.strides_for(1)
    f.path.write_text("[]")
    with pytest.raises(CheckpointMismatch, match="not one this engine wrote"):
        f.state()


def test_the_drivers_decisions_step_up_under_load_and_down_when_calm(tmp_path: Path) -> None:
    f = StrideFile(tmp_path / "strides.json")
    budgets = {"loose": 8_000, "tight": 2_000}
    marks = Marks(high=0.9, low=0.5, patience=2)
    steps = len(ladder(budgets, 1_000))
    assert steps >= 3
    seen = [f.decide(b, budgets, 1.5, 1_000, marks) for b in range(steps + 2)]
    assert seen[0] and seen[-1] == seen[-2]  # one step per batch, up to the top
    assert f.state().level == steps
    assert all(k > 1 for s in seen for k in s.values())
    assert seen[0].keys() == {"loose"}  # the loosest budget first
    assert f.strides_for(steps + 2) == seen[-1]
    assert f.decide(steps + 2, budgets, None, 1_000, marks) == seen[-1]  # no load known: no change
    calm = [f.decide(b, budgets, 0.1, 1_000, marks) for b in range(steps + 3, steps + 3 + 2 * steps)]
    assert calm[-1] == {} and f.state().level == 0
    assert f.strides_for(steps + 3 + 2 * steps) == {}


def test_old_entries_are_dropped_and_a_batch_before_them_refused(tmp_path: Path, monkeypatch: Any) -> None:
    import engine.shards.strides as mod

    monkeypatch.setattr(mod, "KEEP_BATCHES", 10)
    f = StrideFile(tmp_path / "strides.json")
    for b in range(1, 40, 3):
        f.record(b, {"a": 2 if b % 2 else 4}, Overload(1, 0))
    entries = f._read()["entries"]
    assert len(entries) < 13 and entries[0][0] <= 37 - 10
    assert f.strides_for(37) == {"a": 2} and f.strides_for(int(entries[0][0])) == entries[0][1]
    with pytest.raises(CheckpointMismatch, match="keeps only the last 10 batches"):
        f.strides_for(int(entries[0][0]) - 1)
