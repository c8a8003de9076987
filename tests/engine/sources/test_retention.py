"""The retention gap's pure steps (engine/sources/retention.py): which partitions are candidates,
which of their offsets were deleted, and the ``lost`` dead letters they become.  The broker's
part (the log-start offsets) is in tests/engine/test_engine_retention.py, on both engines."""

from __future__ import annotations

from engine.sources.retention import batch_lost, dead_letters, gap_candidates, lost_ranges
from tidewatch.settings import get_settings


def test_a_partition_whose_first_record_comes_late_or_that_read_none_is_a_candidate() -> None:
    starts = {"t": {0: 10, 1: 10, 2: 10, 3: 10}}
    ends = {"t": {0: 20, 1: 20, 2: 20, 3: 10}, "u": {0: 5}}
    ranges = {"t": {"0": [10, 19], "1": [14, 19]}}
    got = gap_candidates(starts, ends, ranges)
    # 0 began at its start; 1 began at 14; 2 read nothing of 10..19; 3 did not move; u is new
    assert got == {("t", 1): (10, 14), ("t", 2): (10, 20), ("u", 0): (0, 5)}
    assert gap_candidates(None, ends, ranges) == {}


def test_only_offsets_below_the_log_start_were_lost() -> None:
    cand = {("t", 1): (10, 14), ("t", 2): (10, 20), ("u", 0): (0, 5)}
    # t/1: deleted up to 12 (12, 13 were markers); t/2: nothing deleted; u/0: past the batch
    got = lost_ranges(cand, {("t", 1): 12, ("t", 2): 10, ("u", 0): 9})
    assert got == {("t", 1): (10, 12), ("u", 0): (0, 5)}


def test_each_lost_range_is_one_dead_letter_naming_it() -> None:
    dead = dead_letters({("t", 1): (10, 12), ("u", 0): (0, 5)}, watermark=7)
    assert len(dead) == 2 and set(dead.reason) == {"lost"}
    assert list(zip(dead.source_topic, dead.source_partition, dead.source_offset, strict=True)) == [
        ("t", 1, 10),
        ("u", 0, 0),
    ]
    assert "offsets 10..11 (2 records) of partition 1" in dead.detail[0]


def test_a_batch_without_candidates_asks_no_broker() -> None:
    starts, ends = {"t": {0: 10}}, {"t": {0: 20}}
    # an address nothing listens on: asking it would raise
    assert batch_lost("127.0.0.1:1", get_settings(), 3, starts, ends, {"t": {"0": [10, 19]}}, None) is None
