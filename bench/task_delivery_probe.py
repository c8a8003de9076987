"""Kafka delivery of a batch's alert records from Spark tasks vs from the driver: driver CPU
and wall time per batch (issue #19, "driver CPU-µs per event at 10,000 rules").

At 10,000 rules the driver's floor is the alerts' delivery (docs/measurements/engine.md: ≈ 2.5
Kafka records per alert, one ``produce`` call each, in one transaction per batch).  The design it
leads to (docs/engine.md, "Delivery from Spark tasks"): Spark tasks produce the records, each task
a transactional producer of its own (``transactional.id = <prefix>-out-<p>``) whose transaction
also moves a per-partition progress marker (offset ``batch + 1`` of group
``<prefix>-progress-<p>``, ``send_offsets_to_transaction``), as :mod:`engine.sinks.publish` does
for the driver's one transaction.  This probe runs those tasks as a stage of their own (the
records ``repartition``ed by subscription, then ``mapInArrow``): what the driver pays then is a
fixed part per batch (Spark's job), the tasks pay the per-record ``produce`` calls and their
transactions' round trips, and a producer's ``init_transactions`` when a task lands on a Python
worker that has none for its id.  (The design puts the producing into the shards' own tasks,
which spares the stage's wall time; the driver's and the tasks' parts are the ones timed here.)

Both sides, alternating, on the same records (``--sizes`` records per batch; key 12-20 bytes,
value ``--value-bytes``), into one topic of ``--topic-partitions`` partitions of an embedded broker
started here (stopped by PID at the end):

* **driver**: the records already in the driver's memory (not timed); one transactional producer
  (created once); per batch ``begin_transaction``, one ``produce`` per record, the marker, the commit
  -- :meth:`engine.sinks.publish.Publisher.publish`'s Kafka calls without the Avro encoding, with
  its producer settings (``linger.ms`` 5, lz4, delivery reports of failures only), as the tasks'
  producers;
* **shipP** (``--ship``): the records in the driver's memory as one Arrow table, handed to Spark
  (``createDataFrame``, timed) and then as tasksP -- the default mode, whose alerts are made on
  the driver;
* **tasksP**: the records as a cached Spark DataFrame (made by Spark from ``range``, not by the
  driver); per batch ``repartition(P, subscription)`` then ``mapInArrow``, in which each task
  produces its partition's records in its own transaction with its marker (its producer and the
  marker's consumer kept in the Python worker, by transactional id, across batches); the driver
  collects one row per task.

Printed per size and side: median wall ms per batch, median driver CPU ms per batch (this
Python process, every thread: the figure ``bench/engine_bench.py`` calls "driver CPU"), driver
CPU µs per record, and for the tasks the slowest task's transaction (ms) and how many producers
were created in the timed batches (a task landing on a worker without its id's producer).  The
driver's JVM is not counted (in ``local[N]`` it also runs the executors' side).

    flock /tmp/tidewatch-heavy.lock .venv/bin/python bench/task_delivery_probe.py --sizes 100,20000,200000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidewatch.settings import get_settings  # noqa: E402
from tidewatch.stack.private import private_services  # noqa: E402

#: the schema of a task's one output row
TASK_SCHEMA = "p long, n long, created long, txn_ms double, pid long"


def producer_conf(bootstrap: str, tid: str) -> dict[str, Any]:
    """A transactional producer's settings with the engine's own past the transactional ones
    (:attr:`engine.sinks.publish.Publisher.producer_config`: ``linger.ms`` 5, lz4, delivery
    reports of failures only), for both sides."""
    from engine.sinks.publish import Publisher

    return {
        "bootstrap.servers": bootstrap,
        "transactional.id": tid,
        "enable.idempotence": True,
        **Publisher.producer_config,
    }


def produce_records(prod: Any, topic: str, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
    """The engine's produce loop (:func:`engine.sinks.publish._produce_all`: one ``produce`` call
    per record, a full local queue waited on and the record produced again); the number produced."""
    from engine.sinks.publish import _produce_all

    _produce_all(prod, topic, values, keys)
    return len(keys)


def produce_partition(bootstrap: str, topic: str, prefix: str, batch_id: int):  # type: ignore[no-untyped-def]
    """The ``mapInArrow`` function of the tasks side: this task's records in one transaction with
    its partition's progress marker.  Producers and marker consumers are kept in a module of the
    Python worker (``sys.modules``), by transactional id, across batches; a fenced producer (its id
    taken by another worker since) is created again."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import os
        import sys
        import time
        import types

        import pyarrow as pa
        from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
        from pyspark import TaskContext

        cache = sys.modules.setdefault("_tw_task_delivery", types.ModuleType("_tw_task_delivery"))
        clients: dict[str, Any] = cache.__dict__.setdefault("clients", {})
        p = TaskContext.get().partitionId()  # type: ignore[union-attr]
        tid = f"{prefix}-out-{p}"
        created = 0

        def client() -> tuple[Any, Any]:
            nonlocal created
            if tid not in clients:
                prod = Producer(producer_conf(bootstrap, tid))
                prod.init_transactions(60)
                marker = Consumer(
                    {
                        "bootstrap.servers": bootstrap,
                        "group.id": f"{prefix}-progress-{p}",
                        "enable.auto.commit": False,
                    }
                )
                clients[tid] = (prod, marker)
                created += 1
            return clients[tid]

        held = list(batches)
        n = 0
        t0 = time.perf_counter()
        for attempt in range(2):
            prod, marker = client()
            try:
                prod.begin_transaction()
                for b in held:
                    n += produce_records(
                        prod, topic, b.column("key").to_pylist(), b.column("value").to_pylist()
                    )
                prod.send_offsets_to_transaction(
                    [TopicPartition(topic, 0, batch_id + 1)], marker.consumer_group_metadata(), 60
                )
                prod.commit_transaction(60)
                break
            except KafkaException:
                if attempt:
                    raise
                clients.pop(tid, None)  # fenced by the same id on another worker: a new producer
                n = 0
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "p": p,
                    "n": n,
                    "created": created,
                    "txn_ms": (time.perf_counter() - t0) * 1000,
                    "pid": os.getpid(),
                }
            ]
        )

    return run


def driver_records(n: int, value_bytes: int) -> list[tuple[bytes, bytes]]:
    """The driver side's records (keys as the engine's ``subscription|key``-like bytes)."""
    pad = b"x" * max(value_bytes - 8, 0)
    return [
        (f"sub{i % 10_000:05d}|S{i % 5_000:05d}".encode(), i.to_bytes(8, "little") + pad) for i in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="100,20000,200000", help="records per batch (comma-separated)")
    ap.add_argument("--tasks", default="2,4", help="Spark partitions of the tasks side (comma-separated)")
    ap.add_argument("--repeat", type=int, default=5, help="timed batches per size and side (median shown)")
    ap.add_argument("--warm-up", type=int, default=3, help="untimed batches per side first (largest size)")
    ap.add_argument("--value-bytes", type=int, default=120)
    ap.add_argument(
        "--ship",
        action="store_true",
        help="also the sides shipP: the driver's records handed to Spark as Arrow (createDataFrame), then as tasksP",
    )
    ap.add_argument("--topic-partitions", type=int, default=4)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    tasks = [int(x) for x in a.tasks.split(",")]

    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from engine.spark_session import build_spark

    with private_services("tw-task-delivery-", get_settings()) as s:
        bootstrap = s.kafka_bootstrap
        topic = "probe-alerts"
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need the handle
        admin.create_topics([NewTopic(topic, a.topic_partitions, 1)])[topic].result(60)
        spark = build_spark(s, "task-delivery-probe")
        run_id = uuid.uuid4().hex[:6]
        prod = Producer(producer_conf(bootstrap, f"probe-driver-{run_id}"))
        prod.init_transactions(60)
        marker = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-driver-{run_id}-progress"})
        batch_no = {"driver": 0}

        def driver_batch(kv: tuple[list[bytes], list[bytes]]) -> dict[str, float]:
            c0, t0 = time.process_time(), time.perf_counter()
            prod.begin_transaction()
            produce_records(prod, topic, *kv)
            batch_no["driver"] += 1
            prod.send_offsets_to_transaction(
                [TopicPartition(topic, 0, batch_no["driver"])], marker.consumer_group_metadata(), 60
            )
            prod.commit_transaction(60)
            return {"wall_ms": (time.perf_counter() - t0) * 1000, "cpu_ms": (time.process_time() - c0) * 1000}

        frames: dict[int, Any] = {}

        def frame(n: int) -> Any:
            if n not in frames:
                pad = "x" * max(a.value_bytes - 8, 0)
                df = spark.range(n).selectExpr(
                    "cast(id % 10000 as int) as subscription",
                    "cast(concat('sub', lpad(cast(id % 10000 as string), 5, '0'), '|S', "
                    "lpad(cast(id % 5000 as string), 5, '0')) as binary) as key",
                    f"concat(cast(lpad(cast(id as string), 8, '0') as binary), cast('{pad}' as binary)) as value",
                )
                frames[n] = df.persist()
                frames[n].count()
            return frames[n]

        tables: dict[int, Any] = {}

        def table(n: int) -> Any:
            """The driver's records as one Arrow table (made once, not timed)."""
            if n not in tables:
                import pyarrow as pa

                tables[n] = pa.table(
                    {
                        "subscription": pa.array([i % 10_000 for i in range(n)], pa.int32()),
                        "key": pa.array([k for k, _ in recs[n]], pa.binary()),
                        "value": pa.array([v for _, v in recs[n]], pa.binary()),
                    }
                )
            return tables[n]

        def tasks_batch(n: int, parts: int, ship: bool) -> dict[str, float]:
            key = f"{'ship' if ship else 'tasks'}{parts}"
            batch_no[key] = batch_no.get(key, 0) + 1
            fn = produce_partition(bootstrap, topic, f"probe-{run_id}-{key}", batch_no[key])
            c0, t0 = time.process_time(), time.perf_counter()
            df = spark.createDataFrame(table(n)) if ship else frame(n)
            rows = df.repartition(parts, "subscription").mapInArrow(fn, TASK_SCHEMA).collect()
            wall, cpu = (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000
            assert sum(r["n"] for r in rows) == n, rows
            return {
                "wall_ms": wall,
                "cpu_ms": cpu,
                "slowest_txn_ms": max(r["txn_ms"] for r in rows),
                "created": sum(r["created"] for r in rows),
            }

        sides = ["driver", *(f"tasks{p}" for p in tasks), *(f"ship{p}" for p in tasks if a.ship)]
        recs = {n: driver_records(n, a.value_bytes) for n in sizes}
        cols = {n: ([k for k, _ in recs[n]], [v for _, v in recs[n]]) for n in sizes}  # not timed
        for n in sizes:
            frame(n)
            if a.ship:
                table(n)

        def one(side: str, n: int) -> dict[str, float]:
            if side == "driver":
                return driver_batch(cols[n])
            return tasks_batch(
                n, int(side.removeprefix("tasks").removeprefix("ship")), side.startswith("ship")
            )

        for _ in range(a.warm_up):
            for side in sides:
                one(side, max(sizes))
        print(f"{'records':>9} {'side':>7} {'wall ms':>9} {'driver CPU ms':>14} {'CPU µs/record':>14} "
              f"{'slowest task txn ms':>20} {'producers made':>15}")  # fmt: skip
        for n in sizes:
            got: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
            for _ in range(a.repeat):
                for side in sides:
                    got[side].append(one(side, n))
            for side in sides:
                med = {k: statistics.median(r[k] for r in got[side]) for k in got[side][0]}
                made = sum(r.get("created", 0) for r in got[side])
                print(
                    f"{n:>9,} {side:>7} {med['wall_ms']:>9.1f} {med['cpu_ms']:>14.2f} "
                    f"{med['cpu_ms'] * 1000 / n:>14.3f} {med.get('slowest_txn_ms', float('nan')):>20.1f} {made:>15}",
                    flush=True,
                )
        spark.stop()
        prod.flush(10)
        marker.close()


if __name__ == "__main__":
    main()
