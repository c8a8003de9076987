"""The one settings object: derived defaults follow what the user set."""

from __future__ import annotations

import pytest

from tidewatch.settings import Settings


def test_kafka_bootstrap_follows_the_embedded_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEWATCH_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("TIDEWATCH_KAFKA_PORT", "20123")
    assert Settings().kafka_bootstrap == "127.0.0.1:20123"


def test_an_explicit_kafka_bootstrap_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEWATCH_KAFKA_PORT", "20123")
    monkeypatch.setenv("TIDEWATCH_KAFKA_BOOTSTRAP", "broker.example:9092")
    assert Settings().kafka_bootstrap == "broker.example:9092"
