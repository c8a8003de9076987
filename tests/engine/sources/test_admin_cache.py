"""The AdminClient the engine asks Kafka for offsets with is kept per configuration (a new one
per batch cost 1-3 s of some triggers in the live run), and only for the last few
configurations."""

from __future__ import annotations

from typing import Any

import pytest

from engine.sources import retention


@pytest.fixture(autouse=True)
def _empty_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "_ADMINS", type(retention._ADMINS)())


def test_one_client_per_configuration_the_last_few_kept() -> None:
    made: list[dict[str, Any]] = []

    def make(conf: dict[str, Any]) -> object:
        made.append(conf)
        return object()

    a = {"bootstrap.servers": "127.0.0.1:1"}
    b = {"bootstrap.servers": "127.0.0.1:2"}
    c = {"bootstrap.servers": "127.0.0.1:3"}
    first = retention._admin(make, a)
    assert retention._admin(make, dict(a)) is first and len(made) == 1  # an equal config: kept
    second = retention._admin(make, b)
    assert second is not first and len(made) == 2
    assert retention._admin(make, a) is first  # a used again: now the most recent
    retention._admin(make, c)  # a third: the least recently used one (b) is dropped
    assert len(made) == 3 and retention._admin(make, a) is first
    assert retention._admin(make, b) is not second and len(made) == 4
