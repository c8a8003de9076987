"""The engine reads compressed topics: every codec Kafka has, set by the producer or by the topic.

For each codec (gzip, snappy, lz4, zstd) and each place it can be set -- the producer's
``compression.type`` (the broker keeps the producer's batches), or the topic's
``compression.type`` with an uncompressed producer (the broker recompresses) -- a small scenario
of trades and packets goes to topics of its own, read by an engine of its own (its own
database, checkpoint and transactional id); the eight engines run side by side as eight queries
of one Spark session.  Nothing may be skipped silently: the alert log equals
``tidewatch backtest`` on the same events, every event is counted as applied, nothing is
dead-lettered, and the offsets Spark's Kafka source consumed reach the end of every partition.
The broker's log segments are dumped to check that the batches really are stored with the
codec under test (else the test would prove nothing).  The producer's batches are small and the
micro-batches smaller than a partition, so a micro-batch's offset range starts and ends inside
compressed record batches.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

pytestmark = pytest.mark.integration

from tests.containers import ContainerRuntime, dump_log_batches  # noqa: E402
from tests.engine.support import (  # noqa: E402
    RULES,
    G,
    Scenario,
    backtest,
    make_scenario,
    produce,
    produce_rules,
    read_topic,
)
from tests.engine.support import end_offsets as support_end_offsets  # noqa: E402
from tests.engine.test_engine_integration import (  # noqa: E402
    engine_settings,
    fresh_database,
    topics_of,
    wait_for,
)
from tests.services import create_database  # noqa: E402
from tidewatch.kafka.topics import TopicSpec, create_topics  # noqa: E402
from tidewatch.settings import Settings  # noqa: E402

CODECS = ("gzip", "snappy", "lz4", "zstd")
WHERE = ("producer", "topic")
N_TRADES, N_PACKETS, SECONDS = 1200, 500, 60
#: small producer batches: several compressed record batches per partition (about 100 records each)
PRODUCER_BATCH_BYTES = 4096
#: fewer records per micro-batch than a partition holds, so micro-batches start and end inside
#: compressed record batches (the consumer must decompress a batch and skip what it already read)
MAX_OFFSETS_PER_TRIGGER = 400


@dataclass
class Case:
    codec: str
    where: str
    settings: Settings
    db: str
    scenario: Scenario
    app: Any = None
    query: Any = None
    progress: list[Any] | None = None

    @property
    def name(self) -> str:
        return f"{self.codec}/{self.where}"

    @property
    def final(self) -> int:
        return (self.scenario.max_ts - self.settings.allowed_lateness_ms) // G * G

    @property
    def stream_topics(self) -> list[str]:
        return [self.settings.topic_trades, self.settings.topic_packets]


def copy_database(pg_url: str, template: str) -> str:
    """A new database copied from the migrated ``template`` (faster than migrating each)."""
    return create_database(pg_url, "engine_", template=template)


def topic_compression(bootstrap: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([res])[res].result(timeout=30)
    return str(configs["compression.type"].value)


def end_offsets(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    """The end (high watermark, :func:`tests.engine.support.end_offsets`) of every partition of ``topics``."""
    return {(t, p): hi for t in topics for p, hi in support_end_offsets(bootstrap, t).items()}


def consumed_offsets(progress: list[Any]) -> dict[tuple[str, int], int]:
    """The largest end offset per partition in the query's progress reports (Spark's Kafka
    source: the next offset to read, so the partition's end once it has read everything)."""
    out: dict[tuple[str, int], int] = {}
    for p in progress:
        sources = p["sources"] if isinstance(p, dict) else p.sources
        for src in sources:
            end = src["endOffset"] if isinstance(src, dict) else src.endOffset
            offsets = json.loads(end) if isinstance(end, str) else end
            for t, parts in (offsets or {}).items():
                for part, off in parts.items():
                    key = (t, int(part))
                    out[key] = max(out.get(key, -1), int(off))
    return out


@dataclass
class StoredBatch:
    base: int
    last: int
    codec: str
    control: bool


def stored_batches(
    runtime: ContainerRuntime, bootstrap: str, topics: dict[str, int]
) -> dict[tuple[str, int], list[StoredBatch]]:
    """Per (topic, partition), its record batches as the broker stored them."""
    out: dict[tuple[str, int], list[StoredBatch]] = {}
    for part, lines in dump_log_batches(runtime, bootstrap, topics).items():
        rows = out.setdefault(part, [])
        for line in lines:
            fields = dict(re.findall(r"(\w+): (\S+)", line))
            rows.append(
                StoredBatch(
                    int(fields["baseOffset"]),
                    int(fields["lastOffset"]),
                    fields.get("compresscodec", "?").lower(),
                    fields.get("isControl") == "true",
                )
            )
    return out


def micro_batch_starts(case: Case) -> dict[tuple[str, int], list[int]]:
    """The first offset of each partition in each of the engine's micro-batches (its batch logs)."""
    from engine.sources.offsets import BatchLog

    out: dict[tuple[str, int], list[int]] = {}
    for f in sorted((case.app.state_dir / "batches").glob("*.json")):
        for t, parts in BatchLog.read(f).ranges.items():
            for p, (first, _) in parts.items():
                out.setdefault((t, int(p)), []).append(int(first))
    return out


def test_every_codec_set_by_producer_or_topic_is_read_whole(
    spark: Any,
    kafka_bootstrap: str,
    pg_url: str,
    container_runtime: ContainerRuntime,
    tmp_path: Path,
) -> None:
    from engine.app import EngineApp
    from engine.sinks.publish import ensure_topics

    bootstrap = kafka_bootstrap
    t_start = time.monotonic()
    template = fresh_database(pg_url)
    cases: list[Case] = []
    for i, (codec, where) in enumerate((c, w) for c in CODECS for w in WHERE):
        run = f"{codec}-{where}-{uuid.uuid4().hex[:6]}"
        s = engine_settings(run, tmp_path / run)
        if where == "topic":  # created before the engine creates the rest from the spec
            admin = AdminClient({"bootstrap.servers": bootstrap})
            create_topics(
                admin,
                [
                    TopicSpec(t, s.topic_partitions, {"compression.type": codec})
                    for t in (s.topic_trades, s.topic_packets)
                ],
            )
        ensure_topics(bootstrap, s)
        sc = make_scenario(n_trades=N_TRADES, n_packets=N_PACKETS, seconds=SECONDS, seed=i)
        sc.bad_trades = []  # every record is good: a dead letter is a finding
        produce_rules(sc, bootstrap, s.topic_subscriptions)
        cases.append(Case(codec, where, s, copy_database(pg_url, template), sc))
    for c in cases:
        c.app = EngineApp(c.settings, bootstrap=bootstrap, pg_url=c.db, engine_id=c.settings.topic_trades)
        c.query = c.app.start(spark, trigger_seconds=0.5, max_offsets_per_trigger=MAX_OFFSETS_PER_TRIGGER)
    t_started = time.monotonic()
    try:
        wait_for(lambda: all(len(c.app.core.rules) == len(RULES) for c in cases), 180, "every engine's rules")
        for c in cases:
            config = {
                "compression.type": c.codec if c.where == "producer" else "none",
                "batch.size": PRODUCER_BATCH_BYTES,
            }
            produce(c.scenario, bootstrap, topics_of(c.settings), config)
        t_produced = time.monotonic()
        wait_for(
            lambda: all(c.app.core.applied_until == c.final for c in cases),
            240,
            "every engine to look up at its last pane "
            + str({c.name: (c.app.core.applied_until, c.final) for c in cases}),
        )
        t_done = time.monotonic()
        # Spark's progress report of the batch that read the last records may come a moment later
        ends = end_offsets(bootstrap, [t for c in cases for t in c.stream_topics])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for c in cases:
                c.progress = list(c.query.recentProgress)
            seen = {}
            for c in cases:
                seen.update(consumed_offsets(c.progress or []))
            if all(seen.get(k, -1) >= v for k, v in ends.items()):
                break
            time.sleep(0.5)
    finally:
        for c in cases:
            if c.query is not None:
                c.query.stop()
        for c in cases:
            if c.app is not None:
                c.app.close()

    failures: list[str] = []
    report: list[str] = []
    stored = stored_batches(
        container_runtime, bootstrap, {t: c.settings.topic_partitions for c in cases for t in c.stream_topics}
    )
    for c in cases:
        s, sc, app = c.settings, c.scenario, c.app
        # the codec really is in use: the topic's config, the batches the broker stored
        if c.where == "topic":
            for t in c.stream_topics:
                if topic_compression(bootstrap, t) != c.codec:
                    failures.append(
                        f"{c.name}: topic {t} has compression.type {topic_compression(bootstrap, t)}"
                    )
        mine = {k: v for k, v in stored.items() if k[0] in c.stream_topics}
        data = [b for batches in mine.values() for b in batches if not b.control]
        codecs = {b.codec for b in data}
        # the broker recompresses every batch of a topic with compression.type set; a producer
        # sends a batch uncompressed when compressing would make it larger (librdkafka's
        # rdkafka_msgset_writer.c: "If the compressed data is larger than the uncompressed size
        # then throw it away and send as uncompressed" -- a small batch, lz4's frame overhead)
        allowed = {c.codec} if c.where == "topic" else {c.codec, "none"}
        if c.codec not in codecs or not codecs <= allowed:
            failures.append(f"{c.name}: stored record batches by codec {codecs}, expected {sorted(allowed)}")
        # micro-batches that start inside a compressed record batch (the consumer decompresses the
        # batch and skips the records before its position)
        inside = sum(
            any(b.base < first <= b.last for b in mine[part] if not b.control)
            for part, firsts in micro_batch_starts(c).items()
            if part in mine
            for first in firsts
        )
        if not inside:
            failures.append(f"{c.name}: no micro-batch started inside a record batch (test too easy)")
        # every record applied, none dead-lettered
        n_events = len(sc.trades["ts"]) + len(sc.packets["ts"])
        if int(app.totals["events"]) != n_events:
            failures.append(f"{c.name}: {int(app.totals['events'])} events applied of {n_events}")
        if app.totals["dead_letters"]:
            failures.append(f"{c.name}: {int(app.totals['dead_letters'])} dead letters")
        dead = read_topic(bootstrap, s.topic_dead_letter, "dead_letter")
        if dead:
            failures.append(f"{c.name}: dead-letter topic has {len(dead)}: {[d['reason'] for d in dead][:5]}")
        # the source's consumed offsets reach the end of every partition
        consumed = consumed_offsets(c.progress or [])
        short = {
            f"{t}[{p}]": (consumed.get((t, p)), end)
            for (t, p), end in ends.items()
            if t in c.stream_topics and consumed.get((t, p), -1) < end
        }
        if short:
            failures.append(f"{c.name}: consumed offsets short of the end (consumed, end): {short}")
        # the alert log equals the backtest
        got = sorted(app.store.alert_log())
        expect = backtest(sc, RULES, c.final)
        if not expect:
            failures.append(f"{c.name}: the scenario has no alerts (too small to test anything)")
        if got != expect:
            missing, extra = sorted(set(expect) - set(got)), sorted(set(got) - set(expect))
            failures.append(f"{c.name}: missing {len(missing)} {missing[:3]}, extra {len(extra)} {extra[:3]}")
        report.append(
            f"{c.name}: {n_events} events in {len(data)} {c.codec} record batches, read in "
            f"{app.batches_done} micro-batches ({inside} partition reads starting inside a record "
            f"batch); {len(got)} alerts (backtest {len(expect)}), {int(app.totals['dead_letters'])} dead letters"
        )
    print(
        "\n".join(report)
        + f"\nset-up {t_started - t_start:.1f} s, rules active + produce {t_produced - t_started:.1f} s, "
        f"engines done {t_done - t_produced:.1f} s after the last record was produced"
    )
    assert not failures, "\n".join(failures)
