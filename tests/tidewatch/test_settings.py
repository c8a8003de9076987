"""The one settings object: derived defaults follow what the user set."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tidewatch.settings import DEMO_PASSWORDS, PROJECT_ROOT, Settings


def test_kafka_bootstrap_follows_the_embedded_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEWATCH_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("TIDEWATCH_KAFKA_PORT", "20123")
    assert Settings().kafka_bootstrap == "127.0.0.1:20123"


def test_an_explicit_kafka_bootstrap_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEWATCH_KAFKA_PORT", "20123")
    monkeypatch.setenv("TIDEWATCH_KAFKA_BOOTSTRAP", "broker.example:9092")
    assert Settings().kafka_bootstrap == "broker.example:9092"


# --- secrets: demo passwords refused in production, secret files (docs/RELIABILITY.md) --------
_REAL = {
    "pg_password": "pg-Real-1",
    "demo_password": "demo-Real-1",
    "pg_engine_password": None,
    "pg_dashboard_password": None,
    "pg_relay_password": None,
}


def test_demo_deployment_keeps_the_built_in_passwords() -> None:
    s = Settings()
    assert s.deployment == "demo" and s.pg_password == DEMO_PASSWORDS["pg_password"]


def test_production_refuses_each_built_in_demo_password(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TIDEWATCH_PG_PASSWORD", "TIDEWATCH_DEMO_PASSWORD", "TIDEWATCH_DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValidationError) as info:
        Settings(deployment="production")
    msg = str(info.value)
    assert "TIDEWATCH_PG_PASSWORD" in msg and "TIDEWATCH_DEMO_PASSWORD" in msg
    for field, demo in DEMO_PASSWORDS.items():
        with pytest.raises(ValidationError, match=f"TIDEWATCH_{field.upper()}"):
            Settings(deployment="production", **{**_REAL, field: demo})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="TIDEWATCH_DATABASE_URL"):
        Settings(deployment="production", database_url="postgresql://u:tidewatch@h/db", **_REAL)  # type: ignore[arg-type]
    s = Settings(deployment="production", **_REAL)  # type: ignore[arg-type]
    assert s.pg_password == "pg-Real-1"


def test_production_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEWATCH_DEPLOYMENT", "production")
    monkeypatch.delenv("TIDEWATCH_PG_PASSWORD", raising=False)
    monkeypatch.setenv("TIDEWATCH_DEMO_PASSWORD", "demo-Real-1")
    with pytest.raises(ValidationError, match="refuses the built-in demo password of TIDEWATCH_PG_PASSWORD"):
        Settings()
    monkeypatch.setenv("TIDEWATCH_PG_PASSWORD", "pg-Real-1")
    assert Settings().deployment == "production"


def test_passwords_from_files_in_the_secrets_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "TIDEWATCH_PG_PASSWORD").write_text("from-a-file\n")
    (secrets / "TIDEWATCH_KAFKA_ENGINE_PASSWORD").write_text("engine-file")
    monkeypatch.delenv("TIDEWATCH_PG_PASSWORD", raising=False)
    monkeypatch.delenv("TIDEWATCH_KAFKA_ENGINE_PASSWORD", raising=False)
    monkeypatch.setenv("TIDEWATCH_SECRETS_DIR", str(secrets))
    s = Settings()
    assert s.pg_password == "from-a-file" and s.kafka_engine_password == "engine-file"
    monkeypatch.setenv("TIDEWATCH_DEPLOYMENT", "production")
    monkeypatch.setenv("TIDEWATCH_DEMO_PASSWORD", "demo-Real-1")
    assert Settings().pg_password == "from-a-file"  # production accepts it
    monkeypatch.setenv("TIDEWATCH_PG_PASSWORD", "from-the-env")  # the environment wins
    assert Settings().pg_password == "from-the-env"


def test_secrets_dir_must_be_outside_the_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIDEWATCH_SECRETS_DIR", str(PROJECT_ROOT / "tidewatch"))
    with pytest.raises(ValueError, match="inside the repository"):
        Settings()
    monkeypatch.setenv("TIDEWATCH_SECRETS_DIR", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not a directory"):
        Settings()
