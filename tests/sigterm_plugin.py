"""A pytest plugin: SIGTERM ends the test session as Ctrl-C does.

``timeout`` (``.ci/run``'s limit) and a CI runner stop a test run with SIGTERM, which by default
ends Python at once: no fixture tears down, so the engines, embedded services and dashboards the
tests started in sessions of their own keep running and slow or break whatever runs next on the
machine.  With this plugin (registered by ``tests/conftest.py``) SIGTERM raises
``KeyboardInterrupt`` in the main thread instead: pytest stops, runs every fixture's teardown,
and exits with its "interrupted" status.
"""

from __future__ import annotations

import signal
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
