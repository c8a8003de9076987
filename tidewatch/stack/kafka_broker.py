"""The embedded Kafka broker: Apache Kafka 4.x in KRaft mode, one node acting as broker and controller.

Runs ``java -cp '<cache>/kafka/<version>/libs/*' kafka.Kafka server.properties`` with its own
log dir under ``<run_dir>/kafka``, the client listener on ``127.0.0.1:settings.kafka_port`` and
the controller on ``127.0.0.1:settings.kafka_controller_port``.  The storage is formatted
once (``kafka.tools.StorageTool format``) with a fresh cluster id and a static voter set.
The client listener speaks ``settings.kafka_security``'s protocol (PLAINTEXT, SASL_PLAINTEXT, SSL
or SASL_SSL; the controller listener stays PLAINTEXT on loopback); in the TLS modes with a
self-signed CA and broker certificate made once by :func:`ensure_tls` in ``<run_dir>/kafka/tls``.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from pathlib import Path

from tidewatch import jars as kafka_dist
from tidewatch.kafka import client as kafka_client
from tidewatch.kafka.client import ADMIN, SCRAM, _jaas_quote, _password, client_config, scram_enabled
from tidewatch.settings import Settings
from tidewatch.stack import processes as process

NAME = "kafka"


def kafka_dir(settings: Settings) -> Path:
    return settings.run_dir / "kafka"


def _admin_password(settings: Settings) -> str:
    return _password(settings, ADMIN)


def tls_dir(settings: Settings) -> Path:
    """The embedded broker's TLS material: ``ca.pem`` (what clients trust, :func:`kafka_client.embedded_ca`),
    ``ca.key``, ``broker.pem`` (certificate for 127.0.0.1 / localhost) and ``broker.key``."""
    return kafka_client.embedded_ca(settings).parent


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "openssl not found: the TLS modes of the embedded broker need it (apt install openssl)"
        )
    res = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed:\n{res.stderr}")


def ensure_tls(settings: Settings, days: int = 825) -> Path:
    """Make the embedded broker's TLS material once (a self-signed CA and a broker certificate it
    signed, for 127.0.0.1 and localhost; RSA 2048, PKCS#8 keys, mode 0600) with ``openssl``; return
    :func:`tls_dir`.  Kept across restarts, so clients that trust ``ca.pem`` keep trusting it."""
    d = tls_dir(settings)
    if all((d / f).is_file() for f in ("ca.pem", "ca.key", "broker.pem", "broker.key")):
        return d
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    tmp = d / "new"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    (tmp / "broker.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"  # clientAuth: the broker's inter-broker client
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    # fmt: off
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", str(days + 365), "-subj", f"/CN=Tidewatch embedded Kafka CA {uuid.uuid4().hex[:8]}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=tmp)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
             "-subj", "/CN=127.0.0.1", cwd=tmp)
    _openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-set_serial", str(uuid.uuid4().int >> 64), "-days", str(days), "-sha256",
             "-extfile", "broker.ext", "-out", "broker.pem", cwd=tmp)
    # fmt: on
    for name in ("ca.pem", "ca.key", "broker.pem", "broker.key"):
        (tmp / name).chmod(0o644 if name == "ca.pem" else 0o600)
        (tmp / name).replace(d / name)
    shutil.rmtree(tmp, ignore_errors=True)
    return d


def _properties_value(text: str) -> str:
    """``text`` as a Java properties value (new lines escaped: a PEM block stays one value)."""
    return text.strip().replace("\\", "\\\\").replace("\n", "\\n")


def _tls_lines(settings: Settings) -> list[str]:
    """The TLS listener's key, certificate and truststore (the broker's inter-broker client uses
    them too).  No client certificates (``ssl.client.auth=none``): SASL_SSL clients log in with
    SCRAM, SSL clients are anonymous."""
    d = tls_dir(settings)
    if not (d / "broker.key").is_file():
        raise RuntimeError(f"no TLS material in {d}: kafka_broker.ensure_tls makes it")
    return [
        "ssl.keystore.type=PEM",  # in-line: a PEM keystore file would need an encrypted key
        f"ssl.keystore.key={_properties_value((d / 'broker.key').read_text())}",
        f"ssl.keystore.certificate.chain={_properties_value((d / 'broker.pem').read_text())}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={d / 'ca.pem'}",
        "ssl.endpoint.identification.algorithm=https",
    ]


def _listener_lines(settings: Settings, host: str, port: int, cport: int) -> list[str]:
    protocol = kafka_client.security_protocol(settings)
    lines = [
        f"listeners={protocol}://{host}:{port},CONTROLLER://{host}:{cport}",
        f"advertised.listeners={protocol}://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        f"inter.broker.listener.name={protocol}",
        f"listener.security.protocol.map={protocol}:{protocol},CONTROLLER:PLAINTEXT",
    ]
    if kafka_client.tls_enabled(settings):
        lines += _tls_lines(settings)
    if not kafka_client.scram_enabled(settings):
        return lines
    pw = _jaas_quote(_admin_password(settings))
    return [
        *lines,
        f"sasl.enabled.mechanisms={SCRAM}",
        f"sasl.mechanism.inter.broker.protocol={SCRAM}",
        f"listener.name.{protocol.lower()}.{SCRAM.lower()}.sasl.jaas.config="
        f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}" password={pw};',
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # the KRaft controller listener (loopback only) cannot use SCRAM: its peer is ANONYMOUS
        f"super.users=User:{ADMIN};User:ANONYMOUS",
        "allow.everyone.if.no.acl.found=false",
    ]


def server_properties(settings: Settings) -> str:
    d = kafka_dir(settings)
    host, port, cport = "127.0.0.1", settings.kafka_port, settings.kafka_controller_port
    return "\n".join(
        [
            "# generated by tidewatch.stack.kafka_broker -- edits are overwritten",
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@{host}:{cport}",
            *_listener_lines(settings, host, port, cport),
            f"log.dirs={d / 'data'}",
            f"num.partitions={settings.topic_partitions}",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "log.retention.hours=24",
            "log.segment.bytes=67108864",
            "log.cleaner.dedupe.buffer.size=16777216",
            "",
        ]
    )


def log4j_properties(settings: Settings) -> str:
    log = kafka_dir(settings) / "server.log"
    return "\n".join(
        [
            "status = warn",
            "appender.file.type = RollingFile",
            "appender.file.name = file",
            f"appender.file.fileName = {log}",
            f"appender.file.filePattern = {log}.%i",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = [%d] %p %m (%c)%n",
            "appender.file.policies.type = Policies",
            "appender.file.policies.size.type = SizeBasedTriggeringPolicy",
            "appender.file.policies.size.size = 20MB",
            "appender.file.strategy.type = DefaultRolloverStrategy",
            "appender.file.strategy.max = 3",
            "rootLogger.level = INFO",
            "rootLogger.appenderRef.file.ref = file",
            "logger.kafka.name = org.apache.kafka",
            "logger.kafka.level = WARN",
            "logger.state.name = state.change.logger",
            "logger.state.level = WARN",
            "",
        ]
    )


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: run scripts/setup.sh (installs default-jre-headless)")
    return java


def _jvm_args(settings: Settings) -> list[str]:
    d = kafka_dir(settings)
    return [
        _java(),
        f"-Xmx{settings.kafka_heap}",
        "-Xms128m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={d}",
        "-cp",
        str(kafka_dist.kafka_libs_dir(settings) / "*"),
    ]


def _cluster_id() -> str:
    """A Kafka ``Uuid`` string: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def prepare(settings: Settings) -> Path:
    """Write the config files and format the storage once; return the properties path."""
    s = settings
    kafka_dist.ensure_kafka(s)
    d = kafka_dir(s)
    (d / "data").mkdir(parents=True, exist_ok=True)
    if kafka_client.tls_enabled(s):
        ensure_tls(s)
    props = d / "server.properties"
    props.touch(mode=0o600)  # holds the admin's SCRAM password and the TLS key in those modes
    props.chmod(0o600)
    props.write_text(server_properties(s))
    (d / "log4j2.properties").write_text(log4j_properties(s))
    if not (d / "data" / "meta.properties").exists():
        scram = (
            ["--add-scram", f"{SCRAM}=[name={ADMIN},password={_admin_password(s)}]"]
            if scram_enabled(s)
            else []
        )
        res = subprocess.run(
            [
                *_jvm_args(s),
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={_cluster_id()}",  # an id may begin with "-": one argument, not an option
                "-c",
                str(props),
                *scram,
            ],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise RuntimeError(f"kafka storage format failed:\n{res.stdout}{res.stderr}")
    return props


def healthy(settings: Settings, timeout: float = 3.0) -> bool:
    """The broker answers a metadata request on its client port."""
    s = settings
    if not process.port_open("127.0.0.1", s.kafka_port):
        return False
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        {"bootstrap.servers": f"127.0.0.1:{s.kafka_port}", "log_level": 0, **client_config(s)}
    )
    try:
        md = admin.list_topics(timeout=timeout)
    except Exception:  # noqa: BLE001
        return False
    return bool(md.brokers)


def start(settings: Settings) -> process.ProcessRecord:
    """Start the broker (if not running) and wait until it answers."""
    s = settings
    rec = process.read_record(s.run_dir, NAME)
    if process.is_running(rec):
        assert rec is not None
        return rec
    if process.port_open("127.0.0.1", s.kafka_port):
        raise RuntimeError(
            f"port {s.kafka_port} is taken by {process.port_holder(s.kafka_port)}, which tidewatch did not "
            "start: stop it, or set TIDEWATCH_KAFKA_PORT to a free port"
        )
    props = prepare(s)
    d = kafka_dir(s)
    rec = process.spawn(
        s.run_dir,
        NAME,
        [*_jvm_args(s), "kafka.Kafka", str(props)],
        log=d / "stdout.log",
        cwd=d,
        port=s.kafka_port,
    )
    try:
        process.wait_until(
            lambda: _alive_or_raise(rec, d) and healthy(s, timeout=1.0),
            timeout=s.kafka_start_timeout_s,
            interval=0.5,
            what=f"Kafka on 127.0.0.1:{s.kafka_port}",
        )
    except BaseException:
        process.stop(s.run_dir, NAME)
        raise
    return rec


def _alive_or_raise(rec: process.ProcessRecord, d: Path) -> bool:
    if not process.is_running(rec):
        tail = ""
        for f in (d / "stdout.log", d / "server.log"):
            if f.exists():
                tail += "\n".join(f.read_text(errors="replace").splitlines()[-15:])
        raise process.StartupFailed(f"Kafka exited during start-up:\n{tail}")
    return True


def stop(settings: Settings, *, timeout: float = 30.0) -> bool:
    """Controlled shutdown on SIGTERM; SIGKILL after ``timeout``."""
    s = settings
    return process.stop(s.run_dir, NAME, timeout=timeout)
