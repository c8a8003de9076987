"""The executor path on Spark: ``mapInArrow`` over a Kafka-shaped DataFrame, on ``local[2]``.

The DataFrame is built from in-memory Kafka rows (no Kafka needed) with the Kafka source's
columns and types, repartitioned so several tasks each see part of every partition; the
Python workers run :class:`engine.executors.preagg.Preaggregator` (their pids are not the
driver's) and the driver's merge equals today's driver path on the same records -- with a
function made per call (``spark_preaggregate``) and with the engine's one function per context
whose tasks read each call's parameters from a local property (``collect_preaggregated``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.executors import collect
from engine.executors.collect import collect_preaggregated
from engine.executors.output import merge_output
from engine.executors.preagg import spark_preaggregate
from engine.executors.reference import driver_path
from tests.engine.executors.support import (
    BASE,
    PACKET_SPECS,
    SUBS,
    TRADE_SPEC,
    TS,
    assert_dead_equal,
    assert_decoded_equal,
    assert_pane_rows_equal,
    expected,
    kafka_table,
    params,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def _records(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    roles = rng.choice(np.array(["trades"] * 6 + ["packets"] * 3 + ["subs"], dtype=object), n)
    recs = [
        (str(r), int(p), int(t), int(k), int(pr), int(sz), bool(a), int(b))
        for r, p, t, k, pr, sz, a, b in zip(
            roles,
            rng.integers(0, 3, n),
            rng.integers(0, len(TS), n),
            rng.integers(0, 4, n),
            rng.integers(0, 9, n),
            rng.integers(0, 7, n),
            rng.integers(0, 2, n),
            rng.integers(0, 40, n),
            strict=True,
        )
    ]
    return kafka_table(recs, seed=seed)


def test_map_in_arrow_runs_in_python_workers_and_equals_the_driver_path(spark: SparkSession) -> None:
    # the ``spark`` fixture (engine.spark_session.build_spark) sets PYSPARK_PYTHON and
    # spark.pyspark.python to this interpreter, the venv's: its workers import pyarrow and numba
    tbl = _records(3000, 11)
    p = params(late_until=BASE + 1000, watermark=BASE + 1500, raw=("trades",))
    df = spark.createDataFrame(tbl.to_pandas()).repartition(3)  # 3 tasks, each a mix of partitions
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "string",
        "int",
        "bigint",
        "timestamp",
        "binary",
        "binary",
    ]
    out = spark_preaggregate(df, p).toArrow()
    got = merge_output(out, p, batch=0)
    want = driver_path(tbl, p)

    assert got.pids and os.getpid() not in got.pids  # ran in Spark's Python workers
    for ks in (TRADE_SPEC, *PACKET_SPECS):
        assert_pane_rows_equal(
            got.panes[(ks.stream, ks.key)].pane_rows(), want.panes[(ks.stream, ks.key)], ks.key
        )
    assert_dead_equal(got.dead, want.dead)
    assert set(got.dead.reason) == {"undecodable", "invalid", "future", "late"}
    exp = expected(tbl, want.decoded)
    assert (got.events, got.part_max, got.ts_min, got.offsets) == (
        exp.events,
        exp.part_max,
        exp.ts_min,
        exp.offsets,
    )
    assert_decoded_equal(got.raw["trades"], want.decoded["trades"])
    n_subs = pc.sum(pc.equal(tbl.column("topic"), SUBS)).as_py()
    assert got.records.num_rows == n_subs
    # no raw record reached the driver: only pane / dead / partition / event / record rows
    kinds: dict[Any, int] = dict(
        zip(*np.unique(out.column("kind").to_numpy(zero_copy_only=False), return_counts=True), strict=True)
    )
    assert set(kinds) <= {"pane", "distinct", "dead", "partition", "event", "record"}


def test_a_task_freezes_the_workers_heap_and_the_driver_does_not(spark: SparkSession) -> None:
    """PySpark's daemon collects garbage over the whole worker after every task: the engine's
    worker functions freeze what is alive as a task starts (engine.runtime.gc_tuning), so each
    task of the Preaggregator leaves its worker with the modules and kernels frozen; run in the
    driver (a replay) it freezes nothing there."""
    import gc

    from engine.executors.preagg import Preaggregator, preaggregate

    tbl = _records(300, seed=5)
    p = params()

    def frozen_after(batches: Any) -> Any:
        for _ in Preaggregator(p)(batches):
            pass
        import gc as worker_gc

        yield pa.RecordBatch.from_pydict({"frozen": [worker_gc.get_freeze_count()], "pid": [os.getpid()]})

    df = spark.createDataFrame(tbl.to_pandas()).repartition(2)
    got = df.mapInArrow(frozen_after, "frozen long, pid long").collect()
    assert len(got) == 2 and all(r.pid != os.getpid() for r in got)
    assert min(r.frozen for r in got) > 10_000  # NumPy, Arrow, Numba and the engine's modules
    before = gc.get_freeze_count()
    preaggregate(tbl, p)
    assert gc.get_freeze_count() == before


def test_the_shared_function_takes_each_calls_parameters(spark: SparkSession) -> None:
    """``collect_preaggregated``: one function for every call, each call's tasks with that
    call's parameters (other ``late`` bounds, watermarks and raw streams give other dead letters
    and events: a task that kept the first call's would fail the second comparison)."""
    tbl = _records(3000, 12)
    df = spark.createDataFrame(tbl.to_pandas()).repartition(3)
    calls = [
        params(late_until=BASE + 1000, watermark=BASE + 1500, raw=("trades",)),
        params(late_until=BASE + 4000, watermark=BASE + 4200),
        params(),
    ]
    made = []
    for p in calls:
        got = merge_output(collect_preaggregated(df, p), p, batch=0)
        made.append(collect._SHARED[0][1])
        want = driver_path(tbl, p)
        assert got.pids and os.getpid() not in got.pids
        for ks in (TRADE_SPEC, *PACKET_SPECS):
            assert_pane_rows_equal(
                got.panes[(ks.stream, ks.key)].pane_rows(), want.panes[(ks.stream, ks.key)], ks.key
            )
        assert_dead_equal(got.dead, want.dead)
        assert set(got.raw) == set(p.raw_streams)
    assert len({id(f) for f in made}) == 1, "one function for all calls"
    assert len({len(merge_output(collect_preaggregated(df, p), p, batch=0).dead) for p in calls}) == 3
    assert spark.sparkContext.getLocalProperty(collect.PARAMS_PROPERTY) is None  # removed after
