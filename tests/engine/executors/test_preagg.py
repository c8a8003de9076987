"""Executor pre-aggregation + driver merge == today's driver path (no Spark, no services).

Random Kafka batches of trades, packets and subscription records -- good records with many ts
ties and pane edges, and bad ones of every reason (undecodable, truncated, invalid, future,
late) -- are split at random among "tasks" (any subset of records, each task's input cut into
several record batches, sometimes aggregated in tiny chunks); each task runs
:class:`engine.executors.preagg.Preaggregator` as ``mapInArrow`` would, the outputs are merged
by :func:`engine.executors.output.merge_output`, and the result must equal
:func:`engine.executors.reference.driver_path` on the whole batch: pane rows of every key field
and column set (order, counts, exact and float sums, MIN/MAX, FIRST/LAST with their ties,
COUNT DISTINCT), dead letters (every field, same order), events per stream, per-partition
event-time maxima, offset ranges, raw events and the subscription records passed through.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.decode import Decoded
from engine.evaluation.panes import PaneSpec, aggregate
from engine.evaluation.state import KeyState
from engine.executors.merge import PanePartial
from engine.executors.output import merge_output, preaggregate_here
from engine.executors.preagg import OUTPUT_SCHEMA, Preaggregator, column_sets, preaggregate
from engine.executors.reference import _batch_view, driver_path
from tests.engine.executors.support import (
    BASE,
    PACKET_SPECS,
    SUBS,
    TRADE_SPEC,
    assert_dead_equal,
    assert_decoded_equal,
    assert_pane_rows_equal,
    expected,
    kafka_table,
    next_offsets,
    params,
    record_strategy,
    tasks,
)

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPECS = [TRADE_SPEC, *PACKET_SPECS]


def run_tasks(tbl: pa.Table, p: Any, assign: np.ndarray, pieces: int) -> pa.Table:
    """Each task's output, as Spark would collect it (tasks in any order: reversed here)."""
    outs = [
        pa.Table.from_batches(list(Preaggregator(p)(iter(batches))), schema=OUTPUT_SCHEMA)
        for batches in tasks(tbl, assign, pieces)
    ]
    return pa.concat_tables(outs[::-1]) if outs else OUTPUT_SCHEMA.empty_table()


@SETTINGS
@given(
    recs=st.lists(record_strategy(), min_size=0, max_size=80),
    n_tasks=st.integers(1, 5),
    pieces=st.integers(1, 4),
    chunk=st.sampled_from([3, 17, 2_000_000]),
    late=st.sampled_from([None, BASE + 999, BASE + 1000, BASE + 2000]),
    raw=st.sampled_from([(), ("trades",), ("trades", "packets")]),
    data=st.data(),
)
def test_executor_output_merged_equals_the_driver_path(
    recs: list[tuple[Any, ...]],
    n_tasks: int,
    pieces: int,
    chunk: int,
    late: int | None,
    raw: tuple[str, ...],
    data: Any,
) -> None:
    tbl = kafka_table(recs, seed=len(recs))
    assign = np.array(
        data.draw(st.lists(st.integers(0, n_tasks - 1), min_size=len(recs), max_size=len(recs))), np.int64
    )
    p = params(late_until=late, watermark=None if late is None else late + 123, raw=raw, chunk_rows=chunk)
    got = merge_output(run_tasks(tbl, p, assign, pieces), p, batch=7)
    want = driver_path(tbl, p)

    for ks in SPECS:
        assert_pane_rows_equal(
            got.panes[(ks.stream, ks.key)].pane_rows(), want.panes[(ks.stream, ks.key)], ks.key
        )
    assert_dead_equal(got.dead, want.dead)
    exp = expected(tbl, want.decoded)
    assert got.events == exp.events
    assert got.part_max == exp.part_max
    assert got.ts_min == exp.ts_min
    assert got.offsets == exp.offsets
    assert set(got.raw) == set(raw)
    for s in raw:
        assert_decoded_equal(got.raw[s], want.decoded[s])
    subs = tbl.filter(pa.compute.equal(tbl.column("topic"), SUBS))
    assert _records(got.records) == _records(subs)
    if recs:
        assert got.pids == {os.getpid()}


@SETTINGS
@given(
    first=st.lists(record_strategy(), min_size=0, max_size=50),
    second=st.lists(record_strategy(), min_size=0, max_size=50),
    n_tasks=st.integers(1, 4),
    tau=st.sampled_from([BASE - 1000, BASE, BASE + 1000, BASE + 2000, BASE + 3000, BASE + 10_000]),
    data=st.data(),
)
def test_partials_merge_across_batches_and_split_at_a_lookup(
    first: list[tuple[Any, ...]], second: list[tuple[Any, ...]], n_tasks: int, tau: int, data: Any
) -> None:
    """Two batches' partial rows merged (the pending panes of one batch and the next) equal
    ``aggregate`` of the events of both, oldest batch first -- the pending buffer's order; cut at
    a lookup time, each side equals ``aggregate`` of its events."""
    p = params()
    t1 = kafka_table(first, seed=1)
    t2 = kafka_table(second, next_offsets(t1), seed=2)
    parts, decoded = [], []
    for b, tbl in enumerate((t1, t2)):
        assign = np.array(
            data.draw(st.lists(st.integers(0, n_tasks - 1), min_size=tbl.num_rows, max_size=tbl.num_rows)),
            np.int64,
        )
        parts.append(merge_output(run_tasks(tbl, p, assign, 2), p, batch=b))
        decoded.append(driver_path(tbl, p).decoded)
    for ks in SPECS:
        merged = PanePartial.merge([parts[0].panes[(ks.stream, ks.key)], parts[1].panes[(ks.stream, ks.key)]])
        d = _concat(decoded[0][ks.stream], decoded[1][ks.stream])
        assert_pane_rows_equal(merged.pane_rows(), _aggregate(d, ks), f"{ks.key} merged")
        due, rest = merged.split(tau)
        assert_pane_rows_equal(due.pane_rows(), _aggregate(d.take(d.ts <= tau), ks), f"{ks.key} due")
        assert_pane_rows_equal(rest.pane_rows(), _aggregate(d.take(d.ts > tau), ks), f"{ks.key} pending")
        # merging in the other order (and with an empty part) changes nothing
        again = PanePartial.merge([rest, PanePartial.empty(ks), due])
        assert_pane_rows_equal(again.pane_rows(), merged.pane_rows(), f"{ks.key} re-merged")
        # a batch's lookups cut at once equal the cuts one lookup after another
        taus = range(tau, tau + data.draw(st.sampled_from([0, 1, 2500, 5000])) + 1, 1000)
        cuts, left = merged.split_at(taus)
        assert set(cuts) <= set(range(len(taus))) and all(len(c) for c in cuts.values())
        left_one = merged
        for i, t in enumerate(taus):
            one, left_one = left_one.split(t)
            cut = cuts.get(i, PanePartial.empty(ks))  # only the lookups with rows have a part
            assert_pane_rows_equal(cut.pane_rows(), one.pane_rows(), f"{ks.key} due at {t}")
            for cs, os_ in zip(cut.sets, one.sets, strict=True):  # the triples stay (row, value)-sorted
                for c3, o3 in zip(cs.distinct, os_.distinct, strict=True):
                    assert all(np.array_equal(a, b) for a, b in zip(c3, o3, strict=True)), t
        assert_pane_rows_equal(left.pane_rows(), left_one.pane_rows(), f"{ks.key} pending after {taus}")
        # rows_at (the core's: each part's pane rows made at once) equals split_at, then pane_rows
        rows, left_rows = merged.rows_at(taus)
        assert set(rows) == set(cuts)
        for i, cut in cuts.items():
            want = cut.pane_rows()
            assert_pane_rows_equal(rows[i], want, f"{ks.key} rows at {taus[i]}")
            for name, agg in want.sets.items():  # the triples exactly, in the same order
                for f, w3 in agg.distinct.items():
                    g3 = rows[i].sets[name].distinct[f]
                    assert all(np.array_equal(a, b) for a, b in zip(g3, w3, strict=True)), (i, f)
        assert_pane_rows_equal(left_rows.pane_rows(), left.pane_rows(), f"{ks.key} pending after rows_at")
        # the parts' key ids through the cut's shared ids equal those interned part by part
        # without them, into a key state that has seen some of the keys before
        shared, alone = KeyState(ks.stream, ks.key, 4, 1000), KeyState(ks.stream, ks.key, 4, 1000)
        seen = list(merged.keys[::3])
        for st_ in (shared, alone):
            st_.ids_of(np.asarray(seen, dtype=object))
        for i in sorted(rows):
            assert rows[i].key_global is not None, i
            got = shared.row_ids(rows[i])
            want = alone.row_ids(dataclasses.replace(rows[i], key_global=None))
            np.testing.assert_array_equal(got, want, f"{ks.key} key ids at {taus[i]}")
            assert list(alone.key_values(want)) == list(rows[i].keys), i
        # another key state given the same parts does not read the first one's ids
        other = KeyState(ks.stream, ks.key, 4, 1000)
        for i in sorted(rows):
            assert list(other.key_values(other.row_ids(rows[i]))) == list(rows[i].keys), i


def test_split_at_makes_parts_only_for_lookups_with_rows() -> None:
    """A stream idle for days spans millions of lookup times; only those with rows get a part
    (a part per lookup, held at once, took ≈ 8 KB each with four column sets: gigabytes after
    a long gap)."""
    recs = [("trades", 0, ts, 0, 1, 1, False, 9) for ts in (0, 5, 12, 15)]  # four panes
    part = preaggregate_here(kafka_table(recs), params()).panes[("trades", "symbol")]
    taus = range(BASE - 10**9, BASE + 10**9, 1000)  # 2,000,000 lookups
    due, rest = part.split_at(taus)
    assert len(np.unique(part.pane)) == 4 and len(due) == 4 and len(rest) == 0
    assert sum(len(d) for d in due.values()) == len(part)


def _records(t: pa.Table) -> list[tuple[Any, ...]]:
    cols = [t.column(c).to_pylist() for c in ("partition", "offset", "key", "value")]
    return sorted(zip(*cols, strict=True))


def _concat(a: Decoded, b: Decoded) -> Decoded:
    return Decoded(
        a.stream,
        {k: np.concatenate([a.columns[k], b.columns[k]]) for k in a.columns},
        np.concatenate([a.partition, b.partition]),
        np.concatenate([a.offset, b.offset]),
    )


def _aggregate(d: Decoded, ks: Any) -> Any:
    view = _batch_view()(ks.stream, d.columns)
    return aggregate(d.columns, PaneSpec(ks.key, column_sets(ks, view.mask)), 1000)


def test_first_last_ties_across_tasks_follow_partition_then_offset() -> None:
    """Same symbol, same ts, different prices in three partitions given to three tasks in reverse
    order: FIRST is partition 0's first record (0.2), LAST partition 2's last."""
    recs = [
        ("trades", part, 5, 0, price, 1, False, 9) for part, price in ((2, 3), (1, 0), (0, 1), (0, 2), (2, 4))
    ]
    tbl = kafka_table(recs)
    p = params()
    parts = np.asarray(tbl.column("partition").to_numpy(), np.int64)
    got = merge_output(run_tasks(tbl, p, 2 - parts, 1), p).panes[("trades", "symbol")].pane_rows()
    want = driver_path(tbl, p).panes[("trades", "symbol")]
    assert_pane_rows_equal(got, want)
    assert got.sets["all"].first["price"][0] == 0.2 and got.sets["all"].last["price"][0] == 2.5000000000000004


def test_first_last_ties_across_batches_put_the_older_batch_first() -> None:
    """Same symbol and ts in two batches, the later batch's record in a lower partition: the
    driver's pending buffer keeps the older batch first, so FIRST is batch 0's record."""
    p = params()
    t1 = kafka_table([("trades", 1, 5, 0, 0, 1, False, 9)], seed=1)
    t2 = kafka_table([("trades", 0, 5, 0, 3, 1, False, 9)], next_offsets(t1), seed=2)
    parts = [preaggregate_here(t, p, batch=b).panes[("trades", "symbol")] for b, t in enumerate((t1, t2))]
    got = PanePartial.merge(parts[::-1]).pane_rows()
    d = _concat(driver_path(t1, p).decoded["trades"], driver_path(t2, p).decoded["trades"])
    assert_pane_rows_equal(got, _aggregate(d, TRADE_SPEC))
    assert (got.sets["all"].first["price"][0], got.sets["all"].last["price"][0]) == (0.1, 2.5)


def test_exact_sums_do_not_depend_on_the_split() -> None:
    """0.1 + 0.2 + 0.3 in different tasks: the words are the integers, the float the nearest."""
    recs = [("trades", i, 5, 0, price_i, 1, False, 9) for i, price_i in enumerate((0, 1, 2))]
    tbl = kafka_table(recs)
    p = params()
    got = merge_output(run_tasks(tbl, p, np.arange(3), 1), p).panes[("trades", "symbol")].pane_rows()
    want = driver_path(tbl, p).panes[("trades", "symbol")]
    assert_pane_rows_equal(got, want)
    assert got.sets["all"].sums["price"][0] == 0.6  # math.fsum, not 0.1 + 0.2 + 0.3


def test_the_function_pickles_and_the_schema_is_spark_ddl() -> None:
    from engine.executors.preagg import OUTPUT_DDL

    fn = pickle.loads(pickle.dumps(Preaggregator(params(late_until=BASE, raw=("trades",)))))
    assert fn.params == params(late_until=BASE, raw=("trades",))
    assert OUTPUT_DDL.count("`") == 2 * len(OUTPUT_SCHEMA)


def test_records_of_other_topics_are_passed_through_untouched() -> None:
    tbl = kafka_table(
        [("subs", 0, 0, k, 0, 0, False, 9) for k in range(3)] + [("trades", 0, 1, 0, 0, 1, True, 9)]
    )
    p = params()
    out = preaggregate(tbl, p)
    kinds = out.column("kind").to_pylist()
    assert kinds.count("record") == 1 and "pane" in kinds  # the three records in one payload
    got = merge_output(out, p)
    assert sorted(got.records.column("value").to_pylist()) == sorted(
        v
        for t, v in zip(tbl.column("topic").to_pylist(), tbl.column("value").to_pylist(), strict=True)
        if t == SUBS
    )
    assert got.records.column("timestamp").to_pylist() == [BASE + 5_000] * 3
    assert got.events == {"trades": 1, "packets": 0}


@pytest.mark.parametrize("late", [None, BASE + 1000])
def test_late_and_watermark_are_the_batch_start_constants(late: int | None) -> None:
    recs = [("trades", 0, i, 0, 0, 1, False, 9) for i in range(16)]
    tbl = kafka_table(recs)
    p = params(late_until=late, watermark=None if late is None else late + 5)
    got = preaggregate_here(tbl, p)
    want = driver_path(tbl, p)
    assert_dead_equal(got.dead, want.dead)
    n_late = got.dead.reason.count("late")
    assert n_late == (0 if late is None else sum(BASE + t <= late for t in [0, 1, 2, 500, 999, 1000]))
    assert set(got.dead.watermark) <= {None if late is None else late + 5}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(record_strategy(), min_size=0, max_size=60), split=st.integers(1, 3))
def test_pending_rows_take_a_new_spec_from_a_rerun_over_the_same_events(
    recs: list[tuple[Any, ...]], split: int
) -> None:
    """A rule added while panes are pending: the new column sets computed over the same records
    (the executors re-run with only those sets) join the pending rows; removed sets are dropped."""
    from engine.executors.preagg import KeySpec

    tbl = kafka_table(recs, seed=5)
    old = KeySpec("trades", "symbol", TRADE_SPEC.sets[:split])
    new_sets = KeySpec("trades", "symbol", TRADE_SPEC.sets[split:])
    runs = []
    for ks in (old, new_sets):
        p = dataclasses.replace(params(), panes=(ks,))
        runs.append(preaggregate_here(tbl, p).panes[("trades", "symbol")])
    pending, extra = runs
    p_all = params()
    want = driver_path(tbl, p_all).panes[("trades", "symbol")]
    assert_pane_rows_equal(pending.with_spec(TRADE_SPEC, extra).pane_rows(), want)
    narrow = KeySpec("trades", "symbol", TRADE_SPEC.sets[1:2])
    got = pending.with_spec(TRADE_SPEC, extra).with_spec(narrow).pane_rows()
    assert list(got.sets) == [TRADE_SPEC.sets[1].name]
    assert_pane_rows_equal(got, _aggregate(driver_path(tbl, p_all).decoded["trades"], narrow))
    if len(pending):
        with pytest.raises(ValueError):
            pending.with_spec(TRADE_SPEC)  # the new sets' aggregates cannot be made up
