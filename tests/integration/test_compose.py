"""``podman-compose up`` of docker-compose.yml brings the stack up; a trade reaches the engine.

The engine service runs the real engine (``tidewatch engine run``).  The test produces malformed
framed Avro trades to ``trades`` through the host-mapped Kafka port and waits for the engine to
route one to ``dead-letter``, then
``podman-compose down`` removes the project's containers, network and volumes (also when the
test fails).  Ports are chosen free, and the project name carries the pytest PID, so this runs
next to the embedded stack and next to other test sessions.

Marked ``compose`` (and ``integration``): deselect with ``-m "not compose"``.  Needs the images
of scripts/containers_setup.sh (podman-compose then builds nothing).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tidewatch.settings import PROJECT_ROOT, get_settings

pytestmark = [pytest.mark.integration, pytest.mark.compose]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ComposeProject:
    name: str
    env: dict[str, str]
    kafka_port: int

    def cmd(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman-compose", "-p", self.name, "-f", str(PROJECT_ROOT / "docker-compose.yml"), *args],
            cwd=PROJECT_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def logs(self, service: str) -> str:
        res = subprocess.run(
            ["podman", "logs", f"{self.name}_{service}_1"], capture_output=True, text=True, timeout=60
        )
        return res.stdout + res.stderr


@pytest.fixture()
def compose_project(container_runtime) -> Iterator[ComposeProject]:
    if shutil.which("podman-compose") is None:
        pytest.fail("podman-compose is missing: run scripts/containers_setup.sh", pytrace=False)
    s = get_settings()
    for image in (s.image_kafka, s.image_postgres, "localhost/tidewatch-app:latest"):
        container_runtime.require_image(image)
    kafka_port = _free_port()
    env = {
        **os.environ,
        "TIDEWATCH_BASE_IMAGE": "localhost/tidewatch-base:bookworm",
        "TIDEWATCH_COMPOSE_KAFKA_PORT": str(kafka_port),
        "TIDEWATCH_COMPOSE_PG_PORT": str(_free_port()),
        "TIDEWATCH_COMPOSE_DASHBOARD_PORT": str(_free_port()),
        "TIDEWATCH_DEMO_TRADE_RATE": "20",
        "TIDEWATCH_DEMO_HISTORY_MINUTES": "1",
    }
    project = ComposeProject(f"twtest{os.getpid()}", env, kafka_port)
    project.cmd("down", "-v", timeout=180)  # leftovers of a killed run with the same PID
    try:
        yield project
    finally:
        res = project.cmd("down", "-v", timeout=300)
        # podman-compose 1.0.3 leaves the project network behind
        subprocess.run(
            ["podman", "network", "rm", "-f", f"{project.name}_default"], capture_output=True, timeout=60
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


def test_compose_up_delivers_a_trade_to_the_engine(compose_project: ComposeProject) -> None:
    """The real engine (``tidewatch engine run`` in the compose engine service) reads a trade we
    produce: the trade is malformed on purpose (negative size), so the engine must route it to
    ``dead-letter`` with its raw bytes -- which only the engine does.  A probe is sent every few
    seconds until one comes back, as the engine's query may start after the first one."""
    from confluent_kafka import Consumer, Producer

    from ingest.avro import encode

    up = compose_project.cmd("up", "-d")
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    running = subprocess.run(
        [
            "podman",
            "ps",
            "--filter",
            f"label=io.podman.compose.project={compose_project.name}",
            "--format",
            "{{.Names}}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    for service in ("kafka", "postgres", "engine", "dashboard", "feed"):
        assert f"{compose_project.name}_{service}_1" in running

    bootstrap = f"127.0.0.1:{compose_project.kafka_port}"
    symbol = f"PROBE-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 120_000})
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"compose-test-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe(["dead-letter"])
    found = None
    deadline = time.monotonic() + 420
    next_probe = 0.0
    try:
        while time.monotonic() < deadline and found is None:
            if time.monotonic() >= next_probe:
                trade = {
                    "symbol": symbol,
                    "ts": int(time.time() * 1000),
                    "price": 101.5,
                    "size": -7,
                    "side": "BID",
                    "exchange": "XNYS",
                }
                producer.produce("trades", key=symbol.encode(), value=encode("trades", trade))
                producer.poll(0)
                next_probe = time.monotonic() + 10
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None and symbol.encode() in (msg.value() or b""):
                found = msg.value()
        assert producer.flush(30) == 0
    finally:
        consumer.close()
    assert found is not None, compose_project.logs("engine")[-3000:]
