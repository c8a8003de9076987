"""tidewatch.wire.registry against a real Confluent-compatible Schema Registry: Apicurio Registry
(``tests/tidewatch/wire/apicurio.py`` builds it from Maven Central and runs it on 127.0.0.1),
through its Confluent API and confluent-kafka's own client, serializer and deserializer.

When the registry cannot be built or started, the tests fail (an error in the session fixture, as
the container fixtures of ``tests/conftest.py``; never a skip) with the end of Maven's or the
registry's log."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime
from typing import Any

import pytest

from tests.tidewatch.wire import apicurio
from tidewatch.settings import Settings
from tidewatch.wire import avro, frame_ids, registry
from tidewatch.wire.avro import AvroDecodeError, decode, decode_batch, encode, encode_batch
from tidewatch.wire.registry import RegistryIds, fingerprint

pytestmark = pytest.mark.integration

TRADE = {
    "symbol": "AAPL",
    "ts": 1_709_564_400_123,
    "price": 171.25,
    "size": 300,
    "side": "ASK",
    "exchange": "X",
}
PACKET = {
    "ts": 1_709_564_400_456,
    "src_ip": "10.0.0.1",
    "dst_ip": "10.0.0.2",
    "src_port": 443,
    "dst_port": 51234,
    "protocol": "TCP",
    "length": 1500,
    "tcp_flags": "SA",
}


def _frame_id(payload: bytes) -> int:
    assert payload[0] == 0, "not a Confluent / Tidewatch frame"
    return int.from_bytes(payload[1:5], "big")


def _epoch_ms(record: dict[str, Any]) -> dict[str, Any]:
    """confluent-kafka's deserializer reads timestamp-millis as datetime: back to epoch ms."""
    return {k: int(v.timestamp() * 1000) if isinstance(v, datetime) else v for k, v in record.items()}


@pytest.fixture(scope="session")
def apicurio_url() -> Iterator[str]:
    """Base URL of Confluent's API of a fresh Apicurio Registry (built first if needed)."""
    with ExitStack() as stack:
        try:
            reg = stack.enter_context(apicurio.running())
        except apicurio.ApicurioBuildError as exc:
            error = str(exc)
        else:
            yield reg.url
            return
    pytest.fail(f"no Apicurio Registry to test against: {error}", pytrace=False)


@pytest.fixture()
def settings(apicurio_url: str) -> Settings:
    return Settings(schema_registry_url=apicurio_url)


@pytest.fixture()
def client(apicurio_url: str) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": apicurio_url})


@pytest.fixture()
def installed(settings: Settings) -> Iterator[RegistryIds]:
    """``registry.install`` with the registry's URL: this process's frame ids, restored after."""
    try:
        ids = registry.install(settings)
        assert isinstance(ids, RegistryIds) and frame_ids.frame_ids() is ids
        yield ids
    finally:
        frame_ids.use_frame_ids(None)


def test_every_schema_is_registered_under_its_topic_value_subject(
    installed: RegistryIds, settings: Settings, client: Any
) -> None:
    got = installed.register_all()
    assert sorted(got) == avro.schema_names()
    subjects = set(client.get_subjects())
    for name, subject in registry.subjects(settings).items():
        assert subject in subjects
        latest = client.get_latest_version(subject)
        assert latest.schema_id == got[name]
        assert fingerprint(latest.schema.schema_str) == fingerprint(avro.load_schema_json(name))
        by_id = client.get_schema(got[name])
        assert fingerprint(by_id.schema_str) == fingerprint(avro.load_schema_json(name))
        assert (by_id.schema_type or "AVRO").upper() == "AVRO"
    assert len(set(got.values())) == len(got)
    # registering again (another process: no cache) is idempotent: the same ids
    assert RegistryIds.from_settings(settings).register_all() == got


def test_records_are_framed_with_the_registry_ids_and_decode_by_them(
    installed: RegistryIds, settings: Settings, client: Any
) -> None:
    framed = encode("trades", TRADE)
    sid = _frame_id(framed)
    # the id in the frame is the one the registry holds for the subject <topic>-value
    assert client.get_latest_version(f"{settings.topic_trades}-value").schema_id == sid
    assert decode(framed) == TRADE
    assert decode(framed, "trades") == TRADE

    batch = encode_batch("trades", {k: [v, v, v] for k, v in TRADE.items()})
    assert all(_frame_id(m) == sid for m in batch.messages())
    rb, ok = decode_batch("trades", batch.messages())
    assert ok.all() and rb.to_pylist() == [TRADE] * 3

    packets = encode_batch("packets", {k: [v, v] for k, v in PACKET.items()})
    pid = _frame_id(packets[0])
    assert pid != sid
    assert client.get_latest_version(f"{settings.topic_packets}-value").schema_id == pid
    rb, ok = decode_batch("packets", packets.messages())
    assert ok.all() and rb.to_pylist() == [PACKET] * 2
    # a packet is not a trade, whatever its id
    _, ok = decode_batch("trades", packets.messages())
    assert not ok.any()

    # a reader with no cache (another process) looks the ids up in the registry
    fresh = RegistryIds.from_settings(settings)
    rb, ok = decode_batch("trades", batch.messages(), ids=fresh)
    assert ok.all() and rb.to_pylist() == [TRADE] * 3
    assert decode(packets[1], ids=fresh) == PACKET
    assert fresh.local_id(sid) == avro.schema_id("trades")
    assert fresh.local_id(pid) == avro.schema_id("packets")


def test_an_id_the_registry_does_not_know_is_undecodable(installed: RegistryIds, settings: Settings) -> None:
    body = encode("trades", TRADE)[5:]
    unknown = 987_654
    payload = b"\x00" + unknown.to_bytes(4, "big") + body
    fresh = RegistryIds.from_settings(settings)
    assert fresh.local_id(unknown) is None  # the registry's 404 is "no such id", not an error
    _, ok = decode_batch("trades", [payload], ids=fresh)
    assert not ok.any()
    with pytest.raises(AvroDecodeError, match=f"unknown schema id {unknown}"):
        decode(payload, ids=fresh)


def test_a_record_written_by_confluents_avro_serializer_decodes_in_tidewatch(
    settings: Settings, client: Any
) -> None:
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(client, avro.load_schema_json("trades"))
    ctx = SerializationContext(settings.topic_trades, MessageField.VALUE)
    payloads = [serializer(TRADE, ctx), serializer({**TRADE, "symbol": "MSFT", "size": 7}, ctx)]
    sid = _frame_id(payloads[0])
    assert _frame_id(payloads[1]) == sid
    assert client.get_latest_version(f"{settings.topic_trades}-value").schema_id == sid

    ids = RegistryIds.from_settings(settings)  # no cache: the id is looked up
    rb, ok = decode_batch("trades", payloads, ids=ids)
    assert ok.all()
    assert rb.to_pylist() == [TRADE, {**TRADE, "symbol": "MSFT", "size": 7}]
    assert decode(payloads[0], "trades", ids=ids) == TRADE
    # and with the ids installed for the process, as tidewatch.cli does
    try:
        registry.install(settings)
        rb, ok = decode_batch("trades", payloads)
        assert ok.all() and rb.num_rows == 2
    finally:
        frame_ids.use_frame_ids(None)


def test_a_record_tidewatch_wrote_is_read_by_confluents_avro_deserializer(
    installed: RegistryIds, settings: Settings, client: Any
) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserializer = AvroDeserializer(client)  # the writer schema comes from the registry by id
    ctx = SerializationContext(settings.topic_trades, MessageField.VALUE)
    assert _epoch_ms(deserializer(encode("trades", TRADE), ctx)) == TRADE
    batch = encode_batch("trades", {k: [v, v] for k, v in TRADE.items()})
    assert [_epoch_ms(deserializer(m, ctx)) for m in batch.messages()] == [TRADE, TRADE]
    # with our schema as the reader schema too
    reader = AvroDeserializer(client, avro.load_schema_json("packets"))
    pctx = SerializationContext(settings.topic_packets, MessageField.VALUE)
    assert _epoch_ms(reader(encode("packets", PACKET), pctx)) == PACKET
