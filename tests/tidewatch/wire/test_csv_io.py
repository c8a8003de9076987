"""tidewatch.wire.csv_io: the backtest contract's CSV files -- bad lines reported by line number, never passed on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ingest.packets_gen import PacketConfig, PacketGenerator
from ingest.trades_gen import TradeConfig, TradeGenerator
from tidewatch.wire.csv_io import CsvError, CsvReport, columns_to_frame, read_csv_chunks, write_csv


def _read(path: Path, stream: str, chunk_lines: int = 200_000) -> tuple[list[dict], CsvReport]:
    rep = CsvReport(str(path))
    return list(read_csv_chunks(path, stream, report=rep, chunk_lines=chunk_lines)), rep


BAD_TRADES = """\
exchange,size,symbol,price,ts,side,note
NASDAQ,100,AAPL,171.5,1000,BID,ok
NASDAQ,100,AAPL,171.5,1001,BID,x,extra
NYSE,100,IBM,171.5,notatime,ASK,ts

NYSE,-5,IBM,100,1003,ASK,negative size
NYSE,5.5,IBM,100,1004,ASK,fractional size
NYSE,5,IBM,100,1005
NYSE,5,IBM,100,1006,SELL,bad side
NYSE,5,,100,1007,ASK,empty symbol
NYSE,5,IBM,nan,1008,ASK,nan price
NYSE,7,IBM,-1,1009,ASK,negative price
NYSE,8,IBM,99.5,1010,ask,lower-case side is accepted
"""


@pytest.mark.parametrize("chunk_lines", [2, 3, 100])
def test_bad_trade_lines_are_reported_with_their_line_numbers(tmp_path: Path, chunk_lines: int) -> None:
    f = tmp_path / "t.csv"
    f.write_text(BAD_TRADES)
    chunks, rep = _read(f, "trades", chunk_lines)
    assert [(b.line, b.reason) for b in rep.bad_lines] == [
        (3, "expected 7 fields, saw 8"),
        (4, "ts: not an integer"),
        (6, "size -5 is not >= 0"),  # the domains of tidewatch.schema, worded as the engine words them
        (7, "size: not an integer"),
        (8, "expected 7 fields, saw 5"),
        (9, "side 'SELL' is not one of BID, ASK, UNKNOWN"),
        (10, "symbol is empty (it must not be)"),
        (11, "price: not a number"),
        (12, "price -1 is not > 0"),
    ]
    assert rep.bad == 9 and rep.rows == 2
    df = np.concatenate([c["ts"] for c in chunks])
    assert df.tolist() == [1000, 1010]
    sides = [s for c in chunks for s in c["side"].to_numpy()]
    assert sides == ["BID", "ASK"]


def test_header_must_name_every_field(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("symbol,ts,price,size,side\nA,1,2,3,BID\n")
    with pytest.raises(CsvError, match="exchange"):
        _read(f, "trades")


def test_packets_empty_flags_allowed_ports_checked(tmp_path: Path) -> None:
    f = tmp_path / "p.csv"
    f.write_text(
        "ts,src_ip,dst_ip,src_port,dst_port,protocol,length,tcp_flags\n"
        "1,10.0.0.1,10.0.0.2,1234,53,udp,80,\n"
        "2,10.0.0.1,10.0.0.2,1234,70000,TCP,80,S\n"
        "3,10.0.0.1,10.0.0.2,1234,443,TCP,-1,S\n"
        "4,10.0.0.1,10.0.0.2,1234,443,TCP,60,SA\n"
    )
    chunks, rep = _read(f, "packets")
    assert [b.line for b in rep.bad_lines] == [3, 4]
    (ch,) = chunks
    assert ch["ts"].tolist() == [1, 4]
    assert ch["protocol"].to_numpy().tolist() == ["UDP", "TCP"]
    assert ch["tcp_flags"].to_numpy().tolist() == ["", "SA"]


@pytest.mark.parametrize("stream", ["trades", "packets"])
def test_write_then_read_gives_the_same_events(tmp_path: Path, stream: str) -> None:
    gen = (
        TradeGenerator(TradeConfig(rate=2000, n_symbols=300), seed=3)
        if stream == "trades"
        else PacketGenerator(PacketConfig(rate=2000), seed=3)
    )
    chunks = list(gen.chunks(0, 5000, 1000))
    f = tmp_path / "x.csv"
    n = write_csv(f, iter(chunks), stream)
    back, rep = _read(f, stream, chunk_lines=3000)
    assert rep.bad == 0 and rep.rows == n
    import pandas as pd

    a = pd.concat([columns_to_frame(c, stream) for c in chunks], ignore_index=True).astype(object)
    b = pd.concat([columns_to_frame(c, stream) for c in back], ignore_index=True).astype(object)
    pd.testing.assert_frame_equal(a, b)
