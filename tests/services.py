"""Embedded services of the tests' own (not containers): free ports, and a service of
:mod:`tidewatch.stack` started for a test session and stopped by PID at the end."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from tidewatch.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` ports free now and distinct from each other (all bound at once, then released): for
    daemons started one after another, where a port picked for a later one must not be one an
    earlier one has not bound yet (a worker's web UI on the port picked for the master's)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


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
