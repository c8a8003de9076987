"""Helpers of the stack tests: this test process acting as one app process of ``tidewatch up``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tidewatch.settings import Settings, get_settings
from tidewatch.stack import embedded as stack

#: ``as_process(principal)`` -> the settings of that app process
AsProcess = Callable[[str], Settings]


def as_process_of(stack_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> AsProcess:
    """``as_process(principal)``: this test process's environment and settings become those
    ``tidewatch up`` gives the app process of ``principal`` on the stack of ``stack_settings``
    (in its ``kafka_security`` mode; a TLS mode finds the embedded broker's CA itself).  Undo
    with ``monkeypatch.undo()`` and ``get_settings.cache_clear()``."""

    def enter(principal: str) -> Settings:
        s = stack_settings
        env = {
            "TIDEWATCH_KAFKA_SECURITY": s.kafka_security,
            "TIDEWATCH_KAFKA_PORT": str(s.kafka_port),
            "TIDEWATCH_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
            "TIDEWATCH_RUN_DIR": str(s.run_dir),
            "TIDEWATCH_PG_PORT": str(s.pg_port),
            **stack._kafka_env(s, principal),
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("TIDEWATCH_KAFKA_SSL_CA_LOCATION", raising=False)
        get_settings.cache_clear()
        return get_settings()

    return enter


def start_engine_until_rule(
    spark: Any, settings: Settings, checkpoint: Path, engine_id: str, sid: str
) -> tuple[Any, Any]:
    """Start an :class:`~engine.app.EngineApp` on ``spark`` with ``settings`` and wait (up to
    120 s) until subscription ``sid`` has reached it; ``(app, query)``."""
    from engine.app import EngineApp

    app = EngineApp(settings, checkpoint=checkpoint, engine_id=engine_id)
    q = app.start(spark, trigger_seconds=0.5)
    deadline = time.monotonic() + 120
    while sid not in {str(r) for r in app.core.rules} and time.monotonic() < deadline:
        assert q.exception() is None, q.exception()
        time.sleep(0.5)
    assert sid in {str(r) for r in app.core.rules}, "the rule never reached the engine"
    return app, q
