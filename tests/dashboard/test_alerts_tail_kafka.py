"""``tidewatch alerts tail`` against a real Kafka (the ``kafka_bootstrap`` fixture): alerts encoded
by the engine's own encoder (engine/sinks/alert_wire.py), produced in transactions as the engine
produces them; the command prints exactly the committed ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from engine.messages import Alert
from engine.sinks.alert_wire import encode_alerts
from tidewatch.kafka.topics import create_topics, stream_topic_spec
from tidewatch.wire.avro import decode

pytestmark = pytest.mark.integration

#: the records' Kafka timestamps: recent, whole minutes -- a fixed date in the past (2026-01-01,
#: as before Nov 27) is older than the broker's 7-day retention, which deleted the first
#: segments' records mid-test once the date was far enough behind
T0 = (int(time.time()) // 60 - 10) * 60_000


def _alerts(lo: int, hi: int) -> list[Alert]:
    return [
        Alert(
            f"sub{i % 3}",
            f"rule{i % 3}",
            "trades",
            f"K{i}",
            "ENTER" if i % 2 else "EXIT",
            T0 + i * 1000,
            {"n": float(i), "m": None},
        )
        for i in range(lo, hi)
    ]


def _produce(bootstrap: str, topic: str, alerts: list[Alert], *, commit: bool, tx: str) -> list[bytes]:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tx})
    p.init_transactions(30)
    p.begin_transaction()
    recs = encode_alerts(alerts, batch_id=1, emitted_at=T0)
    for a, k, v in zip(alerts, recs.alert_keys, recs.alert_values, strict=True):
        p.produce(topic, key=k, value=v, timestamp=a.as_of)  # Kafka time = as-of: a fixed order
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)
    return recs.alert_values


def _cli(bootstrap: str, topic: str, tmp: Path, *args: str) -> list[str]:
    env = {**os.environ, "TIDEWATCH_KAFKA_BOOTSTRAP": bootstrap, "TIDEWATCH_TOPIC_ALERTS": topic}
    out = subprocess.run(
        [sys.executable, "-m", "tidewatch.cli", "alerts", "tail", *args],
        env=env, cwd=tmp, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return out.stdout.splitlines()


def test_last_n_json_prints_exactly_the_newest_committed_alerts(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = f"alerts-tail-{uuid.uuid4().hex[:8]}"
    create_topics(AdminClient({"bootstrap.servers": kafka_bootstrap}), [stream_topic_spec(topic, 2)])
    first = _produce(kafka_bootstrap, topic, _alerts(0, 5), commit=True, tx=f"t-{topic}-1")
    _produce(kafka_bootstrap, topic, _alerts(100, 104), commit=False, tx=f"t-{topic}-2")  # aborted
    second = _produce(kafka_bootstrap, topic, _alerts(5, 8), commit=True, tx=f"t-{topic}-3")
    committed = [decode(v) for v in first + second]

    lines = _cli(kafka_bootstrap, topic, tmp_path, "--last", "6", "--json")
    got = [json.loads(line) for line in lines]
    assert [g["record"] for g in got] == committed[-6:]
    assert all(g["topic"] == "alerts" for g in got)

    everything = [
        json.loads(line)["record"]
        for line in _cli(kafka_bootstrap, topic, tmp_path, "--last", "100", "--json")
    ]
    assert everything == committed  # the aborted transaction's alerts never show

    only = _cli(kafka_bootstrap, topic, tmp_path, "--last", "2", "--json", "--subscription", "sub1")
    assert [json.loads(line)["record"] for line in only] == [
        r for r in committed if r["subscription_id"] == "sub1"
    ][-2:]

    human = _cli(kafka_bootstrap, topic, tmp_path, "--last", "1")
    assert len(human) == 1 and "rule1 [sub1]" in human[0] and "key=K7" in human[0] and "n=7" in human[0]


def test_following_prints_new_alerts_and_ctrl_c_ends_cleanly(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = f"alerts-tail-{uuid.uuid4().hex[:8]}"
    create_topics(AdminClient({"bootstrap.servers": kafka_bootstrap}), [stream_topic_spec(topic, 1)])
    env = {**os.environ, "TIDEWATCH_KAFKA_BOOTSTRAP": kafka_bootstrap, "TIDEWATCH_TOPIC_ALERTS": topic}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewatch.cli", "alerts", "tail", "--from-beginning", "--json"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(3)  # the consumer is assigned; alerts produced now must show up
        values = _produce(kafka_bootstrap, topic, _alerts(0, 3), commit=True, tx=f"t-{topic}")
        lines = [proc.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
        assert [json.loads(line)["record"] for line in lines] == [decode(v) for v in values]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err
