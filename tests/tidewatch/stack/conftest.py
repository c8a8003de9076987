"""Fixtures of the stack tests (tidewatch.stack: the embedded services, ``tidewatch up``)."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import free_port
from tidewatch.kafka import client as kafka_client
from tidewatch.settings import Settings, get_settings
from tidewatch.stack import embedded as stack
from tidewatch.stack import postgres_server as postgres
from tidewatch.stack import processes as process


def _secure_stack(mode: str) -> Iterator[Settings]:
    base = get_settings()
    root = Path(tempfile.mkdtemp(prefix=f"tidewatch-{mode.replace('_', '-')}-test-"))
    root.chmod(0o755)  # the postgres user must reach its data dir
    kp = free_port()
    s = Settings(
        run_dir=root / "run",
        cache_dir=base.cache_dir,
        kafka_port=kp,
        kafka_bootstrap=f"127.0.0.1:{kp}",
        kafka_controller_port=free_port(),
        pg_port=free_port(),
        kafka_security=mode,  # type: ignore[arg-type]
        kafka_admin_password=secrets.token_urlsafe(16),
        **{f"kafka_{p}_password": secrets.token_urlsafe(16) for p in kafka_client.PRINCIPALS},  # type: ignore[arg-type]
    )
    if postgres.find_bin_dir(s) is None:
        pytest.fail("PostgreSQL binaries missing: run scripts/setup.sh")
    try:
        stack.check_kafka_secrets(s, list(kafka_client.PRINCIPALS))
        stack.start_services(s)
        yield s
    finally:
        stack.stop_all(s)
        assert process.all_records(s.run_dir) == []
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def run_root() -> Iterator[Path]:
    """A temporary dir for a run dir the ``postgres`` user can reach (pytest's tmp_path is 0700
    root) and short enough for supervisord's Unix socket."""
    d = Path(tempfile.mkdtemp(prefix="tidewatch-stack-test-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def scram_stack() -> Iterator[Settings]:
    """The embedded stack's services in the opt-in Kafka SASL/SCRAM + ACL mode, started the way
    ``tidewatch up`` starts them (:func:`tidewatch.stack.embedded.start_services`): Kafka with SCRAM and
    the principals' users and ACLs, PostgreSQL migrated, the topics created as ``admin``.
    Free ports, a temporary run dir, random passwords; everything is stopped at the end."""
    yield from _secure_stack("scram")


@pytest.fixture(scope="session")
def scram_ssl_stack() -> Iterator[Settings]:
    """As :func:`scram_stack`, over TLS (``kafka_security = "scram_ssl"``: SASL_SSL): the broker's
    only client listener speaks TLS with a certificate of the CA ``tidewatch up`` made in the run
    dir (:func:`tidewatch.stack.kafka_broker.ensure_tls`), which the clients trust
    (:func:`tidewatch.kafka.client.ca_location`)."""
    yield from _secure_stack("scram_ssl")
