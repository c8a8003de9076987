"""The container machinery of the integration tests: the Docker API (Podman here) and the
Kafka and PostgreSQL containers, from the images ``scripts/containers_setup.sh`` builds.

testcontainers talks to whatever serves the Docker API: here Podman's ``podman system service``
(``scripts/containers_setup.sh`` installs Podman, imports a Debian base image and builds
``localhost/tidewatch-{kafka,postgres}``), elsewhere Docker.  Containers carry the label
``tidewatch.test.pid=<pytest pid>``; :meth:`ContainerRuntime.remove_leftovers` removes those of
this session and of earlier sessions whose pytest process is gone (a killed run), never those of
a session still running next to it.

When no container runtime answers, :meth:`ContainerRuntime.connect` fails the test (not skip)
and says what to run.  The session fixtures built on this are in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tidewatch.settings import Settings, get_settings

if TYPE_CHECKING:
    import docker

LABEL = "tidewatch.test.pid"
SETUP_HINT = (
    "run `scripts/containers_setup.sh` (installs Podman, starts its Docker-API service, builds the images)"
)
_ADVERTISED_FILE = "/tmp/tidewatch-advertised-listeners"
SERVICE_IDLE_S = 300  # a service the fixtures started exits after this long without requests


# --- the container runtime ------------------------------------------------------------


class ContainerRuntime:
    """The Docker API endpoint for this session (and the Podman service, if we started it)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url: str | None = None
        self.started_service: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _ping(url: str) -> bool:
        import docker

        try:
            client = docker.DockerClient(base_url=url, timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    def candidates(self) -> list[str]:
        s = self.settings
        if s.container_host:
            return [s.container_host]
        urls = []
        if os.environ.get("DOCKER_HOST"):  # the convention testcontainers and docker follow
            urls.append(os.environ["DOCKER_HOST"])
        urls.append(f"unix://{s.podman_socket}")
        if os.environ.get("XDG_RUNTIME_DIR"):
            urls.append(f"unix://{os.environ['XDG_RUNTIME_DIR']}/podman/podman.sock")
        urls.append("unix:///var/run/docker.sock")
        return urls

    @staticmethod
    def _listening(url: str) -> bool:
        """A process accepts connections on this unix socket (it may be too busy to answer)."""
        if not url.startswith("unix://"):
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            try:
                sock.connect(url.removeprefix("unix://"))
                return True
            except OSError:
                return False

    def connect(self) -> str:
        """Find (or start, if Podman is installed) a Docker API; fail loudly otherwise."""
        for url in self.candidates():
            if self._ping(url):
                self.url = url
                break
        else:
            podman_url = f"unix://{self.settings.podman_socket}"
            if self._listening(podman_url):
                # busy, not absent: never start a second service on the same path (when
                # either exits, Podman unlinks the socket file under the other one)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not self._ping(podman_url):
                    time.sleep(1)
                if not self._ping(podman_url):
                    pytest.fail(f"the Docker API on {podman_url} does not answer", pytrace=False)
                self.url = podman_url
            elif self.settings.container_host is None and shutil.which("podman"):
                self.url = self._start_podman_service()
            else:
                pytest.fail(
                    f"no container runtime answers on {', '.join(self.candidates())}: {SETUP_HINT}",
                    pytrace=False,
                )
        assert self.url is not None
        os.environ["DOCKER_HOST"] = self.url
        os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
        os.environ["TESTCONTAINERS_CONNECTION_MODE"] = "docker_host"
        # the same, in case testcontainers was imported (and read its config) before
        from testcontainers.core.config import ConnectionMode, testcontainers_config

        testcontainers_config.ryuk_disabled = True
        testcontainers_config.connection_mode_override = ConnectionMode.docker_host
        return self.url

    def _start_podman_service(self) -> str:
        sock = Path(self.settings.podman_socket)
        sock.parent.mkdir(parents=True, exist_ok=True)
        log = self.settings.run_dir / "podman-service-tests.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        url = f"unix://{sock}"
        with log.open("ab") as out:
            self.started_service = subprocess.Popen(
                ["podman", "system", "service", f"--time={SERVICE_IDLE_S}", url],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd="/",  # it may outlive this checkout; in a deleted directory it fails every start
            )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._ping(url):
                return url
            time.sleep(0.2)
        self.close()
        pytest.fail(
            f"podman system service did not answer on {url} (log: {log}): {SETUP_HINT}", pytrace=False
        )

    def client(self) -> docker.DockerClient:
        import docker

        self.revive()
        assert self.url is not None
        return docker.DockerClient(base_url=self.url, timeout=60)

    def revive(self) -> None:
        """Find or start the API again when it stopped answering: a Podman service exits after
        ``SERVICE_IDLE_S`` without requests, e.g. while a long stretch of tests uses no container
        (the session-end sweep then found no socket)."""
        if self.url is not None and not self._ping(self.url):
            self.url = None
            self.connect()

    def require_image(self, image: str) -> None:
        import docker

        client = self.client()
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail(f"container image {image} is missing: {SETUP_HINT}", pytrace=False)
        finally:
            client.close()

    def remove_leftovers(self) -> list[str]:
        """Remove labelled containers whose pytest process is gone (earlier, killed sessions)."""
        import psutil

        removed = []
        client = self.client()
        try:
            for c in client.containers.list(all=True, filters={"label": LABEL}):
                owner = int(c.labels.get(LABEL, "0") or 0)
                if owner == os.getpid() or not psutil.pid_exists(owner):
                    c.remove(force=True, v=True)
                    removed.append(c.name)
        finally:
            client.close()
        return removed

    def close(self) -> None:
        """Stop the service this session started, unless containers of others still use it."""
        if self.started_service is not None:
            try:
                client = self.client()
                try:
                    others = client.containers.list(all=True)
                finally:
                    client.close()
            except Exception:
                others = []
            if others:
                # another session (or compose project) works through it: leave it to its
                # idle timeout (--time) instead of pulling the socket from under them
                self.started_service = None
                return
            self.started_service.terminate()
            try:
                self.started_service.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.started_service.kill()
                self.started_service.wait()
            self.started_service = None


def _host(container: Any) -> str:
    host = container.get_container_host_ip()
    return "127.0.0.1" if host in ("localhost", "::1", "") else host


def _stop(container: Any) -> None:
    try:
        container.stop()
    except Exception:  # already gone: the session-end sweep catches the rest
        pass


@contextmanager
def postgres_container(runtime: ContainerRuntime) -> Iterator[str]:
    """SQLAlchemy URL of a fresh PostgreSQL 15 in a container (empty database, no schema),
    stopped at the end."""
    from testcontainers.community.postgres import PostgresContainer

    s = get_settings()
    runtime.require_image(s.image_postgres)
    pg = PostgresContainer(
        s.image_postgres, username="tidewatch", password="tidewatch-test", dbname="tidewatch_test"
    ).with_kwargs(labels={LABEL: str(os.getpid())})
    pg.start()
    try:
        yield pg.get_connection_url(host=_host(pg))
    finally:
        _stop(pg)


def _wait_for_kafka(bootstrap: str, container: Any, timeout: float) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 2000})
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=3)
            if md.brokers:
                return
        except Exception as exc:  # KafkaException while the broker starts
            last = exc
        container.reload()
        if container.status not in ("created", "running"):
            break
        time.sleep(0.5)
    logs = container.logs().decode(errors="replace")[-4000:]
    pytest.fail(
        f"Kafka in {container.name} did not answer on {bootstrap} ({last}); logs:\n{logs}", pytrace=False
    )


def _put_file(container: Any, path: str, content: bytes) -> None:
    with BytesIO() as archive:
        with tarfile.TarFile(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(name=path.lstrip("/"))
            info.size = len(content)
            info.mtime = int(time.time())
            tar.addfile(info, BytesIO(content))
        container.put_archive("/", archive.getvalue())


@contextmanager
def kafka_container(runtime: ContainerRuntime) -> Iterator[str]:
    """``host:port`` of a single-node KRaft Kafka in a container, with Tidewatch's topics,
    stopped at the end.

    The container's entrypoint waits for the advertised listener to be written into it, so
    the broker advertises the host-mapped port that testcontainers chose.
    """
    from testcontainers.core.container import DockerContainer

    from tidewatch.kafka.admin import ensure_topics

    s = get_settings()
    runtime.require_image(s.image_kafka)
    kafka = (
        DockerContainer(s.image_kafka)
        .with_exposed_ports(9092)
        .with_env("KAFKA_ADVERTISED_FILE", _ADVERTISED_FILE)
        .with_env("KAFKA_NUM_PARTITIONS", str(s.topic_partitions))
        .with_kwargs(labels={LABEL: str(os.getpid())})
    )
    kafka.start()
    try:
        bootstrap = f"{_host(kafka)}:{kafka.get_exposed_port(9092)}"
        wrapped = kafka.get_wrapped_container()
        _put_file(wrapped, _ADVERTISED_FILE, f"PLAINTEXT://{bootstrap}\n".encode())
        _wait_for_kafka(bootstrap, wrapped, s.container_start_timeout_s)
        ensure_topics(bootstrap, s)
        yield bootstrap
    finally:
        _stop(kafka)


def kafka_exec(runtime: ContainerRuntime, bootstrap: str, cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd`` in this session's Kafka container that serves ``bootstrap`` (found by the
    session's label and its host port); ``(exit code, output)``."""
    port = bootstrap.rsplit(":", 1)[1]
    client = runtime.client()
    try:
        for c in client.containers.list(filters={"label": f"{LABEL}={os.getpid()}"}):
            bindings = (c.ports or {}).get("9092/tcp") or []
            if any(str(b.get("HostPort")) == port for b in bindings):
                code, out = c.exec_run(cmd)
                return int(code), out.decode(errors="replace")
    finally:
        client.close()
    raise LookupError(f"no Kafka container of this session serves {bootstrap}")


def dump_log_batches(
    runtime: ContainerRuntime, bootstrap: str, topics: dict[str, int]
) -> dict[tuple[str, int], list[str]]:
    """The record-batch headers (``baseOffset: … lastOffset: … compresscodec: …``) of the first
    log segment of every partition of ``topics`` (topic -> partitions), as the broker stored them,
    per (topic, partition): Kafka's ``DumpLogSegments`` in the container, one run for all."""
    files = [
        f"/var/lib/kafka/data/{t}-{p}/00000000000000000000.log" for t, n in topics.items() for p in range(n)
    ]
    code, out = kafka_exec(
        runtime,
        bootstrap,
        ["java", "-cp", "/opt/kafka/libs/*", "kafka.tools.DumpLogSegments", "--files", ",".join(files)],
    )
    if code != 0:
        raise RuntimeError(f"DumpLogSegments exited with {code}: {out[-2000:]}")
    batches: dict[tuple[str, int], list[str]] = {(t, p): [] for t, n in topics.items() for p in range(n)}
    part = None
    for line in out.splitlines():
        if line.startswith("Dumping "):  # "Dumping /var/lib/kafka/data/<topic>-<p>/<segment>.log"
            topic, _, p = line.split("/")[-2].rpartition("-")
            part = (topic, int(p))
        elif line.startswith("baseOffset:") and part in batches:
            batches[part].append(line)
    return batches
