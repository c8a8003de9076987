"""Embedded services of one run's own, for benchmarks: a Kafka broker (PLAINTEXT) and, when asked,
a PostgreSQL server, on free ports of 127.0.0.1 in a temporary run dir, so a measurement neither
meets nor disturbs the stack of ``tidewatch up``.  They are stopped by PID and the run dir is
removed when the ``with`` block ends, whatever ended it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tidewatch.settings import Settings
from tidewatch.stack import kafka_broker, postgres_server
from tidewatch.stack.spark_cluster import free_port


@contextmanager
def private_services(
    prefix: str, base: Settings, *, postgres: bool = False, **update: Any
) -> Iterator[Settings]:
    """Settings of a Kafka broker started for this block (and of a PostgreSQL server when
    ``postgres``, whose application role may create databases: ``sqlalchemy_url``).  The ports,
    the run dir (under a new directory named ``prefix…``) and the PLAINTEXT security are this
    block's own; the rest (the cache dir with Kafka's jars, Spark's settings) is ``base``'s;
    ``update`` is applied last."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)  # the PostgreSQL server runs as the postgres user when this runs as root
    port = free_port()
    s = base.model_copy(
        update={
            "run_dir": root / "run",
            "kafka_port": port,
            "kafka_bootstrap": f"127.0.0.1:{port}",
            "kafka_controller_port": free_port(),
            "kafka_security": "plaintext",
            "pg_port": free_port(),
            "pg_password": "tidewatch-private",
            "database_url": None,
            **update,
        }
    )
    started: list[Any] = []
    try:
        for svc in (postgres_server, kafka_broker) if postgres else (kafka_broker,):
            svc.start(s)
            started.append(svc)
        if postgres:
            postgres_server.allow_createdb(s)
        yield s
    finally:
        for svc in reversed(started):
            svc.stop(s)
        shutil.rmtree(root, ignore_errors=True)
