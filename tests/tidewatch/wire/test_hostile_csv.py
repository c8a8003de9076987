"""Malformed and hostile CSV rows (issue "Reliability and security", bad input).

Two readers take the backtest contract's CSV files (RULES.md): the feeds' ``tidewatch.wire.csv_io``
(``tidewatch feed trades FILE``) and the backtest's ``engine.evaluation.backtest.load_events``.
``tests/tidewatch/wire/test_csv_io.py`` covers wrong field counts, bad ts / size / side / price, an empty
symbol, a missing header field and a blank line for the feed reader.

Added here, for both readers: one hostile file with every kind of bad row we could think of and
the exact line numbers that must be reported (and the exact rows that must come through), plus
the shapes that break CSV parsers (a quoted line break, an unbalanced quote, raw bytes, bytes
that are not UTF-8).  Both readers survive them all (fixed after this file found them) and
report the same lines, the empty symbol included.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from engine.evaluation.backtest import BacktestInputError, load_events
from tidewatch.schema import CSV_NOT_UTF8, CSV_UNBALANCED_QUOTE
from tidewatch.wire.csv_io import CsvError, CsvReport, read_csv_chunks

HEADER = b"symbol,ts,price,size,side,exchange\n"

#: (line bytes, is it bad?) -- line 1 is the header
ROWS: list[tuple[bytes, bool]] = [
    (b"AAPL,1000,10.5,5,BID,NASDAQ", False),
    (b"AAPL,99999999999999999999,10.5,5,BID,NASDAQ", True),  # ts overflows int64
    (b"AAPL,1002,inf,5,BID,NASDAQ", True),
    (b"AAPL,1003,1e999,5,BID,NASDAQ", True),  # overflows to inf
    (b"AAPL,1004,nan,5,BID,NASDAQ", True),
    (b"AAPL,1005,10.5,-1,BID,NASDAQ", True),
    (b"AAPL,1006,10.5,5,SELL,NASDAQ", True),
    (b",1007,10.5,5,BID,NASDAQ", True),  # empty symbol
    (b"AAPL;1008;10.5;5;BID;NASDAQ", True),  # wrong separator
    (b"AAPL,1009,10.5,5,BID,NASDAQ,", True),  # one field too many
    (b"AAPL,1010,10.5,5,BID", True),  # one too few
    (b"AAPL,1011,10.5,5,BID,NASDAQ", False),
    (b'"AA,PL",1012,10.5,5,BID,NASDAQ', False),  # quoted comma: a legal CSV field
    (b'"AA""PL",1013,10.5,5,BID,NASDAQ', False),  # escaped quote
    ("Ä€😀,1014,10.5,5,BID,NASDAQ".encode(), False),  # non-ASCII symbol
    (b"AA\tPL,1015,10.5,5,BID,NASDAQ", False),  # a tab is just a character
    (b"AAPL,1016,0x10,5,BID,NASDAQ", True),  # hex price
    (b"AAPL,1017,10.5,5,BID,NASDAQ", False),
    (b"AAPL,1018,10.5,5.5,BID,NASDAQ", True),  # fractional size
    (b"AAPL,1019,10.5,5,BID,NASDAQ", False),
    (b"AAPL,1020,10.5,9007199254740994,BID,NASDAQ", True),  # size above 2**53: sums not exact
    (b"AAPL,1021,1e17,5,BID,NASDAQ", True),  # price above 2**53
    (b"AAPL,1022,10.5,9007199254740992,BID,NASDAQ", False),  # 2**53 itself is fine
]
BAD_LINES = [i + 2 for i, (_, bad) in enumerate(ROWS) if bad]
GOOD_TS = [1000, 1011, 1012, 1013, 1014, 1015, 1017, 1019, 1022]
GOOD_SYMBOLS = ["AAPL", "AAPL", "AA,PL", 'AA"PL', "Ä€😀", "AA\tPL", "AAPL", "AAPL", "AAPL"]


def _file(rows: list[bytes], header: bytes = HEADER, end: bytes = b"\n") -> bytes:
    return header + b"".join(r + end for r in rows)


def _feed(data: bytes, chunk_lines: int = 200_000) -> tuple[pd.DataFrame, CsvReport]:
    rep = CsvReport("hostile.csv")
    chunks = list(read_csv_chunks(io.BytesIO(data), "trades", report=rep, chunk_lines=chunk_lines))
    ts = [int(t) for c in chunks for t in c["ts"]]
    sym = [c["symbol"].values[k] for c in chunks for k in c["symbol"].codes]
    return pd.DataFrame({"ts": ts, "symbol": sym}), rep


def _backtest(tmp_path: Path, data: bytes) -> tuple[pd.DataFrame, list[int]]:
    p = tmp_path / "hostile.csv"
    p.write_bytes(data)
    f = load_events("trades", p)
    return pd.DataFrame({"ts": f.cols["ts"].tolist(), "symbol": list(f.cols["symbol"])}), [
        line for line, _ in f.malformed
    ]


def test_the_hostile_file_has_what_it_claims() -> None:
    assert len(BAD_LINES) == 14 and len(GOOD_TS) == 9 == len(ROWS) - len(BAD_LINES)


@pytest.mark.parametrize("chunk_lines", [1, 3, 200_000])
@pytest.mark.parametrize("end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_feed_reader_reports_each_hostile_line_and_passes_the_rest(chunk_lines: int, end: bytes) -> None:
    df, rep = _feed(_file([r for r, _ in ROWS], end=end), chunk_lines)
    assert [b.line for b in rep.bad_lines] == BAD_LINES
    assert rep.bad == len(BAD_LINES) and rep.rows == len(GOOD_TS)
    assert df.ts.tolist() == GOOD_TS
    assert df.symbol.tolist() == GOOD_SYMBOLS


EMPTY_SYMBOL_LINE = 9


def test_backtest_reader_reports_the_same_lines(tmp_path: Path) -> None:
    """The backtest's own reader, same file: the same bad lines, the same rows through."""
    df, bad = _backtest(tmp_path, _file([r for r, _ in ROWS]))
    assert bad == BAD_LINES
    assert sorted(df.ts.tolist()) == sorted(GOOD_TS)


def test_backtest_reader_refuses_an_empty_symbol_like_the_engine(tmp_path: Path) -> None:
    _, bad = _backtest(tmp_path, _file([r for r, _ in ROWS]))
    assert EMPTY_SYMBOL_LINE in bad


@pytest.mark.parametrize(
    "data",
    [b"", HEADER, b"\xef\xbb\xbf" + HEADER + b"AAPL,1000,10.5,5,BID,NASDAQ\n"],
    ids=["empty-file", "header-only", "utf8-bom"],
)
def test_feed_reader_edge_files(data: bytes) -> None:
    if not data:
        with pytest.raises(CsvError, match="empty file"):
            _feed(data)
        return
    df, rep = _feed(data)
    assert rep.bad == 0 and len(df) == (1 if b"AAPL" in data else 0)


# ---------------------------------------------------------------- what breaks CSV parsers
GOOD = b"AAPL,1000,10.5,5,BID,NASDAQ"
BREAKERS = {
    "quoted-line-break": [GOOD, b'"AA\nPL",1001,10.5,5,BID,NASDAQ', GOOD],
    "unbalanced-quote": [GOOD, b'"AAPL,1001,10.5,5,BID,NASDAQ', GOOD, GOOD],
    "all-256-bytes": [GOOD, bytes(b for b in range(256) if b not in (10, 13)), GOOD],
    "not-utf8": [GOOD, b"\xff\xfeAAPL,1001,10.5,5,BID,NASDAQ", GOOD],
    # not UTF-8 *and* the wrong field count: Arrow's bad-row handler gets the row as text
    "not-utf8-too-few-fields": [GOOD, b"\xff\xfe,1", GOOD],
    "not-utf8-too-many-fields": [GOOD, b"AAPL,1001,10.5,5,BID,NAS\xffDAQ,x", GOOD],
}
#: the lines each breaker must be reported at (header is line 1), every other row read
BREAKER_LINES = {
    "quoted-line-break": [3, 4],
    "unbalanced-quote": [3],
    "all-256-bytes": [3],
    "not-utf8": [3],
    "not-utf8-too-few-fields": [3],
    "not-utf8-too-many-fields": [3],
}


@pytest.mark.parametrize("name", list(BREAKERS))
def test_feed_reader_survives_lines_that_break_csv_parsers(name: str) -> None:
    """Each breaker is reported at its own line(s); every good row comes through, none swallowed."""
    rows = BREAKERS[name]
    df, rep = _feed(_file(rows))
    assert [b.line for b in rep.bad_lines] == BREAKER_LINES[name]
    assert df.ts.tolist() == [1000] * sum(r == GOOD for r in rows)
    if "quote" in name:  # both halves of a split row
        assert all(b.reason == CSV_UNBALANCED_QUOTE for b in rep.bad_lines)
    if name.startswith("not-utf8"):  # reported, never read with replacement characters
        assert [b.reason for b in rep.bad_lines] == [CSV_NOT_UTF8]


@pytest.mark.parametrize("name", list(BREAKERS))
def test_both_readers_give_a_breaker_the_same_lines_and_reasons(tmp_path: Path, name: str) -> None:
    data = _file(BREAKERS[name])
    _, rep = _feed(data)
    p = tmp_path / "hostile.csv"
    p.write_bytes(data)
    assert load_events("trades", p).malformed == [(b.line, b.reason) for b in rep.bad_lines]


def test_feed_reader_reports_a_bare_carriage_return_line_and_keeps_the_rest() -> None:
    rows = [GOOD, b"MSFT,1001,10.5,5\rBID,NASDAQ", GOOD, b"IBM,1002,1.0,1,ASK,NYSE"]
    df, rep = _feed(_file(rows))
    assert sorted(df.ts.tolist()) == [1000, 1000, 1002]
    assert rep.bad == 1 and rep.bad_lines[0].line == 3  # header is line 1


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("name", list(BREAKERS))
def test_backtest_reader_survives_lines_that_break_csv_parsers(tmp_path: Path, name: str) -> None:
    """Each breaker is reported at its own line(s), every good row comes through, and no
    exception escapes into Arrow's callback (it would print a traceback to the user)."""
    rows = BREAKERS[name]
    try:
        df, bad = _backtest(tmp_path, _file(rows))
    except BacktestInputError as exc:  # a clear refusal of the file is not a crash
        pytest.fail(f"whole file refused: {exc}")
    assert bad == BREAKER_LINES[name]
    assert df.ts.tolist() == [1000] * sum(r == GOOD for r in rows)
