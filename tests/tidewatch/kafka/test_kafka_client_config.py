"""Each app component's Kafka client config (:mod:`tidewatch.stack.kafka_broker`) and the scram checks
of ``tidewatch up`` -- no services started."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tidewatch.kafka import client as kafka_client
from tidewatch.settings import Settings
from tidewatch.stack import embedded as stack

PASSWORDS = {f"kafka_{p}_password": f"pw-{p}" for p in (kafka_client.ADMIN, *kafka_client.PRINCIPALS)}


def _scram(**kw: object) -> Settings:
    return Settings(kafka_security="scram", **{**PASSWORDS, **kw})  # type: ignore[arg-type]


def test_plaintext_configs_are_exactly_the_old_ones() -> None:
    s = Settings(kafka_port=19999)
    for p in kafka_client.PRINCIPALS:
        assert kafka_client.librdkafka_config(s, p, **{"group.id": "g"}) == {
            "bootstrap.servers": "127.0.0.1:19999",
            "group.id": "g",
        }
        assert kafka_client.client_config(s, p) == {}
    assert kafka_client.spark_options(s) == {}
    assert stack._kafka_env(s, "engine") == {}


def test_scram_config_of_each_principal() -> None:
    s = _scram()
    for p in kafka_client.PRINCIPALS:
        conf = kafka_client.librdkafka_config(s, p, "h:1")
        assert conf == {
            "bootstrap.servers": "h:1",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": p,
            "sasl.password": f"pw-{p}",
        }
    with pytest.raises(ValueError, match="unknown Kafka principal"):
        kafka_client.client_config(s, "intruder")


def test_spark_source_options_come_from_the_engine_principal() -> None:
    s = _scram(kafka_engine_password='pa"ss\\word')
    opts = kafka_client.spark_options(s, "engine")
    assert opts["kafka.security.protocol"] == "SASL_PLAINTEXT"
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="engine" password="pa\\"ss\\\\word";'
    )
    # Spark's generated consumer groups fall under the engine's ACL'd prefix
    assert opts["groupIdPrefix"].startswith(kafka_client.ID_PREFIX["engine"])
    assert all(
        name.startswith(kafka_client.ID_PREFIX["engine"])
        for kind, name, _, _ in kafka_client.acls(s)["engine"]
        if kind == "group"
    )


def test_missing_password_names_the_variable() -> None:
    s = _scram(kafka_dashboard_password=None)
    with pytest.raises(RuntimeError, match="TIDEWATCH_KAFKA_DASHBOARD_PASSWORD"):
        kafka_client.client_config(s, "dashboard")
    with pytest.raises(RuntimeError, match="TIDEWATCH_KAFKA_DASHBOARD_PASSWORD"):
        stack.check_kafka_secrets(s, ["engine", "dashboard"])
    stack.check_kafka_secrets(s, ["engine", "feed"])  # the dashboard is not started: fine


def test_each_app_process_gets_only_its_own_password() -> None:
    s = _scram()
    for app in stack.APPS:
        assert app.principal in kafka_client.PRINCIPALS
        env = stack._kafka_env(s, app.principal)
        mine = kafka_client.password_variable(app.principal)
        assert env[mine] == f"pw-{app.principal}"
        assert {k for k, v in env.items() if v} == {mine}
        assert env[kafka_client.password_variable(kafka_client.ADMIN)] == ""


def test_up_fails_early_on_a_missing_password(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from tidewatch.cli import app
    from tidewatch.settings import get_settings

    monkeypatch.setenv("TIDEWATCH_KAFKA_SECURITY", "scram")
    for var, value in PASSWORDS.items():
        monkeypatch.setenv(f"TIDEWATCH_{var.upper()}", value)
    monkeypatch.delenv("TIDEWATCH_KAFKA_RELAY_PASSWORD")
    monkeypatch.setenv("TIDEWATCH_RUN_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        res = CliRunner().invoke(app, ["up"])
    finally:
        get_settings.cache_clear()
    assert res.exit_code == 2, res.output
    assert "TIDEWATCH_KAFKA_RELAY_PASSWORD" in res.output
    assert not list(tmp_path.iterdir())  # type: ignore[attr-defined]  # nothing was started
