"""Where the direct Kafka source resumes after a stop or a crash (``engine.sources.direct``).

Pure file-system logic, no services: the positions files and offset logs are written as the
source and :class:`engine.app.EngineApp` write them, with the crash points in between."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from engine.sources.direct import resume_point


def app_at(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(state_dir=tmp_path / "tidewatch")


def write_log(app: SimpleNamespace, b: int, ranges: dict[str, dict[str, list[int]]]) -> None:
    d = app.state_dir / "batches"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{b:012d}.json").write_text(json.dumps(ranges))


def write_positions(app: SimpleNamespace, b: int, pos: dict[str, dict[str, int]]) -> None:
    d = app.state_dir / "positions"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{b:012d}.json").write_text(json.dumps(pos))


def test_fresh_checkpoint_starts_at_batch_zero_from_the_earliest_offsets(tmp_path: Path) -> None:
    assert resume_point(app_at(tmp_path)) == (0, {})


def test_resumes_after_the_newest_logged_batch(tmp_path: Path) -> None:
    app = app_at(tmp_path)
    write_positions(app, 0, {"t": {"0": 10, "1": 5}, "s": {"0": 3}})
    write_log(app, 0, {"t": {"0": [0, 9], "1": [0, 4]}, "s": {"0": [0, 2]}})
    write_positions(app, 1, {"t": {"0": 20, "1": 5}, "s": {"0": 3}})
    write_log(app, 1, {"t": {"0": [10, 19]}})
    assert resume_point(app) == (2, {"t": {"0": 20, "1": 5}, "s": {"0": 3}})


def test_positions_of_a_batch_never_handed_over_are_ignored(tmp_path: Path) -> None:
    """Crash after the positions of batch 2 were written, before its offset log: batch 2 was
    never evaluated, so its records are read again, as batch 2."""
    app = app_at(tmp_path)
    write_positions(app, 1, {"t": {"0": 20}})
    write_log(app, 1, {"t": {"0": [10, 19]}})
    write_positions(app, 2, {"t": {"0": 35}})
    assert resume_point(app) == (2, {"t": {"0": 20}})


def test_logged_batches_without_positions_add_their_ranges(tmp_path: Path) -> None:
    """A checkpoint written by Spark's source (offset logs only), or logs newer than the newest
    positions file: the positions are the offsets after each partition's last logged record."""
    app = app_at(tmp_path)
    write_log(app, 0, {"t": {"0": [0, 9], "1": [0, 4]}})
    write_log(app, 1, {"t": {"0": [10, 19]}, "s": {"0": [0, 0]}})
    assert resume_point(app) == (2, {"t": {"0": 20, "1": 5}, "s": {"0": 1}})
    write_positions(app, 1, {"t": {"0": 20, "1": 5}, "s": {"0": 1}})
    write_log(app, 2, {"t": {"1": [7, 8]}})  # offsets 5 and 6: transaction markers
    assert resume_point(app) == (3, {"t": {"0": 20, "1": 9}, "s": {"0": 1}})
