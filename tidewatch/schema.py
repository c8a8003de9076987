"""The streams a rule can read, and their fields (RULES.md, "Meaning" / "Fields").

Every field is present on every event (a CSV row with a missing or ill-typed value is
malformed and skipped), so field values are never NULL; NULLs only arise from aggregates
over empty sets and from division by zero.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the largest magnitude a numeric field may have; events beyond it are malformed (dead letter,
#: skipped CSV row): every integer up to it is a float64, and window sums of such values are exact
#: (engine.algorithms.fixed128)
MAX_NUMERIC = 2**53

#: why a CSV line is skipped, in the words both readers (the feed's ``tidewatch.wire.csv_io`` and the
#: backtest's ``engine.evaluation.backtest``) report: one row is one line, and a line is text
CSV_UNBALANCED_QUOTE = "unbalanced quote (a quoted field must close on its own line)"
CSV_NOT_UTF8 = "not UTF-8 text"


@dataclass(frozen=True)
class FieldSpec:
    """One field of a stream."""

    name: str
    type: str  # "str" | "int" | "float"
    non_negative: bool = False
    #: closed set of allowed values (string enums such as trades.side), or None
    values: tuple[str, ...] | None = None
    #: a typical per-event value: ranks indexable atoms (compiler.choose_driver) and is the unit
    #: of CI-SUM over the field (evaluator)
    typical: float = 1.0

    @property
    def numeric(self) -> bool:
        return self.type in ("int", "float")


@dataclass(frozen=True)
class StreamSpec:
    """A stream: its fields, and which of them may serve as the GROUP BY key."""

    name: str
    fields: dict[str, FieldSpec]
    keys: tuple[str, ...]


def _fields(*specs: FieldSpec) -> dict[str, FieldSpec]:
    return {f.name: f for f in specs}


TRADES = StreamSpec(
    "trades",
    _fields(
        FieldSpec("symbol", "str"),
        FieldSpec("ts", "int", non_negative=True),
        FieldSpec("price", "float", typical=100.0),
        FieldSpec("size", "int", non_negative=True, typical=100.0),
        FieldSpec("side", "str", values=("BID", "ASK", "UNKNOWN")),
        FieldSpec("exchange", "str"),
    ),
    keys=("symbol",),
)

PACKETS = StreamSpec(
    "packets",
    _fields(
        FieldSpec("ts", "int", non_negative=True),
        FieldSpec("src_ip", "str"),
        FieldSpec("dst_ip", "str"),
        FieldSpec("src_port", "int", non_negative=True, typical=30000.0),
        FieldSpec("dst_port", "int", non_negative=True, typical=1000.0),
        FieldSpec("protocol", "str"),
        FieldSpec("length", "int", non_negative=True, typical=500.0),
        FieldSpec("tcp_flags", "str"),
    ),
    keys=("src_ip", "dst_ip"),
)

STREAMS: dict[str, StreamSpec] = {"trades": TRADES, "packets": PACKETS}
