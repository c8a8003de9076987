"""Tidewatch's engine side by side with the plain-Spark baseline: same events, same rules, one run.

Both sides read the same Kafka ``trades`` topic (Avro, 5,000 symbols, Zipf-skewed activity) on
the same SparkSession (``local[2]``) in the same process:

* **baseline** (:mod:`bench.spark_baseline`): one ``groupBy(window(ts, T, slide), symbol)`` +
  HAVING per rule (``queries``: a streaming query per rule; ``union``: one query over the
  union), draining the backlog with ``Trigger.AvailableNow`` to the ``noop`` sink;
* **Tidewatch** (:class:`engine.app.EngineApp`): the same rules subscribed through the
  ``subscriptions`` topic, then the same events; every rule is looked up at every 1 s pane
  (a finer slide than the baseline's), alerts committed to PostgreSQL and published to Kafka
  exactly once.

Sustained events/s = events drained / wall seconds (the baseline's rate counts the rows its
slowest query read when it did not finish within ``--timeout``).  Needs Kafka and PostgreSQL
(``tidewatch up``, or ``--bootstrap`` / ``--database-url``); each run makes its own topics and
database.

    .venv/bin/python bench/engine_bench.py --rules 10 --events 100000
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.spark_baseline import make_rules, run_baseline  # noqa: E402


def make_trades(n: int, n_symbols: int, rate: float, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` trades at ``rate`` events/s of event time, ending a minute ago (never "future")."""
    rng = np.random.default_rng(seed)
    span_ms = int(n / rate * 1000)
    t_end = int(time.time() * 1000) - 60_000
    ts = np.sort(rng.integers(t_end - span_ms, t_end, n)).astype(np.int64)
    ranks = rng.zipf(1.2, n) % n_symbols
    return {
        "symbol": np.array([f"S{i:05d}" for i in range(n_symbols)], dtype=object)[ranks],
        "ts": ts,
        "price": np.round(rng.uniform(10, 200, n), 2),
        "size": rng.integers(1, 1000, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n),
        "exchange": np.array(["NASDAQ"] * n, dtype=object),
    }


def produce(bootstrap: str, topic: str, cols: dict[str, np.ndarray]) -> float:
    from confluent_kafka import Producer

    from ingest.avro import encode_batch

    t0 = time.perf_counter()
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "queue.buffering.max.messages": 2_000_000,
            "batch.num.messages": 10_000,
            "compression.type": "lz4",
        }
    )
    for i, (sym, v) in enumerate(zip(cols["symbol"], encode_batch("trades", cols).messages(), strict=True)):
        p.produce(topic, key=sym.encode(), value=v)
        if i % 50_000 == 0:
            p.poll(0)
    p.flush()
    return time.perf_counter() - t0


def fresh_database(admin_url: str) -> str:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tidewatch.db.migrate import upgrade

    name = f"bench_{uuid.uuid4().hex[:10]}"
    eng = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    eng.dispose()
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    return url


def run_tidewatch(
    spark: Any,
    settings: Any,
    bootstrap: str,
    db: str,
    rules: list[Any],
    cols: dict[str, np.ndarray],
    max_offsets: int,
    timeout_s: float,
) -> dict[str, Any]:
    import json as _json

    import psutil
    from confluent_kafka import Producer

    from engine.app import EngineApp

    app = EngineApp(settings, bootstrap=bootstrap, pg_url=db, engine_id=uuid.uuid4().hex[:8])
    p = Producer({"bootstrap.servers": bootstrap})
    for r in rules:
        sid = str(uuid.uuid4())
        p.produce(
            settings.topic_subscriptions,
            key=sid.encode(),
            value=_json.dumps({"id": sid, "name": r.name, "rule": r.text}).encode(),
        )
    p.flush()
    q = app.start(spark, trigger_seconds=0.05, max_offsets_per_trigger=max_offsets)
    try:
        deadline = time.monotonic() + 120
        while len(app.core.rules) < len(rules) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(app.core.rules) == len(rules), "rules not active"
        n = len(cols["ts"])
        produce(bootstrap, settings.topic_trades, cols)

        def seen() -> float:  # every record is either applied or dead-lettered (e.g. late)
            return app.totals["events"] + app.totals["dead_letters"]

        ev0 = seen()
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while seen() - ev0 < n and time.monotonic() < deadline:
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        done = int(seen() - ev0)
    finally:
        q.stop()
        app.close()
    rss = psutil.Process().memory_info().rss
    return {
        "seconds": wall,
        "events": done,
        "finished": done >= n,
        "alerts": int(app.totals["alerts"]),
        "dead_letters": int(app.totals["dead_letters"]),
        "batches": app.batches_done,
        "state_bytes": app.core.state_nbytes(),
        "driver_rss_bytes": rss,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=None, help="Kafka (default: settings.kafka_bootstrap)")
    ap.add_argument(
        "--database-url", default=None, help="PostgreSQL server URL (a fresh database is made on it)"
    )
    ap.add_argument("--rules", type=int, default=10)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--symbols", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=1000.0, help="event-time rate of the data set (events/s)")
    ap.add_argument("--slide", type=int, default=60, help="the baseline's slide in seconds")
    ap.add_argument("--shapes", default="queries,union", help="baseline shapes to run (queries, union)")
    ap.add_argument("--max-offsets", type=int, default=20_000, help="maxOffsetsPerTrigger, both sides")
    ap.add_argument("--timeout", type=float, default=300, help="seconds each side may take")
    ap.add_argument("--lateness-ms", type=int, default=60_000, help="Tidewatch's allowed lateness")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--verbose", action="store_true", help="log every engine batch")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("tidewatch.engine").setLevel(logging.INFO if a.verbose else logging.WARNING)

    from engine.spark_session import build_spark
    from tidewatch.settings import get_settings

    base = get_settings()
    bootstrap = a.bootstrap or base.kafka_bootstrap
    run = uuid.uuid4().hex[:8]
    settings = base.model_copy(update={
        "topic_trades": f"bench-trades-{run}", "topic_packets": f"bench-packets-{run}",
        "topic_subscriptions": f"bench-subscriptions-{run}", "topic_alerts": f"bench-alerts-{run}",
        "topic_results": f"bench-results-{run}", "topic_dead_letter": f"bench-dead-letter-{run}",
        "checkpoint_dir": Path(tempfile.mkdtemp(prefix="tw-engine-bench-")), "snapshot_every_batches": 10**9, "allowed_lateness_ms": a.lateness_ms,
    })  # fmt: skip
    from engine.publish import ensure_topics

    ensure_topics(bootstrap, settings)
    rules = make_rules(a.rules)
    cols = make_trades(a.events, a.symbols, a.rate)
    spark = build_spark(settings, "tidewatch-engine-bench")
    out: dict[str, Any] = {
        "rules": a.rules,
        "events": a.events,
        "symbols": a.symbols,
        "slide_s": a.slide,
        "max_offsets_per_trigger": a.max_offsets,
        "command": " ".join(sys.argv),
    }
    try:
        db = fresh_database(a.database_url or base.sqlalchemy_url)
        tw = run_tidewatch(spark, settings, bootstrap, db, rules, cols, a.max_offsets, a.timeout)
        tw["events_per_s"] = tw["events"] / tw["seconds"]
        out["tidewatch"] = tw
        print(
            f"tidewatch: {tw['events']:,} events in {tw['seconds']:.1f} s = {tw['events_per_s']:,.0f} events/s "
            f"({tw['batches']} batches, {tw['alerts']:,} alerts, {tw['dead_letters']:,} dead letters, state {tw['state_bytes'] / 1e6:.1f} MB, "
            f"driver RSS {tw['driver_rss_bytes'] / 1e9:.2f} GB)",
            flush=True,
        )
        for shape in [s for s in a.shapes.split(",") if s]:
            res = run_baseline(
                spark,
                bootstrap,
                settings.topic_trades,
                rules,
                slide_s=a.slide,
                shape=shape,
                max_offsets=a.max_offsets,
                timeout_s=a.timeout,
            )
            n = a.events if res["finished"] else res["processed"]
            res["events_per_s"] = n / res["seconds"]
            out[f"baseline_{shape}"] = res
            ratio = tw["events_per_s"] / res["events_per_s"] if res["events_per_s"] else float("inf")
            print(
                f"baseline ({shape}, slide {a.slide} s): {n:,} events in {res['seconds']:.1f} s = "
                f"{res['events_per_s']:,.0f} events/s, finished={res['finished']}"
                f"{' errors=' + str(res['errors'])[:300] if res['errors'] else ''}; "
                f"Tidewatch / baseline = {ratio:,.1f}x",
                flush=True,
            )
    finally:
        spark.stop()
    print("command:", out["command"])
    if a.json:
        a.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
