"""The batch encoder of the engine's Kafka output gives, byte for byte, the records the per-alert
fastavro path produced (:func:`engine.sinks.publish._produce_alerts_per_record`), for alerts and for
alert rows read back from PostgreSQL."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from engine.messages import Alert
from engine.sinks.alert_wire import encode_alerts
from engine.sinks.publish import _alert_record
from tidewatch.wire.avro import decode, encode


def _reference(alerts: list[Any], batch_id: int, now: int) -> list[list[Any]]:
    """What the old loop handed to ``produce``, alert by alert (its own encoding code)."""
    ak, av, rk, rv, present = [], [], [], [], []
    for a in alerts:
        rec = _alert_record(a, batch_id, now)
        ak.append(rec["subscription_id"].encode())
        av.append(encode("alerts", rec))
        rk.append(f"{rec['subscription_id']}|{rec['key']}".encode())
        present.append(rec["kind"] == "ENTER")
        res = {k: rec[k] for k in ("subscription_id", "key", "as_of", "values")}
        rv.append(encode("results", {**res, "present": present[-1], "batch_id": batch_id}))
    return [ak, av, rk, rv, present]


def _alerts(n: int, seed: int = 0) -> list[Alert]:
    rng = random.Random(seed)
    subs = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(50)] + ["non-uuid", "sübscription"]
    labels = ["COUNT(*) OVER LAST 10 SECONDS", "SUM(size) OVER LAST 20 SECONDS", 'é|"x"', ""]
    out = []
    for i in range(n):
        s = rng.randrange(len(subs))
        values: dict[str, Any] = {}
        for j in range(rng.randrange(4)):
            v = rng.choice([None, rng.randrange(10**6), rng.uniform(-1e9, 1e9), 0.0, -0.0, float("nan")])
            values[labels[(s + j) % len(labels)]] = v
        key = rng.choice(["AAPL", "", "10.0.0.1", "k|ey", "ünï\n", "x" * 200])
        out.append(
            Alert(subs[s], f"rule {s}" * (s % 3), rng.choice(["trades", "packets"]), key,
                  rng.choice(["ENTER", "EXIT"]), 1_763_900_000_000 + 1000 * i, values)
        )  # fmt: skip
    out.append(
        Alert("a", "r", "trades", "k", "ENTER", -1, {"big": 2**60 + 1, "flag": True, "inf": float("inf")})
    )
    out.append(Alert("b", "", "", "k", "EXIT", 0, {}))
    return out


@pytest.mark.parametrize("n", [1, 7, 3000])
def test_the_batch_encoding_is_the_per_alert_encoding_byte_for_byte(n: int) -> None:
    alerts = _alerts(n, seed=n)
    got = encode_alerts(alerts, 42, 1_763_900_123_456)
    want = _reference(alerts, 42, 1_763_900_123_456)
    assert [got.alert_keys, got.alert_values, got.result_keys, got.result_values, got.present] == want
    assert len(got) == len(alerts)
    assert decode(got.alert_values[0], "alerts")["id"] == alerts[0].id


def test_alert_rows_read_back_from_postgres_encode_the_same() -> None:
    """The recovery path publishes rows of ``Store.alerts_of_batch`` (dicts; no rule or stream)."""
    rows = [
        {"id": a.id, "subscription_id": a.subscription_id, "key": a.key, "kind": a.kind, "as_of": a.as_of,
         "values": dict(a.values)}
        for a in _alerts(200, seed=5)
    ]  # fmt: skip
    rows[3]["values"] = None
    got = encode_alerts(rows, 7, 99)
    assert [got.alert_keys, got.alert_values, got.result_keys, got.result_values, got.present] == _reference(
        rows, 7, 99
    )


def test_empty_batch_and_a_missing_field() -> None:
    assert len(encode_alerts([], 1, 2)) == 0
    with pytest.raises(ValueError, match="missing"):
        encode_alerts([{"id": None, "subscription_id": "s", "key": "k", "kind": "ENTER", "as_of": 1}], 1, 2)


def test_each_label_is_written_where_it_belongs_a_missing_one_as_empty() -> None:
    """The kernel writes each distinct label once per batch and copies it per entry: every
    entry gets its own label back, and a missing (null) label stays an empty one, as before."""
    alerts = [
        Alert("s", "r", "trades", "k", "ENTER", 1, {"b": 1.0, None: 2.0, "a": None}),  # type: ignore[dict-item]
        Alert("s", "r", "trades", "k", "EXIT", 2, {"a": 3.0, "b": None}),
    ]
    got = encode_alerts(alerts, 1, 2)
    assert [decode(v, "alerts")["values"] for v in got.alert_values] == [
        {"b": 1.0, "": 2.0, "a": None},
        {"a": 3.0, "b": None},
    ]
    assert [decode(v, "results")["values"] for v in got.result_values] == [
        {"b": 1.0, "": 2.0, "a": None},
        {"a": 3.0, "b": None},
    ]


def test_the_encoders_buffers_are_kept_but_not_a_storms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch after batch the records are the same bytes in kept buffers; a buffer past
    ``KEEP_MAX_BYTES`` (an alert storm's) is not kept for the next batch."""
    from engine.sinks import alert_wire

    alerts = [
        Alert(f"s{i % 3}", "r", "trades", f"k{i}", "ENTER" if i % 2 else "EXIT", i, {"v": i * 0.5})
        for i in range(300)
    ]
    first = alert_wire.encode_alerts(alerts, 1, 5)
    again = alert_wire.encode_alerts(alerts[:7], 1, 5)  # a smaller batch in the same buffers
    assert again.alert_values == first.alert_values[:7] and again.result_values == first.result_values[:7]
    assert alert_wire.encode_alerts(alerts, 1, 5).alert_values == first.alert_values
    monkeypatch.setattr(alert_wire, "KEEP_MAX_BYTES", 1024)
    monkeypatch.setattr(alert_wire, "_FREE", [])
    alert_wire.encode_alerts(alerts, 1, 5)
    assert alert_wire._FREE and all(v.nbytes <= 1024 for v in alert_wire._FREE[0].values())
