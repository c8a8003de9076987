"""CSV files of the backtest contract (RULES.md): read with validation, write.

A file has a header row naming the stream's fields in any order (extra columns
are ignored) and one event per line; ``ts`` is epoch milliseconds.  Reading is
vectorized (pandas' C parser on blocks of lines, NumPy validation); every
malformed line is reported with its 1-based line number in the file and
skipped -- it is never sent on.  Fields may not contain line breaks (one event
per physical line), which is what makes the line numbers exact.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import IO, Any

import numba as nb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tidewatch.errors import TidewatchError
from tidewatch.schema import CSV_NOT_UTF8, CSV_UNBALANCED_QUOTE, STREAMS, valid, valid_strings, violations
from tidewatch.wire.avro import Coded, field_names

_INT_RE = r"^[+-]?[0-9]{1,18}$"
_FLOAT_RE = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"


class CsvError(TidewatchError, ValueError):
    """A CSV file that cannot be read at all (missing file, header without the stream's fields)."""


@dataclass
class BadLine:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass
class CsvReport:
    """Counts of a read: rows accepted, bad lines (all counted; the first ``keep`` kept)."""

    path: str
    rows: int = 0
    bad: int = 0
    bad_lines: list[BadLine] = field(default_factory=list)
    keep: int = 1000
    skipped: int = 0  # input that is not an event and not an error (e.g. non-IP frames of a capture)

    def add_bad(self, items: list[BadLine]) -> None:
        self.bad += len(items)
        room = self.keep - len(self.bad_lines)
        if room > 0:
            self.bad_lines.extend(items[:room])


_SKIP_RE = re.compile(r"line (\d+): (.*)")


def _check_header(stream: str, header: list[str], path: str) -> list[str]:
    want = field_names(stream)
    missing = [f for f in want if f not in header]
    if missing:
        raise CsvError(f"{path}: header {header} lacks the {stream} fields {missing}")
    return want


def _validate(stream: str, df: pd.DataFrame) -> tuple[dict[str, Any], np.ndarray, list[str]]:
    """Vectorized conversion; returns (columns of the good rows, bad mask, reasons of bad rows)."""
    n = len(df)
    bad = np.zeros(n, bool)
    reason = np.full(n, "", dtype=object)
    cols: dict[str, Any] = {}

    def flag(mask: np.ndarray, what: str | np.ndarray, where: np.ndarray | None = None) -> None:
        """Rows ``mask`` are bad; ``what`` is the reason (one per row of ``where`` when an array)."""
        new = mask & ~bad
        if isinstance(what, str):
            reason[new] = what
        else:
            reason[new] = what[new[where]]
        bad[mask] = True

    flag(df.isna().any(axis=1).to_numpy(), "wrong number of fields")
    # parsed by type, then checked against the field's domain (tidewatch.schema) as the engine
    # and the backtest check it; a field with a closed set of values is matched ignoring case
    # and stored in the set's spelling ("bid" -> BID, "icmpv6" -> ICMPv6)
    for name, f in STREAMS[stream].fields.items():
        a = pc.utf8_trim_whitespace(pa.array(df[name].fillna("").to_numpy(dtype=object), pa.string()))
        if f.numeric:
            ok = pc.match_substring_regex(a, _FLOAT_RE if f.type == "float" else _INT_RE)
            text = pc.if_else(ok, a, "0")
            v = pc.cast(text, pa.float64() if f.type == "float" else pa.int64()).to_numpy(
                zero_copy_only=False
            )
            ok = ok.to_numpy(zero_copy_only=False)
            flag(~ok, f"{name}: not {'a number' if f.type == 'float' else 'an integer'}")
            v = np.where(ok, v, 0)
            out_of_domain = ok & ~valid(f, v)
            if out_of_domain.any():
                flag(out_of_domain, violations(f, v[out_of_domain]), out_of_domain)
            cols[name] = v.astype(np.float64 if f.type == "float" else np.int64)
            continue
        if f.values is not None:
            upper = pc.utf8_upper(pa.array(f.values, pa.string()))
            idx = pc.index_in(pc.utf8_upper(a), value_set=upper)
            a = pc.if_else(pc.is_valid(idx), pc.take(pa.array(f.values, pa.string()), idx), a)
        enc = a.dictionary_encode()
        uniq = enc.dictionary.to_numpy(zero_copy_only=False)
        codes = enc.indices.to_numpy(zero_copy_only=False)
        ok = valid_strings(f, uniq)[codes]
        if not ok.all():
            flag(~ok, violations(f, uniq)[codes][~ok], ~ok)
        cols[name] = a
    good = ~bad
    out: dict[str, Any] = {}
    keep = pa.array(good)
    for name, v in cols.items():
        if isinstance(v, pa.Array):
            enc = v.filter(keep).dictionary_encode()
            out[name] = Coded(
                enc.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
                enc.dictionary.to_pylist(),
            )
        else:
            out[name] = v[good]
    return out, bad, list(reason[bad])


def read_csv_chunks(
    path: str | Path | IO[bytes],
    stream: str,
    *,
    chunk_lines: int = 200_000,
    report: CsvReport | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield validated column chunks of ``stream`` from a CSV file.

    Each chunk is a dict of columns (strings as :class:`~tidewatch.wire.avro.Coded`),
    in file order.  Bad lines go to ``report`` (line numbers are 1-based file
    lines, the header being line 1).  Raises :class:`CsvError` if the header
    lacks a field.
    """
    name = str(path) if not hasattr(path, "read") else getattr(path, "name", "<stream>")
    rep = report if report is not None else CsvReport(name)
    fh: IO[bytes] = open(path, "rb") if not hasattr(path, "read") else path  # type: ignore[arg-type,assignment]
    try:
        head = fh.readline()
        if not head.strip():
            raise CsvError(f"{name}: empty file or no header")
        header = [h.strip() for h in head.decode("utf-8-sig").strip().split(",")]
        want = _check_header(stream, header, name)
        line0 = 2  # file line of the first data line of the block
        while True:
            block = list(islice(fh, chunk_lines))
            if not block:
                break
            if not block[-1].endswith(b"\n"):
                block[-1] += b"\n"
            yield from _parse_block(stream, head, block, line0, want, rep)
            line0 += len(block)
    finally:
        if not hasattr(path, "read"):
            fh.close()


@nb.njit(cache=True, nogil=True)
def _line_stats_kernel(a, n_lines):  # pragma: no cover - compiled
    commas = np.zeros(n_lines, np.int64)
    quoted = np.zeros(n_lines, np.int64)
    blank = np.ones(n_lines, np.bool_)
    line = 0
    for i in range(a.shape[0]):
        c = a[i]
        if c == 10:
            line += 1
        elif c == 44:
            commas[line] += 1
            blank[line] = False
        elif c == 34:
            quoted[line] += 1
            blank[line] = False
        elif c != 32 and c != 9 and c != 13:
            blank[line] = False
    return commas, quoted, blank


def line_stats(buf: bytes, n_lines: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per line of ``buf`` (each ending in a newline): commas, quote characters, is blank (one Numba pass)."""
    a = np.frombuffer(buf, np.uint8)
    commas, quoted, blank = _line_stats_kernel(a, n_lines)
    return commas, quoted, blank


def lines_not_utf8(block: list[bytes]) -> np.ndarray:
    """Which lines of ``block`` are not UTF-8 text (one decode of the whole block when all are)."""
    bad = np.zeros(len(block), bool)
    try:
        b"".join(block).decode("utf-8")
    except UnicodeDecodeError:
        for i, line in enumerate(block):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                bad[i] = True
    return bad


def _parse_block(
    stream: str,
    head: bytes,
    block: list[bytes],
    line0: int,
    want: list[str],
    rep: CsvReport,
    numbers: np.ndarray | None = None,
) -> Iterator[dict[str, Any]]:
    """Parse one block of lines (``block[i]`` is line ``line0 + i`` of the file, or
    ``numbers[i]`` when given); bad lines go to ``rep`` with their line number and reason."""
    if numbers is None:
        numbers = np.arange(line0, line0 + len(block))
    nsep = len(head.decode("utf-8-sig").split(",")) - 1
    commas, quotes, blank = line_stats(b"".join(block), len(block))
    # a row is one line: an odd number of quotes means a quoted field spans lines or never
    # closes -- the line is reported, the parser never sees it (it would swallow the lines after)
    unbalanced = quotes % 2 == 1
    # a line that is not UTF-8 is reported, not read with replacement characters (its values
    # would change silently; the backtest reader reports it too)
    not_utf8 = lines_not_utf8(block)
    # field-count check on unquoted lines (quoted ones are left to the parser)
    commas = np.where(quotes > 0, nsep, commas)
    wrong = ((commas != nsep) & ~blank) | unbalanced | not_utf8
    pre_bad = [
        BadLine(
            int(numbers[i]),
            CSV_NOT_UTF8
            if not_utf8[i]
            else CSV_UNBALANCED_QUOTE
            if unbalanced[i]
            else f"expected {nsep + 1} fields, saw {int(commas[i]) + 1}",
        )
        for i in np.flatnonzero(wrong)
    ]
    if pre_bad:
        keep_idx = np.flatnonzero(~wrong)
        block = [block[i] for i in keep_idx]
        lines_all = numbers[keep_idx]
        blank = blank[keep_idx]
    else:
        lines_all = numbers
    df: pd.DataFrame | None
    failure = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            df = pd.read_csv(
                io.BytesIO(head + b"".join(block)),
                dtype=str,
                keep_default_na=False,
                na_values=[],
                skip_blank_lines=False,
                on_bad_lines="warn",
                encoding="utf-8",
                encoding_errors="replace",
            )
        except pd.errors.ParserError as exc:
            df, failure = None, str(exc)
    skipped: dict[int, str] = {}
    if df is not None:
        for w in caught:
            for m in _SKIP_RE.finditer(str(w.message)):
                # parser line numbers count the header as line 1, like the file's
                skipped[int(lines_all[int(m.group(1)) - 2])] = m.group(2).strip()
    lines = lines_all
    keep = ~np.isin(lines, np.fromiter(skipped, np.int64, len(skipped)))
    row_lines = lines[keep]
    row_blank = blank[keep]
    if df is not None and len(row_lines) != len(df):  # e.g. a bare carriage return mid-line
        failure = f"{len(df)} rows parsed from {len(row_lines)} lines"
        df = None
    if df is None:
        # find the line(s) the parser refuses: halve and parse each half again
        rep.add_bad(pre_bad)
        if len(block) == 1:
            rep.add_bad([BadLine(int(lines_all[0]), f"malformed row ({failure})")])
            return
        mid = len(block) // 2
        for lo, hi in ((0, mid), (mid, len(block))):
            yield from _parse_block(stream, head, block[lo:hi], 0, want, rep, lines_all[lo:hi])
        return
    bads = pre_bad + [BadLine(ln, f"malformed row ({why})") for ln, why in sorted(skipped.items())]
    df = df.loc[~row_blank, want]
    row_lines = row_lines[~row_blank]
    cols, badmask, reasons = _validate(stream, df)
    bads += [BadLine(int(ln), r) for ln, r in zip(row_lines[badmask], reasons, strict=True)]
    bads.sort(key=lambda b: b.line)
    rep.add_bad(bads)
    good = int((~badmask).sum())
    rep.rows += good
    if good:
        yield cols


def columns_to_frame(columns: Mapping[str, Any], stream: str) -> pd.DataFrame:
    """A DataFrame of a column chunk, fields in schema order (strings as categoricals)."""
    data = {}
    for name in field_names(stream):
        v = columns[name]
        if isinstance(v, Coded):
            v = pd.Categorical.from_codes(v.codes, categories=pd.Index(list(v.values)).astype(object))
        data[name] = v
    return pd.DataFrame(data)


def write_csv(path: str | Path | IO[str], chunks: Iterator[Mapping[str, Any]], stream: str) -> int:
    """Write column chunks of ``stream`` to a CSV file with a header; returns the row count."""
    total = 0
    own = not hasattr(path, "write")
    fh: IO[str] = open(path, "w", newline="") if own else path  # type: ignore[arg-type,assignment]
    try:
        first = True
        for ch in chunks:
            df = columns_to_frame(ch, stream)
            df.to_csv(fh, index=False, header=first, lineterminator="\n")
            first = False
            total += len(df)
        if first:
            fh.write(",".join(field_names(stream)) + "\n")
    finally:
        if own:
            fh.close()
    return total
