"""Kafka client configuration of every app component: the principal it connects as, its
librdkafka settings and Spark Kafka source options, and (opt-in SASL/SCRAM mode) each principal's
credentials and ACLs.  Base layer: imported by the engine, the feeds, the relay and the dashboard."""

from __future__ import annotations

from typing import Any

from tidewatch.settings import Settings

#: SASL mechanism of the opt-in ``kafka_security = "scram"`` mode
SCRAM = "SCRAM-SHA-512"
#: the broker's super user in that mode (also its inter-broker identity)
ADMIN = "admin"


def scram_enabled(settings: Settings) -> bool:
    """True in the opt-in SASL/SCRAM + ACL mode (``TIDEWATCH_KAFKA_SECURITY=scram``)."""
    mode = str(getattr(settings, "kafka_security", "plaintext")).lower()
    if mode not in ("plaintext", "scram"):
        raise ValueError(f"kafka_security must be 'plaintext' or 'scram', not {mode!r}")
    return mode == "scram"


def password_variable(principal: str) -> str:
    """The environment variable holding ``principal``'s SCRAM password."""
    return f"TIDEWATCH_KAFKA_{principal.upper()}_PASSWORD"


def _password(settings: Settings, principal: str) -> str:
    password = getattr(settings, f"kafka_{principal}_password", None)
    if not password:
        raise RuntimeError(
            f"TIDEWATCH_KAFKA_SECURITY=scram: Kafka principal {principal!r} has no SCRAM password; "
            f"set {password_variable(principal)} (in the environment, or as a file of that name "
            "in TIDEWATCH_SECRETS_DIR)"
        )
    return str(password)


# ---------------------------------------------------------------- opt-in SASL/SCRAM + ACLs
#: the Kafka principal of each app component; every Kafka client of the app connects as one of
#: them (the SCRAM user in the scram mode, see :func:`client_config` / :func:`spark_options`)
PRINCIPALS = ("feed", "engine", "dashboard", "relay")


def client_config(settings: Settings, principal: str = ADMIN) -> dict[str, str]:
    """librdkafka settings to connect as ``principal`` (``admin`` or one of :data:`PRINCIPALS`);
    empty in the plaintext mode.  A missing password raises, naming the variable to set."""
    if principal != ADMIN and principal not in PRINCIPALS:
        raise ValueError(f"unknown Kafka principal {principal!r}")
    if not scram_enabled(settings):
        return {}
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": SCRAM,
        "sasl.username": principal,
        "sasl.password": _password(settings, principal),
    }


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
    """Options of Spark's Kafka source for ``principal``: the Java client's SASL/SCRAM settings
    (``kafka.``-prefixed) and ``groupIdPrefix`` (the source's generated consumer group ids then
    start with the principal's :data:`ID_PREFIX`, which its ACLs allow); empty in the plaintext mode."""
    conf = client_config(settings, principal)
    if not conf:
        return {}
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f"username={_jaas_quote(conf['sasl.username'])} password={_jaas_quote(conf['sasl.password'])};"
    )
    return {
        "kafka.security.protocol": conf["security.protocol"],
        "kafka.sasl.mechanism": conf["sasl.mechanism"],
        "kafka.sasl.jaas.config": jaas,
        "groupIdPrefix": f"{ID_PREFIX[principal]}-spark",
    }


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
