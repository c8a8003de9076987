"""``tidewatch kafka console-consumer`` (Kafka's own ConsoleConsumer from kafka-tools) and
``tidewatch alerts tail`` read the same alerts from a real broker (the ``kafka_bootstrap``
fixture): the committed records of a transactional producer, the aborted ones by neither."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tidewatch.kafka.tools import unescape
from tidewatch.kafka.topics import create_topics, stream_topic_spec
from tidewatch.wire.avro import decode, encode

pytestmark = pytest.mark.integration

#: the records' Kafka timestamps: recent, whole minutes -- a fixed date in the past (2026-01-01,
#: as before Nov 27) is older than the broker's 7-day retention, which deleted the first
#: segments' records mid-test once the date was far enough behind
T0 = (int(time.time()) // 60 - 10) * 60_000


def _alert(i: int) -> dict[str, object]:
    kind = "ENTER" if i % 2 else "EXIT"
    return {
        "id": f"sub{i % 3}|K{i}|{kind}|{T0 + i * 1000}",
        "subscription_id": f"sub{i % 3}",
        "rule_name": f"rule {i % 3}",
        "stream": "trades",
        "key": f"K{i}",
        "kind": kind,
        "as_of": T0 + i * 1000,
        "values": {"n": float(i), "m": None},
        "batch_id": 1,
        "emitted_at": T0,
    }


def _produce(bootstrap: str, topic: str, idx: range, *, commit: bool) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{topic}-{idx.start}"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in idx:
        value = encode("alerts", _alert(i))
        p.produce(topic, key=f"sub{i % 3}|K{i}".encode(), value=value, timestamp=T0 + i * 1000)
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)


def _cli(bootstrap: str, topic: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIDEWATCH_KAFKA_BOOTSTRAP": bootstrap, "TIDEWATCH_TOPIC_ALERTS": topic}
    return subprocess.run(
        [sys.executable, "-m", "tidewatch.cli", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _tail_from_beginning(bootstrap: str, topic: str, cwd: Path, n: int, timeout: float = 120.0) -> list[str]:
    """The first ``n`` lines of ``tidewatch alerts tail --from-beginning --json`` (it follows until
    Ctrl-C: stopped with SIGINT once it printed them, or after ``timeout``)."""
    env = {**os.environ, "TIDEWATCH_KAFKA_BOOTSTRAP": bootstrap, "TIDEWATCH_TOPIC_ALERTS": topic}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewatch.cli", "alerts", "tail", "--from-beginning", "--json"],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    timer = threading.Timer(timeout, proc.send_signal, (signal.SIGINT,))
    timer.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while len(lines) < n:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
    finally:
        timer.cancel()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert len(lines) == n, (lines, err)
    return lines


def test_console_consumer_and_alerts_tail_read_the_same_committed_alerts(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = f"alerts-console-{uuid.uuid4().hex[:8]}"
    create_topics(AdminClient({"bootstrap.servers": kafka_bootstrap}), [stream_topic_spec(topic, 2)])
    _produce(kafka_bootstrap, topic, range(0, 6), commit=True)
    _produce(kafka_bootstrap, topic, range(100, 104), commit=False)  # aborted: read by neither
    _produce(kafka_bootstrap, topic, range(6, 9), commit=True)
    expected = {f"K{i}" for i in range(9)}

    console = _cli(
        kafka_bootstrap, topic, tmp_path,
        "kafka", "console-consumer", "--topic", topic, "--from-beginning", "--timeout-ms", "15000",
    )  # fmt: skip
    assert "Processed a total of 9 messages" in console.stderr, console.stderr
    seen = {}
    for line in console.stdout.splitlines():
        assert line.count("\t") == 4, console.stdout[:3000]
        created, part, off, key, value = line.split("\t")
        assert (
            created.startswith("CreateTime:") and part.startswith("Partition:") and off.startswith("Offset:")
        )
        rec = decode(unescape(value), "alerts")
        seen[(int(part.split(":")[1]), int(off.split(":")[1]))] = (int(created.split(":")[1]), key, rec)
    assert {r["key"] for _, _, r in seen.values()} == expected

    tailed = {}
    for line in _tail_from_beginning(kafka_bootstrap, topic, tmp_path, len(seen)):
        g = json.loads(line)
        tailed[(g["partition"], g["offset"])] = (g["timestamp"], g["key"], g["record"])
    assert tailed == seen  # same positions, Kafka timestamps, keys and decoded records


def test_a_printed_value_is_the_records_bytes(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Every byte value 0..255 and a backslash go through Kafka's BytesDeserializer and back."""
    topic = f"bytes-console-{uuid.uuid4().hex[:8]}"
    create_topics(AdminClient({"bootstrap.servers": kafka_bootstrap}), [stream_topic_spec(topic, 1)])
    raw = bytes(range(256)) + b"\\x41\\"
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(topic, key=b"k", value=raw)
    p.flush(30)
    out = _cli(
        kafka_bootstrap, topic, tmp_path,
        "kafka", "console-consumer", "--topic", topic, "--from-beginning", "--max-messages", "1",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    assert unescape(line.split("\t")[4]) == raw
