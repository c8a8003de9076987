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
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.services import free_port
from tidewatch.settings import PROJECT_ROOT, get_settings

pytestmark = [pytest.mark.integration, pytest.mark.compose]


@dataclass
class ComposeProject:
    name: str
    env: dict[str, str]
    kafka_port: int
    security: str = "plaintext"

    def client(self, principal: str | None, **conf: object) -> dict[str, object]:
        """librdkafka configuration of a host client, as ``principal`` in the scram mode."""
        base: dict[str, object] = {"bootstrap.servers": f"127.0.0.1:{self.kafka_port}", **conf}
        if self.security == "scram" and principal is not None:
            base |= {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": principal,
                "sasl.password": self.env[f"TIDEWATCH_KAFKA_{principal.upper()}_PASSWORD"],
            }
        return base

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


@pytest.fixture(params=["plaintext", "scram"])
def compose_project(request: pytest.FixtureRequest, container_runtime) -> Iterator[ComposeProject]:
    if shutil.which("podman-compose") is None:
        pytest.fail("podman-compose is missing: run scripts/containers_setup.sh", pytrace=False)
    s = get_settings()
    for image in (s.image_kafka, s.image_postgres, "localhost/tidewatch-app:latest"):
        container_runtime.require_image(image)
    kafka_port = free_port()
    env = {
        **os.environ,
        "TIDEWATCH_BASE_IMAGE": "localhost/tidewatch-base:bookworm",
        "TIDEWATCH_COMPOSE_KAFKA_PORT": str(kafka_port),
        "TIDEWATCH_COMPOSE_PG_PORT": str(free_port()),
        "TIDEWATCH_COMPOSE_DASHBOARD_PORT": str(free_port()),
        "TIDEWATCH_DEMO_TRADE_RATE": "20",
        "TIDEWATCH_DEMO_HISTORY_MINUTES": "1",
    }
    if request.param == "scram":  # SASL/SCRAM + ACLs, a fresh password per principal
        env["TIDEWATCH_KAFKA_SECURITY"] = "scram"
        for principal in ("ADMIN", "FEED", "ENGINE", "DASHBOARD", "RELAY"):
            env[f"TIDEWATCH_KAFKA_{principal}_PASSWORD"] = secrets.token_urlsafe(12)
    project = ComposeProject(f"twtest{os.getpid()}", env, kafka_port, request.param)
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

    from tidewatch.wire.avro import encode

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

    symbol = f"PROBE-{uuid.uuid4().hex[:8]}"
    # in the scram mode the probe is written as the feed and read back as the admin
    producer = Producer(compose_project.client("feed", **{"message.timeout.ms": 120_000}))
    consumer = Consumer(
        compose_project.client(
            "admin",
            **{
                "group.id": f"compose-test-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            },
        )
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
    # the engine, which just wrote the dead letter's batch to PostgreSQL, is connected as its
    # least-privilege role (only the engine service's URL names it)
    users = subprocess.run(
        [
            "podman",
            "exec",
            f"{compose_project.name}_postgres_1",
            "psql",
            "-U",
            "tidewatch",
            "-d",
            "tidewatch",
            "-Atc",
            "SELECT DISTINCT usename FROM pg_stat_activity WHERE usename IS NOT NULL",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "tidewatch_engine" in users.stdout.split(), users.stdout + users.stderr
    if compose_project.security == "scram":
        _forbidden_actions_are_refused(compose_project)


def _forbidden_actions_are_refused(project: ComposeProject) -> None:
    """Scram mode: the feed may not write alerts; a client without credentials gets nothing."""
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    errors: list[KafkaError] = []
    feed = Producer(project.client("feed", **{"message.timeout.ms": 20_000}))
    feed.produce("alerts", value=b"forged", on_delivery=lambda err, _msg: errors.append(err))
    feed.flush(30)
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[0]
    anonymous = AdminClient(project.client(None, **{"socket.timeout.ms": 5_000}))
    with pytest.raises(KafkaException):
        anonymous.list_topics(timeout=8)
