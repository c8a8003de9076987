""":mod:`engine.executors.history`: which batch a record belongs to, what is dropped, and the
events a re-read keeps (valid, not late *for its batch*, inside the asked span) -- against a
brute force that decodes record by record."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.dead_letter import DeadLetters
from engine.decode import decode_records
from engine.executors.history import HistoryIndex, history_events, records_source
from tests.engine.executors.support import BASE, kafka_rows
from tidewatch.wire.avro import encode_batch

TOPIC = "tw-trades"


def _records(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    rows = []
    offs = [0, 0]
    for _ in range(n):
        p = int(rng.integers(0, 2))
        ts = BASE + int(rng.integers(0, 10_000))
        rec = {"symbol": "AAA", "ts": ts, "price": 1.5, "size": int(rng.integers(1, 9)), "side": "ASK",
               "exchange": "NYSE"}  # fmt: skip
        value = encode_batch("trades", {f: [v] for f, v in rec.items()}).messages()[0]
        if rng.random() < 0.05:
            value = value[:-3]  # undecodable: never an event
        rows.append((TOPIC, p, offs[p], b"AAA", value))
        offs[p] += 1
    return kafka_rows(rows)


def _index(tbl: pa.Table) -> HistoryIndex:
    """Three batches over the offsets of both partitions, each with its own late bound; the
    offsets 0..4 of partition 0 belong to a batch no longer held."""
    part = np.asarray(tbl.column("partition").to_pylist())
    top = [int(np.flatnonzero(part == p).shape[0]) - 1 for p in (0, 1)]
    cut = [t // 2 for t in top]
    idx = HistoryIndex()
    idx.add(1, {TOPIC: {"0": [5, cut[0]], "1": [0, cut[1]]}}, BASE + 2_000, BASE + 9_000)
    idx.add(2, {TOPIC: {"0": [cut[0] + 1, top[0]]}}, BASE + 5_000, BASE + 9_999)
    idx.add(3, {TOPIC: {"1": [cut[1] + 1, top[1]]}}, None, BASE + 9_999)
    return idx


def _brute(tbl: pa.Table, idx: HistoryIndex, lo: int | None, hi: int | None) -> list[tuple[int, int, int]]:
    """(partition, offset, ts) of the events kept, one record at a time."""
    out = []
    for b in sorted(idx.ranges):
        for p, (a, z) in sorted(idx.ranges[b][TOPIC].items()):
            for off in range(a, z + 1):
                row = tbl.filter(
                    pa.compute.and_(
                        pa.compute.equal(tbl.column("partition"), int(p)),
                        pa.compute.equal(tbl.column("offset"), off),
                    )
                )
                d = decode_records(
                    "trades", row, late_until=idx.late_until[b], max_future_ms=None, dead=DeadLetters()
                )
                for t in d.ts.tolist():
                    if (lo is None or t > lo) and (hi is None or t <= hi):
                        out.append((int(p), off, int(t)))
    return out


def test_batch_of_assigns_records_by_partition_and_offset() -> None:
    idx = HistoryIndex()
    idx.add(7, {TOPIC: {"0": [10, 19], "1": [0, 4]}}, None, 1)
    idx.add(8, {TOPIC: {"0": [20, 29]}}, None, 2)
    part = np.array([0, 0, 0, 1, 1, 0, 2], np.int32)
    offs = np.array([9, 10, 25, 4, 5, 30, 0], np.int64)
    assert idx.batch_of(TOPIC, part, offs).tolist() == [-1, 7, 8, 7, -1, -1, -1]
    assert idx.span(TOPIC) == {"0": [10, 29], "1": [0, 4]}
    idx.prune(1)  # batch 7's events are all at or before 1: nobody reads them again
    assert list(idx.ranges) == [8] and len(idx) == 1


def test_history_events_equal_a_record_by_record_decode() -> None:
    tbl = _records(400, seed=3)
    idx = _index(tbl)
    for lo, hi in [(None, None), (BASE + 3_000, None), (BASE + 1_000, BASE + 6_000)]:
        d = history_events(tbl, idx, "trades", TOPIC, lo=lo, hi=hi, max_future_ms=None)
        got = list(zip(d.partition.tolist(), d.offset.tolist(), d.ts.tolist(), strict=True))
        want = _brute(tbl, idx, lo, hi)
        assert got == want and len(want) > 50, (lo, hi)
    src = records_source(lambda ranges: tbl, {"trades": TOPIC}, None)
    d = src("trades", idx, BASE + 3_000, None)
    assert len(d) == len(_brute(tbl, idx, BASE + 3_000, None))
