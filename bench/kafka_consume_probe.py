"""How fast can a librdkafka consumer in a Python driver hand Kafka records over?

The ceiling of the engine's direct source (``engine/sources/direct.py``): one topic of trades
(the engine bench's producer, 5,000 symbols, 2 partitions), read from the start by a
``read_committed`` consumer, rounds interleaved:

* ``messages``: ``consume()`` only (librdkafka fetches in its threads; Python gets one
  ``Message`` object per record);
* ``arrow``: the same, then the Arrow table the engine is handed
  (:func:`engine.sources.readers.records_table`);
* ``native``: the direct source's librdkafka consumer
  (:class:`engine.sources.native_consumer.NativeConsumer`, its settings), which fills the same Arrow
  table in Numba kernels, no Python object per record;
* ``fetch``: the direct source's default consumer (:class:`engine.sources.fetch_consumer.FetchConsumer`):
  Kafka's Fetch API on its own socket, record batches parsed into the same table by Numba.

records/s = records / wall time of the round.  Needs Kafka (``tidewatch up --services-only``)::

    .venv/bin/python bench/kafka_consume_probe.py --bootstrap 127.0.0.1:19092 --events 2000000
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import make_trades, produce  # noqa: E402


def native_round(bootstrap: str, topic: str, n: int, fetch: bool = False) -> float:
    import pyarrow as pa

    from engine.sources.fetch_consumer import FetchConsumer
    from engine.sources.native_consumer import NativeConsumer

    c = (FetchConsumer if fetch else NativeConsumer)(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 16 << 20,
            "queued.max.messages.kbytes": 64 << 10,
            "queued.min.messages": 1_000_000,
            "fetch.queue.backoff.ms": 20,
        }
    )
    c.assign([(topic, p, 0) for p in (0, 1)])
    got = 0
    t0 = time.perf_counter()
    try:
        while got < n:
            tables = [ch.table() for ch in [c.consume(50_000, 1.0)] if len(ch)]
            if tables:
                got += pa.concat_tables(tables).num_rows
    finally:
        c.close()
    return n / (time.perf_counter() - t0)


def one_round(bootstrap: str, topic: str, n: int, variant: str) -> float:
    from confluent_kafka import Consumer, TopicPartition

    from engine.sources.readers import records_table

    if variant in ("native", "fetch"):
        return native_round(bootstrap, topic, n, fetch=variant == "fetch")

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 16 << 20,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    got = 0
    t0 = time.perf_counter()
    try:
        while got < n:
            msgs = [m for m in c.consume(200_000, 1.0) if m.error() is None]
            if variant == "arrow" and msgs:
                records_table(msgs)
            got += len(msgs)
    finally:
        c.close()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:19092")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds of each variant")
    a = ap.parse_args()
    from confluent_kafka.admin import AdminClient

    from tidewatch.kafka.topics import create_topics, stream_topic_spec

    topic = f"probe-trades-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": a.bootstrap})
    create_topics(admin, [stream_topic_spec(topic, 2)])
    produced_s = produce(a.bootstrap, topic, make_trades(a.events, 5000, 50_000))
    print(f"produced {a.events:,} trades to {topic} in {produced_s:.1f} s", flush=True)
    rates: dict[str, list[float]] = {"messages": [], "arrow": [], "native": [], "fetch": []}
    for _ in range(a.rounds):
        for variant in rates:
            cpu0 = time.process_time()  # every thread of this process, librdkafka's included
            rates[variant].append(one_round(a.bootstrap, topic, a.events, variant))
            cpu_us = (time.process_time() - cpu0) / a.events * 1e6
            print(
                f"  {variant}: {rates[variant][-1]:,.0f} records/s, {cpu_us:.2f} CPU-us per record",
                flush=True,
            )
    for variant, r in rates.items():
        print(f"{variant}: {min(r):,.0f}-{max(r):,.0f} records/s over {len(r)} rounds")
    best = {v: max(r) for v, r in rates.items()}
    print(
        f"native / arrow (the engine's table both ways): {best['native'] / best['arrow']:.1f}x (best rounds)"
    )
    print(
        f"fetch / native (the direct source's two consumers): {best['fetch'] / best['native']:.1f}x (best rounds)"
    )
    admin.delete_topics([topic])
    print("command:", " ".join(sys.argv))


if __name__ == "__main__":
    main()
