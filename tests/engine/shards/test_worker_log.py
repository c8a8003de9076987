"""A shard's Python worker logs the engine's lines (engine.shards.processor._worker_log): Spark's
worker starts with no logging handler, so a core's "subscription ... is active" reached no log."""

from __future__ import annotations

import logging

import pytest

from engine.shards import processor


def bare_worker(monkeypatch: pytest.MonkeyPatch) -> logging.Logger:
    """This process with no logging handler anywhere, as a Spark Python worker starts (called in
    the test itself: pytest adds its capturing handlers to the root logger after the fixtures);
    the engine's logger as it was afterwards."""
    engine_log = logging.getLogger("tidewatch.engine")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(engine_log, "handlers", [])
    monkeypatch.setattr(engine_log, "level", logging.NOTSET)
    monkeypatch.setattr(processor, "_LOGGING", [])
    return engine_log


def test_a_worker_without_handlers_logs_the_engines_info_lines_to_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine_log = bare_worker(monkeypatch)
    processor._worker_log()
    processor._worker_log()  # once per worker
    assert len(engine_log.handlers) == 1
    engine_log.info("subscription %s (%s) on %s is active", "s-1", "big trades", "trades")
    err = capsys.readouterr().err
    assert err.count("subscription s-1 (big trades) on trades is active") == 1
    assert "INFO tidewatch.engine (shard worker " in err


def test_a_process_that_logs_already_keeps_its_handlers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine_log = bare_worker(monkeypatch)
    own = logging.StreamHandler()
    logging.getLogger().handlers.append(own)
    processor._worker_log()
    assert engine_log.handlers == []
    engine_log.info("subscription s-2 (x) on trades is active")
    assert "shard worker" not in capsys.readouterr().err
