"""Each app component's Kafka client config (:mod:`tidewatch.kafka.client`) in every
``kafka_security`` mode, the embedded broker's listener of each mode
(:mod:`tidewatch.stack.kafka_broker`, its TLS material made with ``openssl``) and the checks of
``tidewatch up`` -- no services started."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from tidewatch.kafka import client as kafka_client
from tidewatch.settings import Settings
from tidewatch.stack import embedded as stack
from tidewatch.stack import kafka_broker

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


# --------------------------------------------------------------------------- the TLS modes
CA_PEM = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


def _pem(path: Path, text: str = CA_PEM) -> Path:
    path.write_text(text)
    return path


def _tls(mode: str, tmp_path: Path, **kw: object) -> Settings:
    ca = _pem(tmp_path / "ca.pem")
    fields: dict[str, Any] = {"kafka_security": mode, "run_dir": tmp_path / "run", **PASSWORDS}
    return Settings(**{**fields, "kafka_ssl_ca_location": ca, **kw})


def test_each_mode_is_kafkas_security_protocol() -> None:
    assert kafka_client.PROTOCOLS == {
        "plaintext": "PLAINTEXT",
        "scram": "SASL_PLAINTEXT",
        "ssl": "SSL",
        "scram_ssl": "SASL_SSL",
    }
    for mode, protocol in kafka_client.PROTOCOLS.items():
        s = Settings(kafka_security=mode.upper(), **PASSWORDS)  # type: ignore[arg-type]
        assert s.kafka_security == mode and kafka_client.security_protocol(s) == protocol
        assert kafka_client.scram_enabled(s) == (mode in ("scram", "scram_ssl"))
        assert kafka_client.tls_enabled(s) == (mode in ("ssl", "scram_ssl"))
    with pytest.raises(ValidationError):
        Settings(kafka_security="tls")  # type: ignore[arg-type]


def test_ssl_config_of_each_principal(tmp_path: Path) -> None:
    s = _tls("ssl", tmp_path)
    ca = str(tmp_path / "ca.pem")
    for p in (kafka_client.ADMIN, *kafka_client.PRINCIPALS):
        assert kafka_client.librdkafka_config(s, p, "h:1") == {
            "bootstrap.servers": "h:1",
            "security.protocol": "SSL",
            "ssl.ca.location": ca,
            "ssl.endpoint.identification.algorithm": "https",
        }
    for p in kafka_client.PRINCIPALS:
        assert kafka_client.spark_options(s, p) == {
            "kafka.security.protocol": "SSL",
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.certificates": CA_PEM,  # in-line: executors need no copy
            "kafka.ssl.endpoint.identification.algorithm": "https",
            "groupIdPrefix": f"{kafka_client.ID_PREFIX[p]}-spark",
        }
    assert stack._kafka_env(s, "engine") == {}  # no passwords to hand out
    with pytest.raises(ValueError, match="unknown Kafka principal"):
        kafka_client.client_config(s, "intruder")


def test_scram_ssl_config_of_each_principal(tmp_path: Path) -> None:
    s = _tls("scram_ssl", tmp_path)
    ca = str(tmp_path / "ca.pem")
    for p in (kafka_client.ADMIN, *kafka_client.PRINCIPALS):
        assert kafka_client.librdkafka_config(s, p, "h:1") == {
            "bootstrap.servers": "h:1",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": p,
            "sasl.password": f"pw-{p}",
            "ssl.ca.location": ca,
            "ssl.endpoint.identification.algorithm": "https",
        }
    for p in kafka_client.PRINCIPALS:
        assert kafka_client.spark_options(s, p) == {
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{p}" password="pw-{p}";',
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.certificates": CA_PEM,  # in-line: executors need no copy
            "kafka.ssl.endpoint.identification.algorithm": "https",
            "groupIdPrefix": f"{kafka_client.ID_PREFIX[p]}-spark",
        }
    env = stack._kafka_env(s, "feed")  # each process still gets only its own password
    assert {k for k, v in env.items() if v} == {kafka_client.password_variable("feed")}
    with pytest.raises(RuntimeError, match="TIDEWATCH_KAFKA_RELAY_PASSWORD"):
        kafka_client.client_config(s.model_copy(update={"kafka_relay_password": None}), "relay")


def test_client_certificate_and_no_host_name_check(tmp_path: Path) -> None:
    cert = _pem(tmp_path / "client.pem")
    key = _pem(tmp_path / "client.key", "-----BEGIN PRIVATE KEY-----\nBBBB\n-----END PRIVATE KEY-----\n")
    s = _tls(
        "ssl",
        tmp_path,
        kafka_ssl_certificate_location=cert,
        kafka_ssl_key_location=key,
        kafka_ssl_key_password="kp",
        kafka_ssl_verify_hostname=False,
    )
    conf = kafka_client.client_config(s, "engine")
    assert conf["ssl.certificate.location"] == str(cert)
    assert conf["ssl.key.location"] == str(key)
    assert conf["ssl.key.password"] == "kp"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    opts = kafka_client.spark_options(s, "engine")
    # the Java client: a PEM keystore given in-line (a PEM keystore *file* needs an encrypted key)
    assert opts["kafka.ssl.keystore.type"] == "PEM"
    assert opts["kafka.ssl.keystore.certificate.chain"] == cert.read_text()
    assert opts["kafka.ssl.keystore.key"] == key.read_text()
    assert opts["kafka.ssl.key.password"] == "kp"
    assert opts["kafka.ssl.endpoint.identification.algorithm"] == ""  # Java's "no check"
    # one file with the key and the chain: the key location defaults to it
    both = _pem(tmp_path / "both.pem", key.read_text() + cert.read_text())
    one = s.model_copy(update={"kafka_ssl_certificate_location": both, "kafka_ssl_key_location": None})
    assert kafka_client.client_config(one, "feed")["ssl.key.location"] == str(both)
    assert "ssl.key.password" in kafka_client.client_config(one, "feed")


def test_ca_is_the_setting_else_the_embedded_ca_else_the_system_store(tmp_path: Path) -> None:
    s = Settings(kafka_security="ssl", run_dir=tmp_path / "run")
    conf, opts = kafka_client.client_config(s, "feed"), kafka_client.spark_options(s)
    assert "ssl.ca.location" not in conf and "kafka.ssl.truststore.certificates" not in opts
    embedded = kafka_client.embedded_ca(s)
    assert embedded == tmp_path / "run" / "kafka" / "tls" / "ca.pem"
    embedded.parent.mkdir(parents=True)
    _pem(embedded)
    assert kafka_client.client_config(s, "feed")["ssl.ca.location"] == str(embedded)
    mine = _pem(tmp_path / "mine.pem", CA_PEM.replace("AAAA", "CCCC"))
    explicit = s.model_copy(update={"kafka_ssl_ca_location": mine})
    assert kafka_client.client_config(explicit, "feed")["ssl.ca.location"] == str(mine)
    assert kafka_client.spark_options(explicit)["kafka.ssl.truststore.certificates"] == mine.read_text()


def test_unusable_tls_files_are_refused_by_type(tmp_path: Path) -> None:
    s = _tls("scram_ssl", tmp_path, kafka_ssl_ca_location=tmp_path / "missing.pem")
    with pytest.raises(kafka_client.KafkaTlsConfigError):
        kafka_client.client_config(s, "feed")
    with pytest.raises(kafka_client.KafkaTlsConfigError):  # `tidewatch up` checks before starting
        stack.check_kafka_secrets(s, ["feed"])
    key = _pem(tmp_path / "k.pem")
    with pytest.raises(kafka_client.KafkaTlsConfigError):  # a key without its certificate
        kafka_client.client_config(_tls("ssl", tmp_path, kafka_ssl_key_location=key), "feed")
    assert issubclass(kafka_client.KafkaTlsConfigError, ValueError)


@pytest.mark.parametrize("mode", ["plaintext", "scram", "ssl", "scram_ssl"])
def test_embedded_broker_listener_of_each_mode(mode: str, tmp_path: Path) -> None:
    s = Settings(kafka_security=mode, run_dir=tmp_path / "run", kafka_port=19999, **PASSWORDS)  # type: ignore[arg-type]
    protocol = kafka_client.PROTOCOLS[mode]
    tls = kafka_client.tls_enabled(s)
    if tls:
        d = kafka_broker.ensure_tls(s)
        assert d == kafka_client.embedded_ca(s).parent
        assert oct(d.stat().st_mode & 0o777) == "0o700"
        assert oct((d / "broker.key").stat().st_mode & 0o777) == "0o600"
    props = kafka_broker.server_properties(s)
    lines = dict(
        line.split("=", 1) for line in props.splitlines() if "=" in line and not line.startswith("#")
    )
    assert (
        lines["listeners"] == f"{protocol}://127.0.0.1:19999,CONTROLLER://127.0.0.1:{s.kafka_controller_port}"
    )
    assert lines["advertised.listeners"] == f"{protocol}://127.0.0.1:19999"
    assert lines["inter.broker.listener.name"] == protocol
    assert lines["listener.security.protocol.map"] == f"{protocol}:{protocol},CONTROLLER:PLAINTEXT"
    assert ("ssl.keystore.type" in lines) == tls
    assert ("sasl.enabled.mechanisms" in lines) == kafka_client.scram_enabled(s)
    assert ("authorizer.class.name" in lines) == kafka_client.scram_enabled(s)
    if tls:
        assert lines["ssl.keystore.type"] == "PEM" and lines["ssl.truststore.type"] == "PEM"
        assert lines["ssl.truststore.location"] == str(kafka_client.embedded_ca(s))
        # in-line PEM, one properties line each (Java reads the escaped new lines back)
        assert lines["ssl.keystore.key"].startswith("-----BEGIN PRIVATE KEY-----\\n")
        assert lines["ssl.keystore.certificate.chain"].startswith("-----BEGIN CERTIFICATE-----\\n")
        assert not any("client.auth" in k for k in lines)  # no client certificates asked for
    if mode == "scram_ssl":
        assert "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config" in lines


def test_embedded_certificate_names_the_loopback_and_chains_to_the_ca(tmp_path: Path) -> None:
    s = Settings(kafka_security="ssl", run_dir=tmp_path / "run")
    d = kafka_broker.ensure_tls(s)
    first = (d / "ca.pem").read_bytes()
    assert kafka_broker.ensure_tls(s) == d and (d / "ca.pem").read_bytes() == first  # made once
    ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
    ctx.load_cert_chain(str(d / "broker.pem"), str(d / "broker.key"))  # key and certificate match
    res = subprocess.run(
        ["openssl", "verify", "-CAfile", "ca.pem", "broker.pem"], cwd=d, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", "broker.pem", "-noout", "-ext", "subjectAltName"],
        cwd=d,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in text and "DNS:localhost" in text
