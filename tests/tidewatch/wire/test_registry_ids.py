"""tidewatch.wire.registry / frame_ids: records framed with a Schema Registry's ids (a stand-in
client here, with the two calls confluent-kafka's SchemaRegistryClient makes; the real registry
is in test_registry_apicurio.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tidewatch.settings import Settings
from tidewatch.wire import avro, frame_ids, registry
from tidewatch.wire.avro import AvroDecodeError, decode, decode_batch, encode, encode_batch
from tidewatch.wire.registry import RegistryIds, SchemaRegistryError, fingerprint

TRADE = {
    "symbol": "AAPL",
    "ts": 1_709_564_400_123,
    "price": 171.25,
    "size": 300,
    "side": "ASK",
    "exchange": "X",
}


class _NotFound(Exception):
    http_status_code = 404


class _Schema:
    def __init__(self, text: str, kind: str = "AVRO") -> None:
        self.schema_str, self.schema_type = text, kind


class FakeRegistry:
    """Ids from ``first`` on, one per distinct schema text, as a registry gives them."""

    def __init__(self, first: int = 1) -> None:
        self.by_id: dict[int, _Schema] = {}
        self.next = first
        self.calls = 0
        self.down = False

    def register_schema(self, subject: str, schema: Any) -> int:
        self.calls += 1
        if self.down:
            raise ConnectionError("connection refused")
        for sid, s in self.by_id.items():
            if s.schema_str == schema.schema_str:
                return sid
        sid, self.next = self.next, self.next + 1
        self.by_id[sid] = _Schema(schema.schema_str, schema.schema_type)
        return sid

    def get_schema(self, schema_id: int) -> _Schema:
        self.calls += 1
        if self.down:
            raise ConnectionError("connection refused")
        if schema_id not in self.by_id:
            raise _NotFound(f"schema {schema_id} not found")
        return self.by_id[schema_id]


def _ids(client: FakeRegistry) -> RegistryIds:
    return RegistryIds(client, registry.subjects(Settings()))  # type: ignore[arg-type]


@pytest.fixture()
def installed() -> Iterator[tuple[FakeRegistry, RegistryIds]]:
    client = FakeRegistry(first=3)  # 3: registry.json's id of alerts, so the ids collide
    ids = _ids(client)
    frame_ids.use_frame_ids(ids)
    try:
        yield client, ids
    finally:
        frame_ids.use_frame_ids(None)


def test_the_setting_defaults_to_registry_json_ids() -> None:
    assert Settings().schema_registry_url is None
    assert registry.install(Settings()) is None
    assert frame_ids.frame_ids() is frame_ids.LOCAL_IDS
    assert encode("trades", TRADE)[1:5] == avro.schema_id("trades").to_bytes(4, "big")


def test_install_from_settings_makes_registry_ids_current() -> None:
    try:
        ids = registry.install(Settings(schema_registry_url="http://127.0.0.1:1"))
        assert isinstance(ids, RegistryIds)
        assert frame_ids.frame_ids() is ids
        assert ids.subject_of["alerts"] == "alerts-value"
    finally:
        frame_ids.use_frame_ids(None)


def test_records_are_framed_with_the_registry_id_and_decode_by_it(
    installed: tuple[FakeRegistry, RegistryIds],
) -> None:
    client, ids = installed
    framed = encode("trades", TRADE)
    sid = int.from_bytes(framed[1:5], "big")
    assert sid == 3 and client.by_id[3].schema_str == avro.load_schema_json("trades")
    assert decode(framed) == TRADE
    batch = encode_batch("trades", {k: [v, v] for k, v in TRADE.items()})
    assert all(m[1:5] == framed[1:5] for m in batch.messages())
    rb, ok = decode_batch("trades", batch.messages())
    assert ok.all() and rb.to_pylist() == [TRADE, TRADE]
    # the same bytes read with registry.json's ids: 3 is alerts there, so not a trade
    rb, ok = decode_batch("trades", batch.messages(), ids=frame_ids.LOCAL_IDS)
    assert not ok.any()
    with pytest.raises(AvroDecodeError):
        decode(framed, "trades", ids=frame_ids.LOCAL_IDS)


def test_an_id_registered_by_another_producer_is_looked_up_once_and_matched_by_fingerprint() -> None:
    client = FakeRegistry(first=100)
    # another producer registered our trades schema, reformatted (same canonical form), as id 100
    other = json.dumps(avro.load_schema("trades"), indent=2, sort_keys=True)
    assert client.register_schema("trades-value", _Schema(other)) == 100
    ids = _ids(client)
    local = frame_ids.LOCAL_IDS
    payload = (
        b"\x00"
        + (100).to_bytes(4, "big")
        + encode(
            "trades",
            TRADE,
        )[5:]
    )
    calls = client.calls
    rb, ok = decode_batch("trades", [payload] * 50 + [encode("trades", TRADE)], ids=ids)
    assert ok.tolist() == [True] * 50 + [False]  # registry.json's id 1 is no id of this registry
    assert rb.to_pylist() == [TRADE] * 50
    assert client.calls == calls + 2  # ids 100 and 1, each asked once
    decode_batch("trades", [payload], ids=ids)
    assert client.calls == calls + 2
    assert ids.local_id(100) == avro.schema_id("trades") and local.local_id(100) is None


def test_unknown_ids_and_foreign_schemas_are_undecodable() -> None:
    client = FakeRegistry(first=7)
    foreign = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "long"}]}
    client.register_schema("x-value", _Schema(json.dumps(foreign)))
    client.register_schema("y-value", _Schema('{"type": "string"}', "JSON"))
    ids = _ids(client)
    body = encode("trades", TRADE)[5:]
    for sid in (7, 8, 99):
        assert ids.local_id(sid) is None
        _, ok = decode_batch("trades", [b"\x00" + sid.to_bytes(4, "big") + body], ids=ids)
        assert not ok.any()
        with pytest.raises(AvroDecodeError, match=f"unknown schema id {sid}"):
            decode(b"\x00" + sid.to_bytes(4, "big") + body, ids=ids)


def test_a_registry_that_cannot_be_reached_raises_instead_of_dead_lettering() -> None:
    client = FakeRegistry()
    client.down = True
    ids = _ids(client)
    with pytest.raises(SchemaRegistryError):
        ids.write_id("alerts")
    with pytest.raises(SchemaRegistryError):
        decode_batch("trades", [b"\x00\x00\x00\x00\x05abc"], ids=ids)


def test_fingerprints_ignore_formatting_and_docs_but_not_fields() -> None:
    s = avro.load_schema("trades")
    assert fingerprint(json.dumps(s)) == fingerprint({**s, "doc": "another doc"})
    changed = {**s, "fields": s["fields"][:-1]}
    assert fingerprint(changed) != fingerprint(s)
    assert set(registry.local_fingerprints().values()) == set(avro.local_schema_ids())


def test_accepted_ids_reads_frame_ids_column_wise() -> None:
    client = FakeRegistry(first=40)
    ids = _ids(client)
    sid = ids.write_id("packets")
    payloads = [b"", b"\x01\x00\x00\x00\x28", b"\x00\x00\x00\x00", b"\x00" + sid.to_bytes(4, "big") + b"x"]
    data = np.frombuffer(b"".join(payloads), np.uint8)
    ends = np.cumsum([len(p) for p in payloads])
    starts = ends - np.array([len(p) for p in payloads])
    assert frame_ids.accepted_ids("packets", data, starts, ends, ids).tolist() == [sid]
    assert frame_ids.accepted_ids("trades", data, starts, ends, ids).tolist() == []
