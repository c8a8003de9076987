"""Driver CPU per event: today's path (decode + pane pre-aggregation in the driver) vs the
executor path (the driver only merges what ``mapInArrow`` tasks send), on the same records.

Records: ``--events`` trades of the engine bench's generator (:func:`bench.engine_bench.make_trades`:
``--symbols`` Zipf-distributed symbols, ``--rate`` events per second of event time, so one
batch covers ``events / rate`` seconds = that many panes), framed Avro, spread over
``--partitions`` Kafka partitions (offsets consecutive per partition), ``--bad`` of them
undecodable.  Pane spec: the probe's column set (COUNT, SUM(size), SUM(price), MIN/MAX(price),
FIRST/LAST(price)) plus, with ``--ask``, ``SUM(size) FILTER (WHERE side = 'ASK')``.

In-process (always): the driver CPU (``time.process_time``) of

* ``today``: :func:`engine.executors.reference.driver_path` of the whole batch (decode +
  validation + dead letters + ``panes.aggregate``);
* ``merge``: :func:`engine.executors.output.merge_output` of the tasks' output +
  ``PanePartial.pane_rows()`` (what ``Evaluator.apply_panes`` takes) -- the tasks (one per Kafka
  partition, as Spark's Kafka source splits) run untimed before, their CPU reported apart.

With ``--spark``: the same over a ``local[2]`` Spark DataFrame of the records (built once and
cached, outside the timing): ``today`` = ``toArrow()`` of the raw records + ``driver_path``;
``executors`` = ``mapInArrow(Preaggregator).toArrow()`` + merge; Python driver CPU and wall
time (the JVM's and the Python workers' CPU are not the driver's Python process).

    .venv/bin/python bench/preagg_bench.py --events 1000000 --spark
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import make_trades  # noqa: E402
from engine.executors.output import merge_output  # noqa: E402
from engine.executors.preagg import KeySpec, SetSpec, batch_params, preaggregate, spark_preaggregate  # noqa: E402
from engine.executors.reference import driver_path  # noqa: E402
from subscriptions import rule_ast as A  # noqa: E402
from tidewatch.wire.avro import encode_batch  # noqa: E402

TOPIC = "bench-trades"


def records(n: int, symbols: int, rate: float, partitions: int, bad: float, seed: int = 0) -> pa.Table:
    cols = make_trades(n, symbols, rate, seed)
    values = encode_batch("trades", cols).messages()
    rng = np.random.default_rng(seed)
    for i in np.flatnonzero(rng.random(n) < bad):
        values[i] = b"\x00bad" + values[i][4:]
    part = rng.integers(0, partitions, n).astype(np.int32)
    offs = np.zeros(n, np.int64)
    for p in range(partitions):
        m = part == p
        offs[m] = np.arange(int(m.sum()))
    now = int(time.time() * 1000)
    return pa.table(
        {
            "topic": pa.array([TOPIC] * n, pa.string()),
            "partition": pa.array(part),
            "offset": pa.array(offs),
            "timestamp": pa.array(np.full(n, now * 1000, np.int64), pa.timestamp("us", tz="UTC")),
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
        }
    )


def spec(ask: bool) -> KeySpec:
    sets = [SetSpec("all", None, sums=("price", "size"), minmax=("price",), firstlast=("price",))]
    if ask:
        sets.append(SetSpec("side = 'ASK'", A.RowCmp("side", "=", "ASK"), sums=("size",)))
    return KeySpec("trades", "symbol", tuple(sets))


def cpu(fn: Any) -> tuple[float, float, Any]:
    """(process CPU s, wall s, result) of ``fn()``."""
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - w0, out


def merged_rows(out: pa.Table, params: Any) -> Any:
    mb = merge_output(out, params, batch=0)
    return {k: p.pane_rows() for k, p in mb.panes.items()}, mb


def check(rows: dict[Any, Any], ref: Any) -> str:
    """Do the merged pane rows equal the driver's (rows, totals, counts, sums, FIRST/LAST bits)?"""
    bad = []
    for k, r in ref.panes.items():
        g = rows[k]
        if (
            list(g.keys) != list(r.keys)
            or not np.array_equal(g.pane, r.pane)
            or not np.array_equal(g.total, r.total)
        ):
            bad.append(f"{k} rows")
            continue
        for name, w in r.sets.items():
            a = g.sets[name]
            same = np.array_equal(a.count, w.count)
            same &= all(np.array_equal(a.sums[f].view(np.int64), w.sums[f].view(np.int64)) for f in w.sums)
            same &= all(np.array_equal(a.first[f].view(np.int64), w.first[f].view(np.int64)) for f in w.first)
            same &= all(np.array_equal(a.last[f].view(np.int64), w.last[f].view(np.int64)) for f in w.last)
            same &= all(np.array_equal(a.mins[f], w.mins[f], equal_nan=True) for f in w.mins)
            if not same:
                bad.append(f"{k} {name}")
    return "equal to the driver's" if not bad else f"DIFFERENT: {bad}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--symbols", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=50_000.0, help="events per second of event time")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--bad", type=float, default=0.001, help="fraction of undecodable records")
    ap.add_argument("--ask", action="store_true", help="a second column set with a predicate")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--spark", action="store_true", help="also through mapInArrow on local[2]")
    a = ap.parse_args()

    tbl = records(a.events, a.symbols, a.rate, a.partitions, a.bad)
    params = batch_params(pane_ms=1000, topics={"trades": TOPIC}, max_future_ms=60_000, panes=[spec(a.ask)])
    n = tbl.num_rows
    print(f"{n:,} records over {a.partitions} partitions, {a.symbols} symbols, {n / a.rate:.0f} s of event time "
          f"(panes of 1 s), column sets {[s.name for s in params.panes[0].sets]}", flush=True)  # fmt: skip

    # warm-up: Numba kernels, pyarrow
    small = tbl.slice(0, 20_000)
    merged_rows(preaggregate(small, params), params)
    driver_path(small, params)

    parts = [tbl.filter(pa.compute.equal(tbl.column("partition"), p)) for p in range(a.partitions)]
    today, merge, execs = [], [], []
    for _ in range(a.repeat):
        c, w, ref = cpu(lambda: driver_path(tbl, params))
        today.append(c)
        outs = []
        ex = 0.0
        for t in parts:  # the tasks: one per Kafka partition, untimed for the driver
            c, w, o = cpu(lambda t=t: preaggregate(t, params))
            ex += c
            outs.append(o)
        execs.append(ex)
        out = pa.concat_tables(outs)
        c, w, (rows, mb) = cpu(lambda out=out: merged_rows(out, params))
        merge.append(c)
    pane_rows = sum(len(r) for r in ref.panes.values())
    kinds = dict(
        zip(*np.unique(out.column("kind").to_numpy(zero_copy_only=False), return_counts=True), strict=True)
    )
    print(f"check: merged pane rows {check(rows, ref)}; dead letters {len(mb.dead):,} = {len(ref.dead):,}")
    print(f"executor output: {out.num_rows:,} rows {kinds} for {pane_rows:,} pane rows after the merge")
    t, m, e = min(today), min(merge), min(execs)
    print(f"\nin-process, best of {a.repeat} (driver CPU, time.process_time):")
    print(f"  today   decode + panes.aggregate in the driver  {t:7.3f} s  {t / n * 1e6:7.3f} us/event")
    print(f"  new     merge of the tasks' output + pane_rows  {m:7.3f} s  {m / n * 1e6:7.3f} us/event")
    print(f"          (the tasks, not on the driver:          {e:7.3f} s  {e / n * 1e6:7.3f} us/event)")
    print(f"  ratio   today / new driver CPU per event: {t / m:.1f}x")

    if a.spark:
        from engine.spark_session import build_spark
        from tidewatch.settings import get_settings

        os.environ["PYSPARK_PYTHON"] = sys.executable
        spark = build_spark(get_settings().model_copy(update={"spark_master": "local[2]"}), "preagg-bench")
        try:
            df = spark.createDataFrame(tbl.to_pandas()).repartition(a.partitions, "partition").persist()
            df.count()
            st, sn = [], []
            for rep in range(a.repeat + 1):  # the first round warms the Python workers up
                c1, w1, raw = cpu(
                    lambda: df.select("topic", "partition", "offset", "timestamp", "key", "value").toArrow()
                )
                c2, w2, ref2 = cpu(lambda raw=raw: driver_path(raw, params))
                c3, w3, out2 = cpu(lambda: spark_preaggregate(df, params).toArrow())
                c4, w4, (rows2, mb2) = cpu(lambda out2=out2: merged_rows(out2, params))
                if rep:
                    st.append((c1 + c2, w1 + w2, c1, c2))
                    sn.append((c3 + c4, w3 + w4, c3, c4))
                print(f"  spark round {rep}{' (warm-up)' if not rep else ''}: today toArrow {w1:.2f} s + driver "
                      f"{w2:.2f} s; executors mapInArrow+toArrow {w3:.2f} s ({out2.num_rows:,} rows, pids "
                      f"{sorted(mb2.pids)}, driver pid {os.getpid()}) + merge {w4:.2f} s", flush=True)  # fmt: skip
            print(f"  check: {check(rows2, ref2)}")

            def fig(runs: list[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
                cpu_s = sorted(r[0] for r in runs)
                wall_s = sorted(r[1] for r in runs)
                return cpu_s[0], float(np.median(cpu_s)), wall_s[0], float(np.median(wall_s))

            ft, fn = fig(st), fig(sn)
            print(
                f"\nSpark local[2], {a.repeat} rounds (Python driver CPU best / median; wall best / median):"
            )
            for name, f in (
                ("today   toArrow of raw records + decode + panes", ft),
                ("new     mapInArrow toArrow + merge", fn),
            ):
                print(f"  {name:<48} CPU {f[0]:5.2f} / {f[1]:5.2f} s = {f[0] / n * 1e6:6.3f} us/event   "
                      f"wall {f[2]:5.2f} / {f[3]:5.2f} s")  # fmt: skip
            print(f"  ratio   today / new driver CPU per event: {ft[0] / fn[0]:.1f}x (best), {ft[1] / fn[1]:.1f}x "
                  f"(median); wall {ft[2] / fn[2]:.2f}x (best), {ft[3] / fn[3]:.2f}x (median)")  # fmt: skip
        finally:
            spark.stop()
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (2 cores)")
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))


if __name__ == "__main__":
    main()
