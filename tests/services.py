"""Embedded services of the tests' own (not containers): free ports, and a service of
:mod:`tidewatch.stack` started for a test session and stopped by PID at the end."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tidewatch.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
