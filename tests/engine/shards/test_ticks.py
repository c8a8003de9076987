"""Ticks (engine.shards.ticks): the files the driver writes to make Spark run a batch, and what
Spark's file source makes of them -- one row per shard label, every other column null, each
file deleted once its batch is committed."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest

from engine.shards.ticks import TickDir, is_tick


def test_a_tick_is_one_row_per_label_written_whole(tmp_path: Path) -> None:
    ticks = TickDir(tmp_path / "ticks")
    assert ticks.pending() == []
    path = ticks.write([7, 1, 4])
    assert ticks.pending() == [path]
    assert path.read_text().splitlines() == ['{"shard": 7}', '{"shard": 1}', '{"shard": 4}']
    # the temporary file is hidden (Spark's file source skips names with a leading dot) and gone
    assert [p.name for p in (tmp_path / "ticks").iterdir()] == [path.name]
    later = ticks.write([7])
    assert ticks.pending() == [path, later]  # in the order written


def test_a_routed_row_without_span_is_a_tick() -> None:
    assert is_tick(None) and is_tick(math.nan)
    assert not is_tick(b"") and not is_tick(b"\x00span")


@pytest.mark.integration
def test_spark_reads_a_tick_as_routed_rows_and_deletes_it(spark: Any, tmp_path: Path) -> None:
    from engine.shards.route import ROUTED_SCHEMA

    ticks = TickDir(tmp_path / "ticks")
    got: list[list[Any]] = []
    df = ticks.stream(spark)
    assert [f.name for f in df.schema] == ROUTED_SCHEMA.names  # unioned with the routing's rows
    q = (
        df.writeStream.foreachBatch(lambda b, _i: got.append([tuple(r) for r in b.collect()]))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="0.2 seconds")
        .start()
    )
    try:
        first = ticks.write([3, 5])
        q.processAllAvailable()
        assert sorted(r for b in got for r in b) == [
            (3, None, None, None, None, None),
            (5, None, None, None, None, None),
        ]
        ticks.write([3, 5])
        q.processAllAvailable()
        assert sum(len(b) for b in got) == 4  # one batch's rows per tick, none read twice
        deadline = time.monotonic() + 30
        while first.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not first.exists()  # a committed tick's file is deleted (cleanSource)
    finally:
        q.stop()
