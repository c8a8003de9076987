"""Kafka client configuration of every app component: the principal it connects as, its
librdkafka settings and Spark Kafka source options, and (opt-in SASL/SCRAM modes) each principal's
credentials and ACLs.  Base layer: imported by the engine, the feeds, the relay and the dashboard.

``settings.kafka_security`` picks Kafka's ``security.protocol`` (:data:`PROTOCOLS`):
``plaintext`` (default), ``scram`` (SASL_PLAINTEXT), ``ssl`` (SSL) or ``scram_ssl`` (SASL_SSL).
In the TLS modes (``ssl``, ``scram_ssl``) the clients verify the broker's certificate against
:func:`ca_location` and may present a client certificate (``kafka_ssl_certificate_location``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidewatch.errors import TidewatchError
from tidewatch.settings import Settings

#: SASL mechanism of the opt-in ``scram`` / ``scram_ssl`` modes
SCRAM = "SCRAM-SHA-512"
#: the broker's super user in those modes (also its inter-broker identity)
ADMIN = "admin"
#: ``settings.kafka_security`` -> Kafka's ``security.protocol`` (librdkafka and the Java client)
PROTOCOLS = {
    "plaintext": "PLAINTEXT",
    "scram": "SASL_PLAINTEXT",
    "ssl": "SSL",
    "scram_ssl": "SASL_SSL",
}


class KafkaTlsConfigError(TidewatchError, ValueError):
    """The TLS settings of a Kafka client cannot work (a file missing, a key without certificate)."""


def security_protocol(settings: Settings) -> str:
    """Kafka's ``security.protocol`` of ``settings.kafka_security`` (:data:`PROTOCOLS`)."""
    mode = str(getattr(settings, "kafka_security", "plaintext")).lower()
    if mode not in PROTOCOLS:
        raise ValueError(f"kafka_security must be one of {', '.join(PROTOCOLS)}, not {mode!r}")
    return PROTOCOLS[mode]


def scram_enabled(settings: Settings) -> bool:
    """True in the opt-in SASL/SCRAM + ACL modes (``TIDEWATCH_KAFKA_SECURITY=scram`` or ``scram_ssl``)."""
    return security_protocol(settings).startswith("SASL_")


def tls_enabled(settings: Settings) -> bool:
    """True in the TLS modes (``TIDEWATCH_KAFKA_SECURITY=ssl`` or ``scram_ssl``)."""
    return security_protocol(settings) in ("SSL", "SASL_SSL")


def embedded_ca(settings: Settings) -> Path:
    """The CA certificate (PEM) of the embedded broker, made by ``tidewatch up`` in a TLS mode
    (:func:`tidewatch.stack.kafka_broker.ensure_tls`)."""
    return settings.run_dir / "kafka" / "tls" / "ca.pem"


def ca_location(settings: Settings) -> Path | None:
    """The CA file the clients verify the broker with: ``kafka_ssl_ca_location``; else the embedded
    broker's CA when ``tidewatch up`` made one; else None (the system's trust store)."""
    explicit = getattr(settings, "kafka_ssl_ca_location", None)
    if explicit is not None:
        return Path(explicit)
    ca = embedded_ca(settings)
    return ca if ca.is_file() else None


def _tls_files(settings: Settings) -> tuple[Path | None, Path | None, Path | None]:
    """(CA, client certificate, client key), each an existing file or None."""
    ca = ca_location(settings)
    cert = settings.kafka_ssl_certificate_location
    key = settings.kafka_ssl_key_location
    if key is not None and cert is None:
        raise KafkaTlsConfigError(
            "TIDEWATCH_KAFKA_SSL_KEY_LOCATION is set without TIDEWATCH_KAFKA_SSL_CERTIFICATE_LOCATION"
        )
    if cert is not None and key is None:
        key = cert  # one PEM file with the key and the certificate chain
    for var, path in (("CA", ca), ("CERTIFICATE", cert), ("KEY", key)):
        if path is not None and not Path(path).is_file():
            raise KafkaTlsConfigError(f"TIDEWATCH_KAFKA_SSL_{var}_LOCATION: no file {path}")
    return ca, cert, key


def password_variable(principal: str) -> str:
    """The environment variable holding ``principal``'s SCRAM password."""
    return f"TIDEWATCH_KAFKA_{principal.upper()}_PASSWORD"


def _password(settings: Settings, principal: str) -> str:
    password = getattr(settings, f"kafka_{principal}_password", None)
    if not password:
        raise RuntimeError(
            f"TIDEWATCH_KAFKA_SECURITY={settings.kafka_security}: Kafka principal {principal!r} has no "
            f"SCRAM password; set {password_variable(principal)} (in the environment, or as a file of "
            "that name in TIDEWATCH_SECRETS_DIR)"
        )
    return str(password)


# ---------------------------------------------------------------- opt-in SASL/SCRAM + ACLs
#: the Kafka principal of each app component; every Kafka client of the app connects as one of
#: them (the SCRAM user in the scram mode, see :func:`client_config` / :func:`spark_options`)
PRINCIPALS = ("feed", "engine", "dashboard", "relay")


def client_config(settings: Settings, principal: str = ADMIN) -> dict[str, str]:
    """librdkafka settings to connect as ``principal`` (``admin`` or one of :data:`PRINCIPALS`):
    ``security.protocol``, in the SCRAM modes the principal's credentials, in the TLS modes the CA,
    host name check and client certificate (every principal the same: TLS alone identifies no
    principal, the ACLs need a SCRAM mode).  Empty in the plaintext mode.  A missing password
    raises, naming the variable; unusable TLS files raise :class:`KafkaTlsConfigError`."""
    if principal != ADMIN and principal not in PRINCIPALS:
        raise ValueError(f"unknown Kafka principal {principal!r}")
    protocol = security_protocol(settings)
    if protocol == "PLAINTEXT":
        return {}
    conf = {"security.protocol": protocol}
    if scram_enabled(settings):
        conf |= {
            "sasl.mechanism": SCRAM,
            "sasl.username": principal,
            "sasl.password": _password(settings, principal),
        }
    if tls_enabled(settings):
        ca, cert, key = _tls_files(settings)
        if ca is not None:
            conf["ssl.ca.location"] = str(ca)
        conf["ssl.endpoint.identification.algorithm"] = (
            "https" if settings.kafka_ssl_verify_hostname else "none"
        )
        if cert is not None and key is not None:
            conf["ssl.certificate.location"] = str(cert)
            conf["ssl.key.location"] = str(key)
            if settings.kafka_ssl_key_password:
                conf["ssl.key.password"] = settings.kafka_ssl_key_password
    return conf


def librdkafka_config(
    settings: Settings, principal: str, bootstrap: str | None = None, /, **conf: Any
) -> dict[str, Any]:
    """The full librdkafka config of an app client: ``bootstrap.servers`` (default
    ``settings.kafka_bootstrap``), the principal's credentials (:func:`client_config`), then ``conf``.
    In the plaintext mode this is exactly ``{"bootstrap.servers": ..., **conf}``."""
    return {
        "bootstrap.servers": bootstrap or settings.kafka_bootstrap,
        **client_config(settings, principal),
        **conf,
    }


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_options(settings: Settings, principal: str = "engine") -> dict[str, str]:
    """Options of Spark's Kafka source for ``principal``: the Java client's settings of
    :func:`client_config` (``kafka.``-prefixed: ``security.protocol``; SASL/SCRAM with a JAAS
    config; in the TLS modes the host name check, the CA as a PEM truststore and a client
    certificate as a PEM keystore) and ``groupIdPrefix`` (the source's generated consumer group ids
    then start with the principal's :data:`ID_PREFIX`, which its ACLs allow); empty in the
    plaintext mode.  The PEM files are given in-line, read here on the driver: executors on other
    hosts need no copy of them, and a PEM keystore *file* would need an encrypted key."""
    conf = client_config(settings, principal)
    if not conf:
        return {}
    opts = {"kafka.security.protocol": conf["security.protocol"]}
    if scram_enabled(settings):
        opts["kafka.sasl.mechanism"] = conf["sasl.mechanism"]
        opts["kafka.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f"username={_jaas_quote(conf['sasl.username'])} password={_jaas_quote(conf['sasl.password'])};"
        )
    if tls_enabled(settings):
        # the Java client's "no check" is the empty string (librdkafka's is "none")
        verify = conf["ssl.endpoint.identification.algorithm"] == "https"
        opts["kafka.ssl.endpoint.identification.algorithm"] = "https" if verify else ""
        if "ssl.ca.location" in conf:  # else the JVM's trust store
            opts["kafka.ssl.truststore.type"] = "PEM"
            opts["kafka.ssl.truststore.certificates"] = Path(conf["ssl.ca.location"]).read_text()
        if "ssl.certificate.location" in conf:
            opts["kafka.ssl.keystore.type"] = "PEM"
            opts["kafka.ssl.keystore.certificate.chain"] = Path(conf["ssl.certificate.location"]).read_text()
            opts["kafka.ssl.keystore.key"] = Path(conf["ssl.key.location"]).read_text()
            if "ssl.key.password" in conf:
                opts["kafka.ssl.key.password"] = conf["ssl.key.password"]
    opts["groupIdPrefix"] = f"{ID_PREFIX[principal]}-spark"
    return opts


#: principal -> the prefix of its consumer group ids and transactional ids in the code
#: (ingest/producer.py ``tidewatch-feed-<feed id>-<run>`` of ``--resume``, engine/sinks/publish.py
#: ``tidewatch-engine-<id>`` and ``tidewatch-engine-<id>-progress``, engine/app.py
#: ``tidewatch-engine-replay`` and Spark's ``tidewatch-engine-spark-*`` (:func:`spark_options`),
#: dashboard/detail.py ``tidewatch-dashboard-<uuid>``, subscriptions/outbox.py
#: ``tidewatch-outbox-relay:<topic>`` and ``tidewatch-outbox-relay-recovery``)
ID_PREFIX = {
    "feed": "tidewatch-feed",
    "engine": "tidewatch-engine",
    "dashboard": "tidewatch-dashboard",
    "relay": "tidewatch-outbox-relay",
}


def acls(settings: Settings) -> dict[str, list[tuple[str, str, str, str]]]:
    """Per principal: (resource type, name, pattern, operation) it is allowed; all else is denied.

    * ``feed`` writes the stream topics (trades, packets); a resumable feed (``--resume``) writes
      in transactions that also commit its progress as a consumer-group offset on partition 0
      of its topic, which Kafka allows only with READ on the topic
      (TxnOffsetCommit): so READ on the streams, and nothing else;
    * ``engine`` reads the streams and subscriptions, writes alerts, results and dead-letter
      transactionally, and reads alerts back (its progress marker, engine/sinks/publish.py);
    * ``dashboard`` reads alerts and results, and the streams (the key-detail charts read them);
    * ``relay`` writes the subscriptions topic transactionally and reads it back (recovery).

    Consumer groups and transactional ids are limited to the principal's :data:`ID_PREFIX`
    (the engine's Spark Kafka source gets ``groupIdPrefix`` from :func:`spark_options`).
    """
    s = settings
    streams = [s.topic_trades, s.topic_packets]

    def topics(names: list[str], *ops: str) -> list[tuple[str, str, str, str]]:
        return [("topic", t, "literal", op) for t in names for op in ops]

    def ids(principal: str, txn: bool) -> list[tuple[str, str, str, str]]:
        prefix = ID_PREFIX[principal]
        out = [("group", prefix, "prefixed", "READ")]
        if txn:
            out += [("transactional_id", prefix, "prefixed", op) for op in ("WRITE", "DESCRIBE")]
        return out

    out: dict[str, list[tuple[str, str, str, str]]] = {
        "feed": topics(streams, "WRITE", "READ", "DESCRIBE") + ids("feed", txn=True),
        "engine": topics([*streams, s.topic_subscriptions, s.topic_alerts], "READ", "DESCRIBE")
        + topics([s.topic_alerts, s.topic_results, s.topic_dead_letter], "WRITE", "DESCRIBE")
        + ids("engine", txn=True),
        "dashboard": topics([s.topic_alerts, s.topic_results, *streams], "READ", "DESCRIBE")
        + ids("dashboard", txn=False),
        "relay": topics([s.topic_subscriptions], "WRITE", "READ", "DESCRIBE") + ids("relay", txn=True),
    }
    for principal in out:
        out[principal].append(("cluster", "kafka-cluster", "literal", "IDEMPOTENT_WRITE"))
        out[principal] = list(dict.fromkeys(out[principal]))  # e.g. DESCRIBE of a topic read and written
    return out


def ensure_principals(settings: Settings, timeout: float = 30.0, bootstrap: str | None = None) -> list[str]:
    """Create (or update) the SCRAM credentials of every principal with a password, and its ACLs.

    Runs as ``admin`` against ``bootstrap`` (default ``settings.kafka_bootstrap``); returns the
    principals set up.  Principals without a password are left out (they cannot log in)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialAlteration,
        UserScramCredentialUpsertion,
    )

    s = settings
    if not scram_enabled(s):
        return []
    admin = AdminClient(librdkafka_config(s, ADMIN, bootstrap))
    rules = acls(s)
    users = [p for p in rules if getattr(s, f"kafka_{p}_password")]
    if not users:
        return []
    ups: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            p,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
            getattr(s, f"kafka_{p}_password").encode(),
        )
        for p in users
    ]
    for fut in admin.alter_user_scram_credentials(ups, request_timeout=timeout).values():
        fut.result()
    kinds = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "cluster": ResourceType.BROKER,
        "transactional_id": ResourceType.TRANSACTIONAL_ID,
    }
    patterns = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}
    bindings = [
        AclBinding(
            kinds[kind],
            name,
            patterns[pat],
            f"User:{p}",
            "*",
            getattr(AclOperation, op),
            AclPermissionType.ALLOW,
        )
        for p in users
        for kind, name, pat, op in rules[p]
    ]
    for fut in admin.create_acls(bindings, request_timeout=timeout).values():
        fut.result()
    return users
