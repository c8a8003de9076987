"""engine.sources.offsets: Spark's offset log, the engine's batch log, and the batch check."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import CheckpointMismatch, EngineError
from engine.sources.offsets import (
    BatchLog,
    check_batch,
    last_spark_batch,
    spark_end_offsets,
    stream_partitions,
)

#: the shape Spark 4's offset log has (copied from a checkpoint the engine wrote)
SPARK_LOG = (
    "v1\n"
    '{"batchWatermarkMs":0,"batchTimestampMs":1795580851608,"conf":{"spark.sql.shuffle.partitions":"4"}}\n'
    '{"packets-x":{"0":2967,"1":3035},"trades-x":{"0":6091,"1":5917},"subscriptions-x":{"0":7}}'
)
TOPICS = {"trades": "trades-x", "packets": "packets-x", "subscriptions": "subscriptions-x"}


def write_spark(tmp: Path, batch: int, text: str = SPARK_LOG) -> Path:
    d = tmp / "spark"
    (d / "offsets").mkdir(parents=True, exist_ok=True)
    (d / "offsets" / str(batch)).write_text(text)
    return d


def test_spark_end_offsets_reads_every_partition(tmp_path: Path) -> None:
    d = write_spark(tmp_path, 7)
    ends = spark_end_offsets(d, 7)
    assert ends == {
        "packets-x": {0: 2967, 1: 3035},
        "trades-x": {0: 6091, 1: 5917},
        "subscriptions-x": {0: 7},
    }
    assert spark_end_offsets(d, 8) is None  # no log of that batch
    assert last_spark_batch(d) == 7 and last_spark_batch(tmp_path / "nothing") is None
    assert stream_partitions(ends, TOPICS, ("trades", "packets")) == [
        ("packets", 0),
        ("packets", 1),
        ("trades", 0),
        ("trades", 1),
    ]
    assert stream_partitions(None, TOPICS, ("trades",)) is None


def test_batch_log_round_trip_and_the_older_form() -> None:
    blog = BatchLog({"trades-x": {"0": [5, 9]}}, {"trades-x": {0: 10, 1: 4}})
    back = BatchLog.from_json(blog.to_json())
    assert back.ranges == blog.ranges and back.ends == blog.ends
    old = BatchLog.from_json(b'{"trades-x": {"0": [5, 9]}}')  # written before the ends were kept
    assert old.ranges == {"trades-x": {"0": [5, 9]}} and old.ends is None


def test_a_batch_is_recognised_by_its_offsets_not_its_id() -> None:
    ends = {"trades-x": {0: 10, 1: 4}}
    check_batch(3, ends, BatchLog({}, dict(ends)), where="here")  # the same batch re-delivered
    with pytest.raises(CheckpointMismatch, match="batch 3") as info:
        check_batch(3, {"trades-x": {0: 2, 1: 1}}, BatchLog({}, ends), where="ckpt X")
    assert isinstance(info.value, EngineError) and "ckpt X" in str(info.value)
    with pytest.raises(CheckpointMismatch):
        check_batch(3, None, BatchLog({}, ends), where="")  # Spark has no such batch
    with pytest.raises(CheckpointMismatch):
        check_batch(3, ends, None, where="")  # the state has no log of it


def test_checkpoint_agrees_only_where_spark_carries_on_from_the_state() -> None:
    from engine.sources.offsets import Epoch, checkpoint_agrees

    spark = {3: {"t": {0: 30}}, 4: {"t": {0: 40}}, 5: {"t": {0: 50}}}
    ends = spark.get
    e0 = Epoch()
    # fresh on both sides; Spark planned its first batch and the state has none yet
    assert checkpoint_agrees(-1, None, None, e0, ends)
    assert checkpoint_agrees(-1, None, 0, e0, ends)
    # Spark's newest batch is the state's last one (same offsets), or the next one from there
    assert checkpoint_agrees(5, {"t": {0: 50}}, 5, e0, ends)
    assert checkpoint_agrees(4, {"t": {0: 40}}, 5, e0, ends)
    # the same ids over other offsets; deleted; older; newer; the state gone
    assert not checkpoint_agrees(5, {"t": {0: 51}}, 5, e0, ends)
    assert not checkpoint_agrees(5, {"t": {0: 50}}, None, e0, ends)
    assert not checkpoint_agrees(7, {"t": {0: 70}}, 5, e0, ends)
    assert not checkpoint_agrees(3, {"t": {0: 30}}, 5, e0, ends)
    assert not checkpoint_agrees(-1, None, 5, e0, ends)
    # a later epoch: Spark's batch 0 is the state's batch 8, starting at its end offsets
    e8 = Epoch(base=8, start={"t": {0: 70}})
    assert checkpoint_agrees(7, {"t": {0: 70}}, 0, e8, {0: {"t": {0: 75}}}.get)
    assert checkpoint_agrees(8, {"t": {0: 75}}, 0, e8, {0: {"t": {0: 75}}}.get)
    assert not checkpoint_agrees(7, {"t": {0: 71}}, 0, e8, {0: {"t": {0: 75}}}.get)
    # a log without end offsets (an older engine): the ids are trusted
    assert checkpoint_agrees(5, None, 5, e0, ends)


def test_starting_offsets_name_every_partition(tmp_path: Path) -> None:
    import json

    from engine.sources.offsets import Epoch, starting_offsets

    assert starting_offsets(None, {"t": [0, 1]}) == "earliest"
    got = json.loads(starting_offsets({"t": {0: 7}}, {"t": [0, 1], "u": [0]}))
    assert got == {"t": {"0": 7, "1": -2}, "u": {"0": -2}}  # -2: earliest (added since)
    e = Epoch(base=9, start={"t": {0: 7}})
    (tmp_path / "e.json").write_bytes(e.to_json())
    assert Epoch.read(tmp_path / "e.json") == e and Epoch.read(tmp_path / "none.json") == Epoch()
