"""Session fixtures: real Kafka and PostgreSQL in containers, Spark, and embedded services.

``kafka_bootstrap`` ("host:port") and ``pg_url`` (SQLAlchemy URL) start one container each,
once per test session, with testcontainers on whatever serves the Docker API (the machinery:
``tests/containers.py``); the containers are removed when the session ends, even when tests
fail, and a session removes leftovers of earlier, killed sessions.  When no container runtime
answers, the fixtures fail (not skip) and say what to run.
The ``spark`` fixture is a ``local[2]`` session with the Kafka and Avro connectors
(:func:`engine.spark_session.build_spark`).  ``restartable_kafka`` / ``restartable_pg`` are
embedded services of their own (``tests/services.py``) that a test may stop and start again.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.containers import ContainerRuntime, kafka_container, postgres_container
from tests.services import create_database, free_port, own_service
from tidewatch.settings import PROJECT_ROOT, Settings, get_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: SIGTERM (``timeout``, a CI runner's stop) tears the fixtures down as Ctrl-C does
pytest_plugins = ("tests.sigterm_plugin",)


# --- containers ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def container_runtime() -> Iterator[ContainerRuntime]:
    """The Docker API (Podman here) with this session's leftovers removed before and after."""
    rt = ContainerRuntime(get_settings())
    rt.connect()
    rt.remove_leftovers()
    try:
        yield rt
    finally:
        try:
            rt.remove_leftovers()
        finally:
            rt.close()


@pytest.fixture(scope="session")
def pg_url(container_runtime: ContainerRuntime) -> Iterator[str]:
    """SQLAlchemy URL of a fresh PostgreSQL 15 in a container (empty database, no schema)."""
    with postgres_container(container_runtime) as url:
        yield url


@pytest.fixture(scope="session")
def kafka_bootstrap(container_runtime: ContainerRuntime) -> Iterator[str]:
    """``host:port`` of a single-node KRaft Kafka in a container, with Tidewatch's topics."""
    with kafka_container(container_runtime) as bootstrap:
        yield bootstrap


# --- Spark ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A ``local[2]`` SparkSession with the Kafka and Avro connectors, stopped at session end."""
    from engine.spark_session import build_spark

    s = get_settings().model_copy(update={"spark_master": "local[2]"})
    session = build_spark(s, "tidewatch-tests")
    session.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path_factory.mktemp("checkpoints")))
    try:
        yield session
    finally:
        session.stop()


# --- embedded services that a test may stop and start again ----------------------------------


@pytest.fixture(scope="session")
def restartable_kafka() -> Iterator[Settings]:
    """Settings of an embedded broker of its own (:mod:`tidewatch.stack.kafka_broker`, PLAINTEXT) on
    free ports in a temporary run dir: a test may stop it (``kafka.stop(s)``, by PID) and start it
    again on the same ports and data (restarting a container would change its mapped port).
    ``s.kafka_bootstrap`` is its address; it is left running between tests."""
    from tidewatch.stack import kafka_broker as kafka

    port = free_port()
    s = Settings(
        run_dir=Path(tempfile.mkdtemp(prefix="tidewatch-restart-kafka-")) / "run",
        cache_dir=get_settings().cache_dir,
        kafka_port=port,
        kafka_bootstrap=f"127.0.0.1:{port}",
        kafka_controller_port=free_port(),
        kafka_security="plaintext",
    )
    with own_service(kafka, s):
        yield s


@pytest.fixture(scope="session")
def restartable_pg() -> Iterator[Settings]:
    """Settings of an embedded PostgreSQL of its own (:mod:`tidewatch.stack.postgres_server`) on a free
    port in a temporary run dir, that a test may stop (``postgres.stop(s)``, by PID) and start
    again on the same port and data dir.  ``s.sqlalchemy_url`` is its application role, which may
    create databases here (``fresh_database`` of the engine tests)."""
    from tidewatch.stack import postgres_server as postgres

    root = Path(tempfile.mkdtemp(prefix="tidewatch-restart-pg-"))
    root.chmod(0o755)  # the server runs as the postgres user when the tests run as root
    s = Settings(run_dir=root / "run", pg_port=free_port(), pg_password="tidewatch-test", database_url=None)
    with own_service(postgres, s):
        postgres.allow_createdb(s)
        yield s


@pytest.fixture(scope="session")
def project_root() -> Path:
    return PROJECT_ROOT


@pytest.fixture()
def restartable_db(restartable_pg: Settings) -> str:
    """URL of a new database on the ``restartable_pg`` server, migrated to head."""
    return create_database(restartable_pg.sqlalchemy_url, "test_", migrate=True)
