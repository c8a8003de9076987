"""Produce rate of trades to a real Kafka broker with Avro encoding.

Two ways side by side in the same process, on the same synthetic trades:

* **baseline**: fastavro ``schemaless_writer`` per record + ``Producer.produce``
  per record (the obvious implementation);
* **tidewatch**: :func:`tidewatch.wire.avro.encode_batch` (one Numba pass per chunk)
  + :class:`ingest.producer.KafkaFeed` (idempotent producer, lz4, large batches).

Each run ends with ``flush()``: a record counts only once the broker has
acknowledged it, and the topic's end offsets are checked against the count.
With ``--cores 1`` (the default) the whole process -- Python and librdkafka's
threads -- is pinned to one CPU core, so the figure is "trades/s on one core";
the broker (another process) is not pinned.

    .venv/bin/python bench/produce_bench.py [--bootstrap HOST:PORT] [--n 2000000]
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import sys
import time
import uuid
from typing import Any

import fastavro
from confluent_kafka import Consumer, Producer, TopicPartition

from ingest.producer import KafkaFeed, ensure_topic, key_table, producer_config
from ingest.trades_gen import TradeConfig, TradeGenerator
from tidewatch.settings import get_settings
from tidewatch.wire.avro import encode_batch, header, parsed_schema, schema_id
from tidewatch.wire.csv_io import columns_to_frame


def make_chunks(n: int, chunk: int, seed: int) -> list[dict[str, Any]]:
    gen = TradeGenerator(TradeConfig(rate=chunk, intraday=False), seed=seed)
    out, got, t = [], 0, 0
    while got < n:
        ch = gen.chunk(t, t + 1000)
        t += 1000
        out.append(ch)
        got += len(ch["ts"])
    return out


def end_offsets(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}"})
    md = c.list_topics(topic, timeout=10).topics[topic]
    total = 0
    for p in md.partitions:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        total += hi - lo
    c.close()
    return total


def run_tidewatch(bootstrap: str, topic: str, chunks: list[dict]) -> dict:
    ensure_topic(get_settings(), bootstrap, topic)
    feed = KafkaFeed("trades", settings=get_settings(), topic=topic, bootstrap=bootstrap)
    c0, t0 = time.process_time(), time.perf_counter()
    for ch in chunks:
        feed.send(ch)
    t_sent = time.perf_counter()
    st = feed.close(timeout=120)
    t1, c1 = time.perf_counter(), time.process_time()
    n = st.produced
    return {
        "n": n,
        "wall": t1 - t0,
        "cpu": c1 - c0,
        "send": t_sent - t0,
        "failed": st.failed,
        "unconfirmed": st.unconfirmed,
        "bytes": st.bytes,
    }


def run_baseline(bootstrap: str, topic: str, chunks: list[dict]) -> dict:
    """fastavro per record, produce per record -- same producer settings."""
    ensure_topic(get_settings(), bootstrap, topic)
    failed = []
    p = Producer(producer_config(get_settings(), bootstrap, on_delivery=lambda e, m: failed.append(e)))
    schema = parsed_schema("trades")
    hdr = header(schema_id("trades"))
    c0, t0 = time.process_time(), time.perf_counter()
    n = nbytes = 0
    for ch in chunks:
        recs = columns_to_frame(ch, "trades").to_dict("records")  # rows as dicts (not timed apart)
        keys, kc = key_table(ch["symbol"])
        for i, r in enumerate(recs):
            buf = io.BytesIO()
            buf.write(hdr)
            fastavro.schemaless_writer(buf, schema, r)
            v = buf.getvalue()
            while True:
                try:
                    p.produce(topic, v, keys[kc[i]])
                    break
                except BufferError:
                    p.poll(0.05)
            nbytes += len(v)
            if i % 2000 == 0:
                p.poll(0)
        n += len(recs)
    t_sent = time.perf_counter()
    left = p.flush(120)
    t1, c1 = time.perf_counter(), time.process_time()
    return {
        "n": n,
        "wall": t1 - t0,
        "cpu": c1 - c0,
        "send": t_sent - t0,
        "failed": len(failed),
        "unconfirmed": left,
        "bytes": nbytes,
    }


def warm_up(bootstrap: str) -> None:
    """One acked idempotent produce first, so a fresh broker's coordinator load is not timed."""
    ensure_topic(get_settings(), bootstrap, "bench-warmup", 1)
    p = Producer(producer_config(get_settings(), bootstrap))
    p.produce("bench-warmup", b"warm-up")
    p.flush(120)


def encode_only(chunks: list[dict]) -> tuple[float, float]:
    """(records/s of encode_batch, records/s of fastavro per record) without Kafka."""
    n = sum(len(c["ts"]) for c in chunks)
    t0 = time.perf_counter()
    for ch in chunks:
        encode_batch("trades", ch)
    vec = n / (time.perf_counter() - t0)
    schema = parsed_schema("trades")
    recs = columns_to_frame(chunks[0], "trades").to_dict("records")
    t0 = time.perf_counter()
    for r in recs:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, r)
    base = len(recs) / (time.perf_counter() - t0)
    return vec, base


def main(argv: list[str] | None = None) -> int:
    s = get_settings()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=s.kafka_bootstrap)
    ap.add_argument("--n", type=int, default=2_000_000, help="trades for the tidewatch run")
    ap.add_argument("--baseline-n", type=int, default=300_000, help="trades for the (slow) baseline run")
    ap.add_argument("--chunk", type=int, default=200_000, help="trades per encoded chunk")
    ap.add_argument("--cores", type=int, default=1, help="pin the process to this many cores (0: no pinning)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    cmd = "python bench/produce_bench.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    if args.cores:
        cpus = sorted(os.sched_getaffinity(0))[: args.cores]
        os.sched_setaffinity(0, set(cpus))
    chunks = make_chunks(args.n, args.chunk, args.seed)
    # warm up the Numba kernels (compile or load from cache) outside the timing
    encode_batch("trades", {k: (v if not hasattr(v, "codes") else v) for k, v in chunks[0].items()})
    vec, base = encode_only(chunks)
    run = uuid.uuid4().hex[:8]
    tw_topic, base_topic = f"bench-trades-{run}", f"bench-trades-baseline-{run}"
    base_chunks, got = [], 0
    for ch in chunks:
        if got >= args.baseline_n:
            break
        base_chunks.append(ch)
        got += len(ch["ts"])
    warm_up(args.bootstrap)
    b = run_baseline(args.bootstrap, base_topic, base_chunks)
    t = run_tidewatch(args.bootstrap, tw_topic, chunks)
    on_broker_t = end_offsets(args.bootstrap, tw_topic)
    on_broker_b = end_offsets(args.bootstrap, base_topic)
    print(f"command: {cmd}")
    print(
        f"broker {args.bootstrap}; pinned to {args.cores or 'all'} core(s) of {os.cpu_count()}; "
        f"{t['bytes'] / max(t['n'], 1):.1f} bytes/record (framed Avro)"
    )
    print(
        f"encode only (no Kafka):  encode_batch {vec:,.0f} rec/s   fastavro per record {base:,.0f} rec/s   "
        f"ratio {vec / base:.1f}x"
    )
    for name, r, ob in (
        ("baseline fastavro+produce", b, on_broker_b),
        ("tidewatch KafkaFeed", t, on_broker_t),
    ):
        print(
            f"{name:27s} {r['n']:>10,} trades  {r['n'] / r['wall']:>10,.0f} trades/s (wall, to acked)  "
            f"{r['n'] / r['cpu']:>10,.0f} trades per CPU-s  failed {r['failed']}  unconfirmed {r['unconfirmed']}  "
            f"on broker {ob:,}  (send {r['send']:.2f} s + flush {r['wall'] - r['send']:.2f} s)"
        )
    ratio = (t["n"] / t["wall"]) / (b["n"] / b["wall"])
    print(
        f"produce rate tidewatch / baseline: {ratio:.1f}x; target >= 200,000 trades/s: "
        f"{'MET' if t['n'] / t['wall'] >= 200_000 else 'NOT MET'} ({t['n'] / t['wall']:,.0f})"
    )
    ok = on_broker_t == t["n"] and t["failed"] == 0 and t["unconfirmed"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
