"""The shards' checkpoint files (engine.shards.json_file): absent is nothing yet, damaged or of
another shape is refused with the file's name and what to do -- for both of its readers."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import CheckpointMismatch
from engine.shards.charts import RequestFile
from engine.shards.json_file import RESTORE_ADVICE, read_json
from engine.shards.strides import StrideFile


def test_an_absent_file_is_the_default_and_a_good_one_is_shaped(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    assert read_json(path, "the test file", -1, len) == -1
    path.write_text("[1, 2, 3]")
    assert read_json(path, "the test file", 0, len) == 3


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('[[1, "s"', "cannot be read"),
        ('{"a": 1}', "not one this engine wrote"),
        ('[[1, "s"]]', "not one this engine wrote"),
    ],
)
def test_chart_requests_damaged_or_of_another_shape_are_refused(
    tmp_path: Path, text: str, reason: str
) -> None:
    f = RequestFile(tmp_path / "chart_requests.json")
    assert f.read() == []
    f.path.write_text(text)
    with pytest.raises(CheckpointMismatch, match=reason) as got:
        f.read()
    assert "the chart requests file" in str(got.value) and str(f.path) in str(got.value)
    assert RESTORE_ADVICE in str(got.value)


def test_requests_written_are_read_back(tmp_path: Path) -> None:
    f = RequestFile(tmp_path / "chart_requests.json")
    f.write([(7, "s1", "AAPL"), (8, "s2", "10.0.0.1")])
    assert f.read() == [(7, "s1", "AAPL"), (8, "s2", "10.0.0.1")]


@pytest.mark.parametrize(
    "text",
    [
        '{"entries": 3}',
        '{"entries": [[5]]}',
        '{"entries": [["5", {}]]}',
        '{"entries": [[5, {"s1": "2"}]]}',
        '{"entries": [[5, {"s1": 0}]]}',
        '{"entries": [[5, {"s1": 2}], [5, {}]]}',
        '{"level": "1", "entries": []}',
        '{"calm": 1.5, "entries": []}',
        '{"pruned": 1, "entries": []}',
    ],
)
def test_a_strides_file_of_another_shape_names_itself(tmp_path: Path, text: str) -> None:
    f = StrideFile(tmp_path / "strides.json")
    f.path.write_text(text)
    with pytest.raises(
        CheckpointMismatch, match="the overload policy's strides file .* not one this engine wrote"
    ):
        f.state()


def test_a_strides_file_as_written_is_read_back(tmp_path: Path) -> None:
    from engine.overload import Overload

    f = StrideFile(tmp_path / "strides.json")
    f.record(3, {"s1": 2, "s2": 4}, Overload(2, 1))
    f.record(9, {}, Overload(0, 0))
    assert f.strides_for(5) == {"s1": 2, "s2": 4} and f.strides_for(9) == {} and f.strides_for(2) == {}
    assert f.state() == Overload(0, 0)
