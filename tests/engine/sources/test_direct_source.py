"""The direct Kafka source (``engine.sources.direct.DirectSource``) alone, against a real broker:
with a small ``max_records`` (so batches are cut full, partitions are sought back and stale
records dropped), every record of every partition is handed over exactly once, in offset
order, across a stop and a resume from the logged positions -- the contract the engine's
exactly-once recovery rests on.  The app is a recorder with the interface the source uses."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from engine.runtime.snapshot_writer import atomic_write
from engine.sources.direct import DirectSource
from engine.sources.readers import offset_ranges

pytestmark = pytest.mark.integration


class Recorder:
    """What :class:`DirectSource` needs of an ``EngineApp``; keeps every batch it is handed."""

    def __init__(
        self, bootstrap: str, topics: dict[str, str], state_dir: Path, client: str = "fetch"
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.state_dir = state_dir
        self.settings = SimpleNamespace(kafka_security="plaintext", engine_kafka_client=client)
        self.engine_id = uuid.uuid4().hex[:6]
        self.batches: list[tuple[int, pa.Table]] = []

    def busy(self) -> bool:
        return False

    def accept(self, tbl: pa.Table, batch_id: int, read_s: float, ranges: Any = None) -> None:
        atomic_write(self.state_dir / "batches" / f"{batch_id:012d}.json", json.dumps(ranges).encode())
        assert ranges == offset_ranges(tbl)
        self.batches.append((batch_id, tbl))

    def drain(self, output: bool = False) -> None:
        pass


def make_topics(bootstrap: str) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient

    from tidewatch.kafka.topics import create_topics, stream_topic_spec

    run = uuid.uuid4().hex[:6]
    topics = {"trades": f"ds-trades-{run}", "packets": f"ds-packets-{run}", "subscriptions": f"ds-subs-{run}"}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = {"trades": 3, "packets": 2, "subscriptions": 1}
    create_topics(admin, [stream_topic_spec(t, parts[r]) for r, t in topics.items()])
    return topics


def produce(bootstrap: str, topics: dict[str, str], n: int, start: int = 0) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i in range(start, start + n):
        role = "trades" if i % 3 else "packets"
        p.produce(topics[role], key=f"k{i % 17}".encode(), value=f"{role}-{i}".encode())
        if i % 500 == 0:
            p.produce(topics["subscriptions"], value=f"sub-{i}".encode())
            p.poll(0)
    assert p.flush(30) == 0


def run_until(src: DirectSource, rec: Recorder, total: int, timeout: float = 120) -> None:
    src.start()
    deadline = time.monotonic() + timeout
    while sum(t.num_rows for _, t in rec.batches) < total and time.monotonic() < deadline:
        assert src.exception() is None, src.exception()
        time.sleep(0.1)
    src.stop()
    assert src.exception() is None


def check_exactly_once(rec: Recorder, total: int) -> None:
    rows = [r for _, t in rec.batches for r in t.select(["topic", "partition", "offset"]).to_pylist()]
    assert len(rows) == total
    per: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        per.setdefault((r["topic"], r["partition"]), []).append(r["offset"])
    for tp, offs in per.items():
        assert offs == list(range(len(offs))), f"{tp}: not each offset once, in order"
    ids = [b for b, _ in rec.batches]
    assert ids == list(range(len(ids)))


@pytest.mark.parametrize("client", ["fetch", "librdkafka"])
def test_small_batches_hand_over_every_record_once_across_a_resume(
    kafka_bootstrap: str, tmp_path: Path, client: str
) -> None:
    topics = make_topics(kafka_bootstrap)
    produce(kafka_bootstrap, topics, 6000)
    first = 6000 + 12  # with the subscriptions (one every 500)
    rec = Recorder(kafka_bootstrap, topics, tmp_path / "tidewatch", client)
    run_until(DirectSource(rec, trigger_s=0.05, max_records=400), rec, first)
    assert (
        max(t.num_rows for _, t in rec.batches) <= 400 + 6
    )  # full batches: one record of each lagging partition
    assert len(rec.batches) >= first // 400
    produce(kafka_bootstrap, topics, 3000, start=6000)
    second = first + 3000 + 6
    resumed = DirectSource(rec, trigger_s=0.05, max_records=400)
    assert resumed.batch_id == len(rec.batches)
    run_until(resumed, rec, second)
    check_exactly_once(rec, second)
