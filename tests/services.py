"""Embedded services of the tests' own (not containers): free ports, a service of
:mod:`tidewatch.stack` started for a test session and stopped by PID at the end, and throwaway
databases on a test server."""

from __future__ import annotations

import random
import shutil
import socket
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tidewatch.settings import Settings

#: Linux's default ``net.ipv4.ip_local_port_range``, when it cannot be read
_EPHEMERAL_DEFAULT = (32768, 60999)


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT
    return lo, hi


def _port_pool() -> range:
    """Ports outside the kernel's ephemeral range, which ``bind(0)`` and every outgoing connection
    draw from: a service stopped and started again on its port (``restartable_kafka``) must not
    find it taken meanwhile by some process's ``bind(0)`` or by a client's connection to it (the
    clean-clone run of 2b0dd08: the relay's broker could not start again on 43099).  Above the
    project's own defaults (19092, 15432, 18501)."""
    lo, hi = _ephemeral_range()
    return range(20000, lo) if lo > 21000 else range(hi + 1, 65536)  # empty if the range is all


def free_port() -> int:
    """A port free now, outside the kernel's ephemeral range (:func:`_port_pool`)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` ports free now and distinct from each other (all bound at once, then released): for
    daemons started one after another, where a port picked for a later one must not be one an
    earlier one has not bound yet (a worker's web UI on the port picked for the master's).
    Outside the kernel's ephemeral range (:func:`_port_pool`), picked at random; the kernel's
    choice (port 0) where that range leaves no other port."""
    pool, rng = _port_pool(), random.SystemRandom()
    with ExitStack() as stack:
        got: list[int] = []
        while len(got) < n:
            s = stack.enter_context(socket.socket())
            try:  # a port taken, by another process or by one bound here already, is refused
                s.bind(("127.0.0.1", rng.choice(pool) if len(pool) > 100 else 0))
            except OSError:
                continue
            got.append(int(s.getsockname()[1]))
        return got


@contextmanager
def own_service(service: Any, s: Settings) -> Iterator[Settings]:
    """``service`` (:mod:`tidewatch.stack.kafka_broker` or ``.postgres_server``) started with ``s``;
    stopped by PID at the end and its temporary run dir's parent removed."""
    from tidewatch.stack import processes as process

    try:
        service.start(s)
        yield s
    finally:
        service.stop(s)
        assert process.read_record(s.run_dir, service.NAME) is None
        shutil.rmtree(s.run_dir.parent, ignore_errors=True)


def create_database(
    admin_url: str, prefix: str, *, template: str | None = None, migrate: bool = False
) -> str:
    """A new database on the server of ``admin_url`` (a role that may create databases), named
    ``prefix`` and ten random hex digits; a copy of the database of the URL ``template`` when
    given (faster than migrating each), else empty, and then migrated to head when ``migrate``.
    Its URL, with the role and password of ``admin_url``; :func:`drop_database` drops it."""
    import sqlalchemy as sa

    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    copy = f' TEMPLATE "{sa.engine.make_url(template).database}"' if template else ""
    _execute(admin_url, f'CREATE DATABASE "{name}"{copy}')
    url = sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    if migrate:
        from tidewatch.db.migrate import upgrade

        upgrade(url)
    return url


def drop_database(admin_url: str, url: str) -> None:
    """Drop the database of ``url`` (of :func:`create_database`), its connections closed first
    (``WITH (FORCE)``); no error when it is gone already."""
    import sqlalchemy as sa

    _execute(admin_url, f'DROP DATABASE IF EXISTS "{sa.engine.make_url(url).database}" WITH (FORCE)')


def _execute(admin_url: str, statement: str) -> None:
    """``statement`` outside a transaction (CREATE / DROP DATABASE), on a connection of its own."""
    import sqlalchemy as sa

    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(statement))
    finally:
        admin.dispose()
