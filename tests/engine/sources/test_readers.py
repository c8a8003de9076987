"""The engine's record tables and offset logs (``engine.sources.readers``), no broker: the table
the restart replay builds from confluent-kafka messages has the shape of Spark's ``toArrow()``,
and a batch's offset log is the first and last offset of each partition it holds."""

from __future__ import annotations

from dataclasses import dataclass

from engine.sources.readers import RECORD_COLUMNS, offset_ranges, records_table


@dataclass
class Message:
    """The getters of a confluent-kafka ``Message`` that :func:`records_table` reads."""

    t: str
    p: int
    o: int
    ts: int
    k: bytes | None
    v: bytes | None

    def topic(self) -> str:
        return self.t

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def timestamp(self) -> tuple[int, int]:
        return 1, self.ts  # (TIMESTAMP_CREATE_TIME, epoch ms)

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v


MSGS = [
    Message("trades", 1, 7, 1_000, b"AAPL", b"\x00\x01"),
    Message("trades", 0, 3, 1_001, None, b""),
    Message("trades", 1, 9, 1_002, b"", None),
    Message("subscriptions", 0, 0, 1_003, b"s1", b"{}"),
    Message("trades", 0, 4, 1_004, b"MSFT", b"\x02"),
]


def test_records_table_has_the_columns_of_sparks_kafka_source() -> None:
    tbl = records_table(MSGS)
    assert tbl.column_names == RECORD_COLUMNS
    assert tbl.column("topic").to_pylist() == [m.t for m in MSGS]
    assert tbl.column("partition").to_pylist() == [m.p for m in MSGS]
    assert tbl.column("offset").to_pylist() == [m.o for m in MSGS]
    assert tbl.column("timestamp").to_pylist() == [m.ts for m in MSGS]
    assert tbl.column("key").to_pylist() == [m.k for m in MSGS]  # null and empty kept apart
    assert tbl.column("value").to_pylist() == [m.v for m in MSGS]


def test_offset_ranges_are_the_first_and_last_offset_of_each_partition() -> None:
    assert offset_ranges(records_table(MSGS)) == {
        "trades": {"0": [3, 4], "1": [7, 9]},
        "subscriptions": {"0": [0, 0]},
    }
    assert offset_ranges(records_table([])) == {}
