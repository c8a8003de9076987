"""Kafka over TLS on the real embedded broker: SASL_SSL (``kafka_security = "scram_ssl"``) and SSL.

``scram_ssl_stack`` (conftest.py) starts the services the way ``tidewatch up`` does in the
``scram_ssl`` mode: the broker's only client listener is SASL_SSL, its certificate is signed by
the CA made in the run dir (:func:`tidewatch.stack.kafka_broker.ensure_tls`).  Each test runs as
one process of ``tidewatch up`` would (only its own SCRAM password in the environment; the CA
found in the run dir, as the app processes find it) and uses the app's real code: the feed's
:class:`~ingest.producer.KafkaFeed` writes trades, Spark's Kafka source reads them with
:func:`~tidewatch.kafka.client.spark_options` (a batch read: every record, its offsets, its bytes;
then the engine itself, :class:`~engine.app.EngineApp`, counts every record as an event or a dead
letter).  A client without the CA, or without TLS, gets nothing (librdkafka: error code ``_SSL``;
Spark's Java client: ``SslAuthenticationException``).

``ssl_kafka`` is a broker of its own in the ``ssl`` mode (TLS, no SASL) that requires client
certificates (mutual TLS): one of its CA works (librdkafka; Spark's PEM keystore given in-line),
none or one of another CA is refused.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ingest.producer import KafkaFeed, key_table
from ingest.trades_gen import TradeConfig, TradeGenerator
from tests.services import free_port
from tests.tidewatch.stack.support import AsProcess, as_process_of, start_engine_until_rule
from tidewatch.kafka import client as kafka_client
from tidewatch.kafka.admin import ensure_topics
from tidewatch.settings import Settings, get_settings
from tidewatch.stack import kafka_broker
from tidewatch.wire.avro import encode_batch

pytestmark = pytest.mark.integration

SSL_AUTH_FAILED = "org.apache.kafka.common.errors.SslAuthenticationException"
TRANSIENT = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT,
}


@pytest.fixture()
def as_process(scram_ssl_stack: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[AsProcess]:
    """``as_process(principal)``: this test process acts as the app process of ``principal`` in the ``scram_ssl`` mode."""
    yield as_process_of(scram_ssl_stack, monkeypatch)
    monkeypatch.undo()
    get_settings.cache_clear()


# ------------------------------------------------------------------------------- helpers
def _trades(n_ms: int, rate: float = 2_000, seed: int = 7) -> list[dict[str, Any]]:
    gen = TradeGenerator(TradeConfig(rate=rate, n_symbols=20), seed=seed)
    now = int(time.time() * 1000)
    return list(gen.chunks(now - n_ms, now, 1000))


def _expected_records(chunks: list[dict[str, Any]]) -> Counter[tuple[bytes, bytes]]:
    """The (key, value) bytes the feed produces for ``chunks`` (its own encoder and key table)."""
    out: Counter[tuple[bytes, bytes]] = Counter()
    for c in chunks:
        enc = encode_batch("trades", c)
        keys, codes = key_table(c["symbol"])
        data, off = enc.buf.tobytes(), enc.offsets.tolist()
        out.update((keys[codes[j]], data[off[j] : off[j + 1]]) for j in range(len(enc)))
    return out


def _end_offsets(s: Settings, topic: str) -> dict[int, int]:
    """Partition -> end offset, read as ``admin`` over the mode's protocol; retried while a fresh
    topic's partitions still elect their leader."""
    c = Consumer(kafka_client.librdkafka_config(s, kafka_client.ADMIN, **{"group.id": "tidewatch-test"}))
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                parts = c.list_topics(topic, timeout=15).topics[topic].partitions
                return {
                    p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in sorted(parts)
                }
            except KafkaException as exc:
                if exc.args[0].code() not in TRANSIENT or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        c.close()


def _spark_read(
    spark: Any, s: Settings, topic: str, start: dict[int, int], end: dict[int, int], opts: dict[str, str]
) -> list[Any]:
    """Records ``start..end`` of ``topic`` through Spark's Kafka source with ``opts``."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", s.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {str(p): o for p, o in start.items()}}))
        .option("endingOffsets", json.dumps({topic: {str(p): o for p, o in end.items()}}))
        .option("kafka.isolation.level", "read_committed")
        .options(**opts)
        .load()
        .select("partition", "offset", "key", "value")
        .collect()
    )


def _check_every_record(
    rows: list[Any], start: dict[int, int], end: dict[int, int], expected: Counter[tuple[bytes, bytes]]
) -> None:
    """``rows`` are exactly the records ``start..end``: every offset once, the bytes produced."""
    assert len(rows) == sum(end[p] - start[p] for p in end) == sum(expected.values())
    for p in end:
        got = sorted(r["offset"] for r in rows if r["partition"] == p)
        assert got == list(range(start[p], end[p])), f"partition {p}: offsets missing or repeated"
    assert Counter((bytes(r["key"]), bytes(r["value"])) for r in rows) == expected


def _java_error_classes(exc: BaseException) -> set[str]:
    """Class names of the Java exception behind a PySpark error and of its causes."""
    out: set[str] = set()
    # a captured Spark error keeps its Java exception as ``_origin``; a plain Py4J one as ``java_exception``
    java = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    while java is not None and len(out) < 20:
        out.add(str(java.getClass().getName()))
        java = java.getCause()
    return out


def _connect_errors(conf: dict[str, Any]) -> set[int]:
    """Error codes a librdkafka client with ``conf`` reports when it asks for metadata."""
    errors: list[KafkaError] = []
    full: dict[str, Any] = {**conf, "log_level": 0, "error_cb": errors.append}
    admin = AdminClient(full)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(1)  # serves the error callbacks
    return {e.code() for e in errors}


# ------------------------------------------------------------------------------- SASL_SSL
def test_sasl_ssl_feed_to_spark_every_record(
    scram_ssl_stack: Settings, as_process: AsProcess, spark: Any
) -> None:
    """The feed writes trades over SASL_SSL as ``feed``; Spark's Kafka source reads them over
    SASL_SSL as ``engine``: every record, each offset once, the bytes the feed produced."""
    full = scram_ssl_stack
    assert kafka_client.security_protocol(full) == "SASL_SSL"
    start = _end_offsets(full, full.topic_trades)

    s = as_process("feed")
    assert kafka_client.client_config(s, "feed")["ssl.ca.location"] == str(kafka_client.embedded_ca(full))
    chunks = _trades(5_000)
    feed = KafkaFeed("trades", settings=s)  # `tidewatch feed trades`: topic, bootstrap, credentials, TLS
    for c in chunks:
        feed.send(c)
    st = feed.close(timeout=30)
    expected = _expected_records(chunks)
    assert st.produced == sum(expected.values()) and st.failed == 0 and st.unconfirmed == 0
    end = _end_offsets(full, full.topic_trades)
    assert sum(end.values()) - sum(start.values()) == st.produced

    e = as_process("engine")
    opts = kafka_client.spark_options(e, "engine")
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.ssl.truststore.type"] == "PEM"
    assert opts["kafka.ssl.truststore.certificates"] == kafka_client.embedded_ca(full).read_text()
    rows = _spark_read(spark, e, e.topic_trades, start, end, opts)
    _check_every_record(rows, start, end, expected)


def test_sasl_ssl_clients_without_the_ca_or_tls_get_nothing(
    scram_ssl_stack: Settings, as_process: AsProcess, spark: Any
) -> None:
    """No CA: the handshake fails (librdkafka ``_SSL``; Java ``SslAuthenticationException``);
    no TLS at all (the SCRAM credentials over SASL_PLAINTEXT, or nothing): no answer."""
    s = as_process("engine")
    conf = kafka_client.librdkafka_config(s, "engine")
    no_ca = {k: v for k, v in conf.items() if k != "ssl.ca.location"}  # the system's trust store
    assert KafkaError._SSL in _connect_errors(no_ca)
    _connect_errors({**conf, "security.protocol": "SASL_PLAINTEXT"})
    _connect_errors({"bootstrap.servers": s.kafka_bootstrap})

    opts = kafka_client.spark_options(s, "engine")
    no_truststore = {k: v for k, v in opts.items() if not k.startswith("kafka.ssl.truststore.")}
    end = {p: 1 for p in _end_offsets(scram_ssl_stack, s.topic_trades)}
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:  # noqa: PT011 -- told apart by the Java class below
        _spark_read(spark, s, s.topic_trades, dict.fromkeys(end, 0), end, no_truststore)
    assert SSL_AUTH_FAILED in _java_error_classes(info.value), _java_error_classes(info.value)
    assert time.monotonic() - t0 < 120


def test_spark_engine_over_sasl_ssl_counts_every_trade(
    scram_ssl_stack: Settings, as_process: AsProcess, spark: Any, tmp_path: Path
) -> None:
    """The real engine on Spark ``local[2]`` as ``engine`` over SASL_SSL: a rule published by the
    relay reaches it, trades sent by the feed make it alert, and every record of the trades topic
    is counted, as an event or as a dead letter (nothing skipped)."""
    from subscriptions.outbox import OutboxRelay
    from subscriptions.service import SubscriptionService

    full = scram_ssl_stack
    user = f"tls{uuid.uuid4().hex[:6]}"
    service = SubscriptionService(settings=full)
    service.ensure_user(user)
    rule = "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 5 SECONDS > 50"
    sid = str(service.create(user, rule, name="tls spark").id)
    with OutboxRelay.from_settings(as_process("relay")) as relay:
        assert relay.drain() >= 1

    s = as_process("engine")
    app, q = start_engine_until_rule(spark, s, tmp_path / "ckpt", f"tls-{uuid.uuid4().hex[:6]}", sid)
    try:
        feed = KafkaFeed("trades", settings=as_process("feed"))
        for c in _trades(12_000, seed=11):
            feed.send(c)
        assert feed.close(timeout=30).failed == 0
        total = sum(_end_offsets(full, full.topic_trades).values())

        def counted() -> float:
            return app.totals["events"] + app.totals["dead_letters"]

        deadline = time.monotonic() + 120
        while (app.totals["alerts"] == 0 or counted() < total) and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
    finally:
        q.stop()
        app.close()
    assert app.totals["alerts"] > 0, "no alert within 120 s"
    assert counted() == total, (app.totals, total)


# ------------------------------------------------------------------------------- SSL
@pytest.fixture(scope="module")
def ssl_kafka() -> Iterator[Settings]:
    """An embedded broker of its own in the ``ssl`` mode (TLS, no SASL, no ACLs), its topics made,
    whose TLS listener, like a user's Kafka with mutual TLS, requires a client certificate of its
    CA (``ssl.client.auth=required``; the embedded broker asks for none).  The tests connect with
    the certificate :func:`_client_cert` makes (``admin``: :func:`_mtls`)."""
    root = Path(tempfile.mkdtemp(prefix="tidewatch-ssl-test-"))
    kp = free_port()
    plain = Settings(
        run_dir=root / "run",
        cache_dir=get_settings().cache_dir,
        kafka_port=kp,
        kafka_bootstrap=f"127.0.0.1:{kp}",
        kafka_controller_port=free_port(),
        kafka_security="ssl",
    )
    tls_lines = kafka_broker._tls_lines
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kafka_broker, "_tls_lines", lambda s: [*tls_lines(s), "ssl.client.auth=required"])
        try:
            cert, key = _client_cert(kafka_broker.ensure_tls(plain), root / "client", "tidewatch-app")
            s = plain.model_copy(
                update={"kafka_ssl_certificate_location": cert, "kafka_ssl_key_location": key}
            )
            assert "ssl.client.auth=required" in kafka_broker.server_properties(s)
            kafka_broker.start(s)  # its health probe connects with the certificate
            ensure_topics(s.kafka_bootstrap, s)
            yield s
        finally:
            kafka_broker.stop(plain)
            shutil.rmtree(root, ignore_errors=True)


def _client_cert(ca_dir: Path, out: Path, name: str) -> tuple[Path, Path]:
    """A client certificate and its PKCS#8 key signed by the CA in ``ca_dir`` (``ca.pem``, ``ca.key``)."""
    out.mkdir(parents=True, exist_ok=True)
    key, csr, cert = out / f"{name}.key", out / f"{name}.csr", out / f"{name}.pem"
    for args in (
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            f"/CN={name}",
        ],
        ["x509", "-req", "-in", str(csr), "-CA", str(ca_dir / "ca.pem"), "-CAkey", str(ca_dir / "ca.key")]
        + ["-set_serial", str(uuid.uuid4().int >> 64), "-days", "2", "-out", str(cert)],
    ):
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    return cert, key


def _round_trip(s: Settings, principal: str, n: int = 50) -> tuple[dict[int, int], dict[int, int]]:
    """Produce ``n`` records to ``packets`` as ``principal`` and read them back; (start, end)."""
    topic = s.topic_packets
    start = _end_offsets(s, topic)
    p = Producer(kafka_client.librdkafka_config(s, principal, **{"enable.idempotence": True, "log_level": 0}))
    failed: list[Any] = []
    for i in range(n):
        p.produce(
            topic, key=f"k{i}".encode(), value=f"v{i}".encode(), on_delivery=lambda e, m: failed.append(e)
        )
    assert p.flush(30) == 0 and [e for e in failed if e is not None] == []
    end = _end_offsets(s, topic)
    assert sum(end.values()) - sum(start.values()) == n
    group = f"{kafka_client.ID_PREFIX[principal]}-test-{uuid.uuid4().hex[:6]}"
    c = Consumer(kafka_client.librdkafka_config(s, principal, **{"group.id": group, "log_level": 0}))
    try:
        c.assign([TopicPartition(topic, q, start[q]) for q in start])
        got, deadline = 0, time.monotonic() + 20
        while got < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
        assert got == n
    finally:
        c.close()
    return start, end


def test_ssl_mode_with_client_certificates(ssl_kafka: Settings, spark: Any, tmp_path: Path) -> None:
    """Mutual TLS: librdkafka (``ssl.certificate.location`` / ``ssl.key.location``) and Spark's
    Java client (PEM keystore in-line) connect with a certificate of the broker's CA; without a
    certificate, with one of another CA, or without the CA the broker is out of reach."""
    s = ssl_kafka
    cert, key = s.kafka_ssl_certificate_location, s.kafka_ssl_key_location
    assert kafka_client.client_config(s, "feed") == {
        "security.protocol": "SSL",
        "ssl.ca.location": str(kafka_client.embedded_ca(s)),
        "ssl.endpoint.identification.algorithm": "https",
        "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key),
    }
    start, end = _round_trip(s, "feed")
    opts = kafka_client.spark_options(s, "engine")
    assert opts["kafka.ssl.keystore.type"] == "PEM" and "kafka.ssl.keystore.location" not in opts
    rows = _spark_read(spark, s, s.topic_packets, start, end, opts)
    assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(
        (p, o) for p in end for o in range(start[p], end[p])
    )

    refused = {KafkaError._SSL, KafkaError._TRANSPORT}  # the broker ends the handshake
    no_cert = s.model_copy(update={"kafka_ssl_certificate_location": None, "kafka_ssl_key_location": None})
    assert _connect_errors(kafka_client.librdkafka_config(no_cert, "feed")) & refused
    other = tmp_path / "other-ca"
    other.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem"]
        + ["-days", "2", "-subj", "/CN=another CA"],
        cwd=other,
        check=True,
        capture_output=True,
    )
    bad_cert, bad_key = _client_cert(other, tmp_path / "theirs", "intruder")
    bad = s.model_copy(update={"kafka_ssl_certificate_location": bad_cert, "kafka_ssl_key_location": bad_key})
    assert _connect_errors(kafka_client.librdkafka_config(bad, "feed")) & refused
    no_ca = {k: v for k, v in kafka_client.librdkafka_config(s, "feed").items() if k != "ssl.ca.location"}
    assert KafkaError._SSL in _connect_errors(no_ca)
