"""The streams a rule can read, their fields, and each field's domain (RULES.md, "Meaning" / "Fields").

Every field is present on every event (a CSV row with a missing or ill-typed value is
malformed and skipped), so field values are never NULL; NULLs only arise from aggregates
over empty sets and from division by zero.

**Domains.**  Each :class:`FieldSpec` states the values its field may take -- written here once
and checked by every reader of events: the engine's decoder (``engine.decode``: dead letter
``invalid``), the feeds' CSV reader (``tidewatch.wire.csv_io``: bad line) and the backtest's
(``engine.evaluation.backtest``: malformed row), all through :func:`valid` /
:func:`valid_strings` and :func:`violation`, column-wise.  A number is always finite and at
most :data:`MAX_NUMERIC` in magnitude, and within ``low``/``high``; a string is in ``values``
when the field has a closed set, and not empty unless ``empty_ok``.  The table is in
docs/engine.md, "Dead letters".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: the largest magnitude a numeric field may have; events beyond it are malformed (dead letter,
#: skipped CSV row): every integer up to it is a float64, and window sums of such values are exact
#: (engine.algorithms.fixed128)
MAX_NUMERIC = 2**53

#: why a CSV line is skipped, in the words both readers (the feed's ``tidewatch.wire.csv_io`` and the
#: backtest's ``engine.evaluation.backtest``) report: one row is one line, and a line is text
CSV_UNBALANCED_QUOTE = "unbalanced quote (a quoted field must close on its own line)"
CSV_NOT_UTF8 = "not UTF-8 text"


#: the TCP flag letters in the order a capture lists them (bit 0 = FIN ... bit 7 = CWR, ingest/pcap.py)
TCP_FLAG_LETTERS = "FSRPAUEC"
#: every value of packets.tcp_flags: the letters of the flags set, in TCP_FLAG_LETTERS order
TCP_FLAGS: tuple[str, ...] = tuple(
    "".join(ch for bit, ch in enumerate(TCP_FLAG_LETTERS) if v >> bit & 1) for v in range(256)
)
_NAMED_PROTOCOLS = {1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6"}
#: every value of packets.protocol: the four named IP protocols, ``IP-<n>`` for the other numbers
PROTOCOLS: tuple[str, ...] = ("TCP", "UDP", "ICMP", "ICMPv6") + tuple(
    f"IP-{p}" for p in range(256) if p not in _NAMED_PROTOCOLS
)
MAX_PORT = 65535
#: the largest IP packet length a header can state: IPv6's 16-bit payload length + its 40-byte header
MAX_PACKET_LENGTH = 65535 + 40


@dataclass(frozen=True)
class FieldSpec:
    """One field of a stream, with its domain (the values an event may carry)."""

    name: str
    type: str  # "str" | "int" | "float"
    #: the compiler may serve SUM over the field by a collective index (its values are >= 0)
    non_negative: bool = False
    #: closed set of allowed values (string enums such as trades.side), or None
    values: tuple[str, ...] | None = None
    #: a typical per-event value: ranks indexable atoms (compiler.choose_driver) and is the unit
    #: of CI-SUM over the field (evaluator)
    typical: float = 1.0
    #: numbers: the smallest allowed value (None: -MAX_NUMERIC); ``low_open``: ``low`` itself is not
    low: int | None = None
    low_open: bool = False
    #: numbers: the largest allowed value (None: MAX_NUMERIC)
    high: int | None = None
    #: strings: whether "" is allowed
    empty_ok: bool = False
    #: how messages name a long closed set (else "one of" its values)
    values_text: str | None = None

    @property
    def numeric(self) -> bool:
        return self.type in ("int", "float")

    @property
    def bounds(self) -> tuple[int, int]:
        """``(low, high)`` with the defaults applied (always within +-MAX_NUMERIC)."""
        lo = -MAX_NUMERIC if self.low is None else max(self.low, -MAX_NUMERIC)
        hi = MAX_NUMERIC if self.high is None else min(self.high, MAX_NUMERIC)
        return lo, hi

    @property
    def domain(self) -> str:
        """The domain in words, e.g. ``> 0 and <= 2**53``, ``in 0..65535``, ``one of BID, ASK, UNKNOWN``."""
        if self.numeric:
            lo, hi = self.bounds
            finite = "a finite number " if self.type == "float" else "an integer "
            if self.low_open:
                return f"{finite}> {lo} and <= {_num_text(hi)}"
            return f"{finite}in {_num_text(lo)}..{_num_text(hi)}"
        if self.values is not None:
            return self.values_text or "one of " + ", ".join(v or "''" for v in self.values)
        return "any string" if self.empty_ok else "a non-empty string"


def _num_text(v: int) -> str:
    return "2**53" if v == MAX_NUMERIC else "-2**53" if v == -MAX_NUMERIC else str(v)


def valid(f: FieldSpec, v: np.ndarray) -> np.ndarray:
    """Which values of the numeric field ``f`` lie in its domain (a boolean mask; NaN and
    infinities never do).  Vectorized: a few comparisons over the column."""
    lo, hi = f.bounds
    v = np.asarray(v)
    with np.errstate(invalid="ignore"):
        ok = np.asarray((v > lo) if f.low_open else (v >= lo), np.bool_)
        ok &= v <= hi
    if v.dtype.kind == "f":
        ok &= np.isfinite(v)
    return ok


def valid_strings(f: FieldSpec, values: Sequence[str] | np.ndarray) -> np.ndarray:
    """Which of ``values`` (typically the distinct values of a dictionary-encoded column, whose
    codes then index the mask) lie in the domain of the string field ``f``."""
    arr = np.asarray(values, dtype=object)
    if f.values is not None:
        allowed = set(f.values)
        return np.fromiter((x in allowed for x in arr), np.bool_, len(arr))
    if f.empty_ok:
        return np.ones(len(arr), np.bool_)
    return arr != ""


def value_text(v: object) -> str:
    """A field value as messages show it: ``-1e+12``, ``5``, ``'SIDEWAYS'``."""
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, float | np.floating):
        g = f"{float(v):g}"
        return g if float(g) == v else repr(float(v))
    return str(int(v))  # type: ignore[call-overload]


def violation(f: FieldSpec, v: object) -> str:
    """Why the value ``v`` of field ``f`` is outside its domain, naming the field and the rule it
    breaks: ``price -1e+12 is not > 0``, ``side 'SIDEWAYS' is not one of BID, ASK, UNKNOWN``."""
    shown = f"{f.name} {value_text(v)} is not"
    if not f.numeric:
        if v == "" and not f.empty_ok and f.values is None:
            return f"{f.name} is empty (it must not be)"
        return f"{shown} {f.domain}"
    x = v.item() if isinstance(v, np.generic) else v  # an int stays exact (2**53 + 1 > 2**53)
    lo, hi = f.bounds
    if not np.isfinite(float(x)):  # type: ignore[arg-type]
        return f"{shown} a finite number"
    if f.low_open and not x > lo:  # type: ignore[operator]
        return f"{shown} > {_num_text(lo)}"
    if x < lo:  # type: ignore[operator]
        return f"{shown} >= {_num_text(lo)}"
    if x > hi:  # type: ignore[operator]
        return f"{shown} <= {_num_text(hi)}"
    return f"{shown} {f.domain}"


def violations(f: FieldSpec, v: np.ndarray) -> np.ndarray:
    """:func:`violation` of each value of ``v`` (an object array), worded once per distinct value."""
    v = np.asarray(v)
    if not len(v):
        return np.zeros(0, dtype=object)
    uniq, inverse = np.unique(v, return_inverse=True)
    return np.array([violation(f, u) for u in uniq.tolist()], dtype=object)[inverse.reshape(-1)]


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
        FieldSpec("ts", "int", non_negative=True, low=0),
        FieldSpec("price", "float", typical=100.0, low=0, low_open=True),
        FieldSpec("size", "int", non_negative=True, typical=100.0, low=0),
        FieldSpec("side", "str", values=("BID", "ASK", "UNKNOWN")),
        FieldSpec("exchange", "str"),
    ),
    keys=("symbol",),
)

PACKETS = StreamSpec(
    "packets",
    _fields(
        FieldSpec("ts", "int", non_negative=True, low=0),
        FieldSpec("src_ip", "str"),
        FieldSpec("dst_ip", "str"),
        FieldSpec("src_port", "int", non_negative=True, typical=30000.0, low=0, high=MAX_PORT),
        FieldSpec("dst_port", "int", non_negative=True, typical=1000.0, low=0, high=MAX_PORT),
        FieldSpec(
            "protocol",
            "str",
            values=PROTOCOLS,
            values_text="one of TCP, UDP, ICMP, ICMPv6, IP-<n> (the other IP protocol numbers n)",
        ),
        FieldSpec("length", "int", non_negative=True, typical=500.0, low=0, high=MAX_PACKET_LENGTH),
        FieldSpec(
            "tcp_flags",
            "str",
            values=TCP_FLAGS,
            empty_ok=True,
            values_text=f"TCP flag letters in the order {TCP_FLAG_LETTERS}, each at most once (or '')",
        ),
    ),
    keys=("src_ip", "dst_ip"),
)

STREAMS: dict[str, StreamSpec] = {"trades": TRADES, "packets": PACKETS}
