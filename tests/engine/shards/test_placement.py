"""Where shards run: the warning for several shards on Spark's one local executor
(engine.shards.engine.placement_warning; docs/engine.md, "Where shards run")."""

from __future__ import annotations

import pytest

from engine.shards.engine import placement_warning
from engine.spark_session import local_task_slots


@pytest.mark.parametrize("master", ["local[2]", "local[4, 3]", " local[8] "])
def test_several_shards_on_one_local_executor_of_several_cores_are_warned_about(master: str) -> None:
    text = placement_warning(master, 2)
    assert text is not None
    assert "2 shards" in text and "--shards 1" in text and "Where shards run" in text


@pytest.mark.parametrize(
    ("master", "shards"),
    [
        ("local[2]", 1),  # one shard keeps its worker
        ("local[2]", 0),
        ("local", 2),  # one core: one task at a time
        ("local[1]", 3),
        ("local-cluster[2,1,1024]", 2),  # one core per executor
        ("spark://127.0.0.1:7077", 4),  # a cluster: Spark places the shards by their state stores
    ],
)
def test_no_warning_where_each_shard_keeps_its_worker(master: str, shards: int) -> None:
    assert placement_warning(master, shards) is None


def test_local_task_slots_of_each_master_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert local_task_slots("local") == 1
    assert local_task_slots("local[3]") == 3 and local_task_slots("local[3,2]") == 3
    assert local_task_slots("local[*]") == 4 and placement_warning("local[*]", 2) is not None
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert local_task_slots("local[*]") == 1 and placement_warning("local[*]", 2) is None
    assert local_task_slots("local-cluster[2,1,1024]") is None
    assert local_task_slots("spark://127.0.0.1:7077") is None
