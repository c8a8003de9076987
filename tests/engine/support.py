"""A reproducible engine scenario shared by the integration tests and the crash test.

Events, bad records and rules; helpers to produce them to Kafka, to run the backtest on the
same events, and to read the engine's Kafka output back with ``read_committed``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy.pool import NullPool

from tidewatch.settings import Settings
from tidewatch.wire.avro import decode, encode, encode_batch

G = 1000
RULES = {
    "count": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 10 SECONDS > 12",
    "sum": "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 20 SECONDS >= 900",
    "ask": "SELECT symbol FROM trades WHERE side = 'ASK' GROUP BY symbol "
    "HAVING SUM(size) OVER LAST 5 SECONDS > 200 AND AVG(price) OVER LAST 30 SECONDS < 55",
    "range": "SELECT symbol FROM trades GROUP BY symbol HAVING MAX(price) OVER LAST 15 SECONDS "
    "- MIN(price) OVER LAST 15 SECONDS > 20",
    "drop": "SELECT symbol FROM trades GROUP BY symbol HAVING LAST(price) OVER LAST 8 SECONDS "
    "< FIRST(price) OVER LAST 8 SECONDS",
    "scan": "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST 10 SECONDS > 8",
    "heavy": "SELECT src_ip FROM packets WHERE protocol = 'TCP' GROUP BY src_ip "
    "HAVING SUM(length) OVER LAST 5 SECONDS > 6000",
}
#: a predicate no other rule has (side = 'BID'): in the executors mode its history is read again from Kafka
LATE_RULE = (
    "late",
    "SELECT symbol FROM trades WHERE side = 'BID' GROUP BY symbol HAVING SUM(size) OVER LAST 30 SECONDS > 2500",
)


@dataclass
class Scenario:
    t0: int
    trades: dict[str, np.ndarray]
    packets: dict[str, np.ndarray]
    bad_trades: list[tuple[bytes, str]]  # (raw value, expected reason)
    sub_ids: dict[str, str] = field(default_factory=dict)  # rule name -> subscription id (uuid)

    @property
    def max_ts(self) -> int:
        return int(max(s["ts"].max() for s in (self.trades, self.packets) if len(s["ts"])))


def make_scenario(n_trades: int = 6000, n_packets: int = 4000, seconds: int = 150, seed: int = 0) -> Scenario:
    rng = np.random.default_rng(seed)
    t0 = (int(time.time() * 1000) - 20 * 60_000) // G * G  # 20 minutes ago: never "future"
    ts = t0 + np.sort(rng.integers(1, seconds * G, n_trades))
    trades = {
        "symbol": np.array([f"S{i}" for i in rng.integers(0, 12, n_trades)], dtype=object),
        "ts": ts.astype(np.int64),
        "price": np.round(rng.uniform(30, 80, n_trades), 2),
        "size": rng.integers(0, 100, n_trades).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n_trades),
        "exchange": np.array(["NASDAQ"] * n_trades, dtype=object),
    }
    pts = t0 + np.sort(rng.integers(1, seconds * G, n_packets))
    packets = {
        "ts": pts.astype(np.int64),
        "src_ip": np.array([f"10.0.0.{i}" for i in rng.integers(0, 8, n_packets)], dtype=object),
        "dst_ip": np.array([f"10.1.0.{i}" for i in rng.integers(0, 4, n_packets)], dtype=object),
        "src_port": rng.integers(1024, 65000, n_packets).astype(np.int64),
        "dst_port": rng.integers(1, 40, n_packets).astype(np.int64),
        "protocol": rng.choice(np.array(["TCP", "UDP"], dtype=object), n_packets),
        "length": rng.integers(40, 1500, n_packets).astype(np.int64),
        "tcp_flags": np.array(["S"] * n_packets, dtype=object),
    }
    base = {k: (v[0].item() if hasattr(v[0], "item") else v[0]) for k, v in trades.items()}
    bad = [
        (b"\x00\x00\x00\x00\x01garbage", "undecodable"),
        (b"not avro at all", "undecodable"),
        (encode("trades", {**base, "size": -5}), "invalid"),
        (encode("trades", {**base, "price": float("nan")}), "invalid"),
        (encode("trades", {**base, "symbol": ""}), "invalid"),
        (encode("trades", {**base, "ts": int(time.time() * 1000) + 3_600_000}), "future"),
    ]
    return Scenario(t0, trades, packets, bad)


def produce_rules(
    sc: Scenario,
    bootstrap: str,
    topic: str,
    rules: dict[str, str] | None = None,
    budgets: dict[str, int] | None = None,
) -> None:
    """Subscribe every rule of ``rules`` (default :data:`RULES`; JSON records on the subscriptions
    topic); ``budgets``: rule name -> its staleness budget (ms), for the rules that have one."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for name, text in (RULES if rules is None else rules).items():
        sid = sc.sub_ids.setdefault(name, str(uuid.uuid4()))
        doc: dict[str, Any] = {"id": sid, "name": name, "rule": text, "status": "active"}
        if budgets and name in budgets:
            doc["staleness_budget_ms"] = budgets[name]
        p.produce(topic, key=sid.encode(), value=json.dumps(doc).encode())
    p.flush()


def produce(
    sc: Scenario, bootstrap: str, topics: dict[str, str], config: dict[str, Any] | None = None
) -> None:
    """Trades (bad records mixed in) and packets, keyed by their key field, sent merged in
    event-time order as live feeds would send them: the engine's watermark is shared by the
    streams, so sending one whole stream before the other would make the second one late.

    One transaction: the engine reads ``read_committed``, so every partition's records appear
    at once.  Sent plainly, the producer's per-partition batches reached the broker one
    partition at a time, and a fast engine could read a whole batch of
    packets before any trade existed in Kafka: partitions it has never seen do not hold the
    watermark back, so the trades sent after were late (a race of the test, found by the
    SIGKILL test in a clean-clone run).

    ``config``: more producer configuration (e.g. ``compression.type``)."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "enable.idempotence": True,
            "transactional.id": f"scenario-{uuid.uuid4().hex[:8]}",
            **(config or {}),
        }
    )
    p.init_transactions(30)
    p.begin_transaction()
    tv = encode_batch("trades", sc.trades).messages()
    pv = encode_batch("packets", sc.packets).messages()
    rows = [(int(t), 0, i) for i, t in enumerate(sc.trades["ts"])]
    rows += [(int(t), 1, i) for i, t in enumerate(sc.packets["ts"])]
    rows.sort()
    every = len(tv) // (len(sc.bad_trades) + 1)
    bad = list(sc.bad_trades)
    for n, (_, stream, i) in enumerate(rows):
        if stream == 0:
            p.produce(topics["trades"], key=str(sc.trades["symbol"][i]).encode(), value=tv[i])
            if i and i % every == 0 and bad:
                p.produce(topics["trades"], key=b"S0", value=bad.pop(0)[0])
        else:
            p.produce(topics["packets"], key=str(sc.packets["src_ip"][i]).encode(), value=pv[i])
        if n % 1000 == 0:
            p.poll(0)
    p.commit_transaction(60)


def add_rule(sc: Scenario, bootstrap: str, topic: str, name: str, text: str) -> str:
    sid = sc.sub_ids.setdefault(name, str(uuid.uuid4()))
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, key=sid.encode(), value=json.dumps({"id": sid, "name": name, "rule": text}).encode())
    p.flush()
    return sid


def result_at(alerts: list[tuple[str, str, str, int]], until: int) -> set[str]:
    """The keys in a rule's result set at ``until``: its alerts ``(subscription, key, kind,
    as_of)`` replayed in ``as_of`` order (not in :func:`backtest`'s sorted order, where a key's
    ENTERs all come before its EXITs)."""
    keys: set[str] = set()
    for _, key, kind, _ in sorted((a for a in alerts if a[3] <= until), key=lambda a: a[3]):
        keys = keys | {key} if kind == "ENTER" else keys - {key}
    return keys


def backtest(
    sc: Scenario, rules: dict[str, str], until: int, skip: Callable[[int], frozenset[str]] | None = None
) -> list[tuple[str, str, str, int]]:
    """(subscription id, key, kind, as_of) of ``tidewatch backtest`` on the good events, as_of <=
    until; ``skip``: the subscriptions skipped at each lookup time (an overloaded engine's
    schedule, :func:`engine.overload.schedule`)."""
    from engine.evaluation.backtest import EventFile, iter_alerts
    from subscriptions.compiler import compile_rule
    from tidewatch.settings import get_settings

    plans = [(sc.sub_ids[n], t, compile_rule(t, get_settings())) for n, t in rules.items()]
    files = [EventFile("trades", dict(sc.trades)), EventFile("packets", dict(sc.packets))]
    return sorted(
        (rule, key, kind, int(as_of))
        for as_of, rule, key, kind in iter_alerts(plans, files, G, ci_p=2, skip=skip)
        if as_of <= until
    )


def own_topics(s: Settings, prefix: str, **update: Any) -> Settings:
    """``s`` with topics of its own: ``<prefix>-<topic>-<run>`` for every topic setting, ``run`` a
    fresh random id (a test's records meet no other test's), and ``update`` applied too."""
    run = uuid.uuid4().hex[:6]
    topics = ("alerts", "results", "dead_letter", "trades", "packets", "subscriptions")
    return s.model_copy(
        update={f"topic_{t}": f"{prefix}-{t.replace('_', '-')}-{run}" for t in topics} | update
    )


def read_topic(
    bootstrap: str,
    topic: str,
    schema: str | None,
    timeout: float = 20.0,
    *,
    messages: bool = False,
    expect_open: bool = False,
) -> list[Any]:
    """Every committed record of a topic (decoded when ``schema`` is given), read_committed; with
    ``messages``, every one as ``(partition, key, value)``, tombstones (value None) included.

    Read up to each partition's end at the call (its high watermark); a partition not read to its
    end within ``timeout`` seconds is named in a warning (pytest lists it in the summary) and what
    was read is returned: a caller may expect a transaction still open.  A clean-clone run (Nov 29)
    read one of a fresh topic's partitions and not the other in a test that then failed; the
    warning says next time whether the read stopped at the deadline.  The ends are
    :func:`end_offsets` (high watermarks, not the last stable offsets of the call), so the records
    of a transaction still open count: ``expect_open`` (a check that they stay invisible) reads
    until ``timeout`` and returns what was committed meanwhile, without the warning."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    ends = end_offsets(bootstrap, topic)
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    out: list[Any] = []
    done = {p for p, hi in ends.items() if hi == 0}
    deadline = time.monotonic() + timeout
    while len(done) < len(ends) and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            if m.error():
                continue
            value, offset, part = m.value(), m.offset(), int(m.partition() or 0)
            if messages:
                out.append((part, m.key(), value))
            elif value is not None:
                out.append(decode(value, schema) if schema else value)
            if offset is not None and offset >= ends[part] - 1:
                done.add(part)
        # transaction markers: the last offset may be a control record
        for p, hi in ends.items():
            pos = c.position([TopicPartition(topic, p)])[0].offset
            if pos >= hi:
                done.add(p)
    c.close()
    if len(done) < len(ends) and not expect_open:
        short = sorted(set(ends) - done)
        warnings.warn(
            f"read_topic({topic!r}): partitions {short} not read to their end in {timeout} s", stacklevel=2
        )
    return out


def engine_env(s: Settings, bootstrap: str, db: str) -> dict[str, str]:
    """Environment of ``tidewatch engine run`` for the settings ``s`` of a test (its topics,
    checkpoint, small micro-batches)."""
    env = dict(os.environ)
    env.update(
        {
            "TIDEWATCH_KAFKA_BOOTSTRAP": bootstrap,
            "TIDEWATCH_DATABASE_URL": db,
            "TIDEWATCH_TOPIC_TRADES": s.topic_trades,
            "TIDEWATCH_TOPIC_PACKETS": s.topic_packets,
            "TIDEWATCH_TOPIC_SUBSCRIPTIONS": s.topic_subscriptions,
            "TIDEWATCH_TOPIC_ALERTS": s.topic_alerts,
            "TIDEWATCH_TOPIC_RESULTS": s.topic_results,
            "TIDEWATCH_TOPIC_DEAD_LETTER": s.topic_dead_letter,
            "TIDEWATCH_ALLOWED_LATENESS_MS": str(s.allowed_lateness_ms),
            "TIDEWATCH_ENGINE_HISTORY_MS": str(s.engine_history_ms),
            "TIDEWATCH_SNAPSHOT_EVERY_BATCHES": "2",
            "TIDEWATCH_ENGINE_MAX_OFFSETS_PER_TRIGGER": "400",
            "TIDEWATCH_TRIGGER_SECONDS": "0.2",
            "TIDEWATCH_CHECKPOINT_DIR": str(s.checkpoint_dir),
            "TIDEWATCH_SPARK_MASTER": "local[2]",
        }
    )
    return env


def start_engine(env: dict[str, str], log: Path, run: str) -> subprocess.Popen[bytes]:
    """``tidewatch engine run`` in a subprocess of its own process group, output appended to ``log``."""
    cmd = [sys.executable, "-m", "tidewatch.cli", "engine", "run", "--engine-id", run]
    return subprocess.Popen(
        cmd, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True
    )


def restarts_logged(text: str) -> int:
    """How many of the engine's starts in its log ``text`` rebuilt the state it had: the driver's
    engine says "replaying batches" or "restored the state snapshot" (engine.app); with shards
    (``engine_shards`` >= 1) shard 0's first batch of a run is "rebuilt" from Spark's state store
    (the batch line of engine.shards.engine)."""
    return sum(
        text.count(s)
        for s in ("replaying batches", "restored the state snapshot", "shard 0 rebuilt (Python worker")
    )


def kill_engine(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the engine's process group (Spark's JVM included) and wait for it."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def progress(db: str) -> tuple[int, int | None]:
    """(committed batches, newest watermark in ms) of the engine's database."""
    eng = sa.create_engine(db, poolclass=NullPool)
    try:
        with eng.connect() as conn:
            n, wm = conn.execute(sa.text("SELECT count(*), max(watermark) FROM engine_batches")).one()
    finally:
        eng.dispose()
    return int(n), None if wm is None else round(wm.timestamp() * 1000)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Every partition's high watermark (every record written; a commit marker once the
    coordinator wrote it, which may be after ``commit_transaction`` returned), from a client set to
    ``read_uncommitted`` -- librdkafka's default is ``read_committed``, for which ListOffsets
    answers the last stable offset: a transaction's first offset until the coordinator has
    written its commit markers, asynchronously, after ``commit_transaction`` returned (right
    after a commit, 12 of 30 two-partition topics answered 0 for a partition, Dec 1).  Reading
    up to the last stable offset of that moment is what lost a committed transaction's tail in
    a clean-clone run of tests/engine/sinks/test_publish_batch.py."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4()}",
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: int(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]) for p in parts}
    finally:
        c.close()


def read_everything(app: Any, want: dict[str, dict[int, int]]) -> bool:
    """Whether the engine's last batch reaches ``want`` ({topic: {partition: offset}}, e.g. of
    :func:`end_offsets`) on every partition: the driver engine's batch log's Spark end offsets,
    or for a sharded engine (``metas``) Spark's offset log of the last batch its shards ran."""
    from engine.sources.offsets import BatchLog, spark_end_offsets

    if hasattr(app, "metas"):
        if not app.metas:
            return False
        ends = spark_end_offsets(app.checkpoint / "spark", min(m.batch_id for m in app.metas.values())) or {}
    elif app.core.last_batch < 0:
        return False
    else:
        ends = BatchLog.read(app._batch_log(app.core.last_batch)).ends or {}
    return all(ends.get(t, {}).get(p, -1) >= o for t, ps in want.items() for p, o in ps.items())
