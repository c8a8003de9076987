"""``tidewatch backtest``: the engine's evaluation code over files (RULES.md, "The backtest contract").

No Kafka, no Spark: rules from a JSONL file, events from CSV files, lookups every ``MS``
milliseconds at ``t0, t0 + MS, ...`` up to the first ``tau >= max ts`` (``t0`` = the smallest ts
rounded down to a multiple of MS), all events with ``ts <= tau`` applied before the lookup at
``tau`` (in chunks: one vectorized batch per stream between consecutive lookups), and one
output line per change of a rule's result set.
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from engine.errors import EngineError
from engine.evaluation.alert_lines import AlertWriter
from engine.evaluation.evaluator import Evaluator
from engine.evaluation.rules import Changes
from subscriptions.compiler import Plan, compile_rule
from subscriptions.errors import RuleError
from tidewatch.schema import (
    CSV_NOT_UTF8,
    CSV_UNBALANCED_QUOTE,
    STREAMS,
    FieldSpec,
    valid,
    valid_strings,
    violations,
)

if TYPE_CHECKING:
    from tidewatch.settings import Settings


class BacktestInputError(EngineError):
    """An input that makes the run impossible (bad rules file, missing CSV columns, ...)."""


class RuleFileError(BacktestInputError):
    """A rule that does not parse / type-check, with its name."""

    def __init__(self, name: str, path: str, lineno: int, err: RuleError) -> None:
        self.name = name
        self.err = err
        super().__init__(
            f"{path}:{lineno}: rule {name!r} refused: line {err.line}, column {err.column}: "
            f"{err.message}\n" + "\n".join(err.display().splitlines()[1:])
        )


class MalformedRows(BacktestInputError):
    """``--strict`` was given and ``count`` CSV rows are malformed (the CLI exits 1, not 2)."""

    def __init__(self, count: int) -> None:
        self.count = count
        super().__init__(f"{count} malformed row(s) and --strict was given")


# ---------------------------------------------------------------- rules
def load_rules(path: str | Path, settings: Settings) -> list[tuple[str, str, Plan]]:
    """(name, text, plan) of each line of a RULES.jsonl file (the rule language limits of
    ``settings``); RuleFileError / BacktestInputError."""
    out: list[tuple[str, str, Plan]] = []
    seen: set[str] = set()
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BacktestInputError(f"{path}:{lineno}: not a JSON object: {exc}") from None
        if (
            not isinstance(obj, dict)
            or not isinstance(obj.get("name"), str)
            or not isinstance(obj.get("rule"), str)
        ):
            raise BacktestInputError(f'{path}:{lineno}: expected {{"name": "...", "rule": "..."}}')
        name = obj["name"]
        if name in seen:
            raise BacktestInputError(f"{path}:{lineno}: duplicate rule name {name!r}")
        seen.add(name)
        try:
            plan = compile_rule(obj["rule"], settings)
        except RuleError as err:
            raise RuleFileError(name, str(path), lineno, err) from None
        out.append((name, obj["rule"], plan))
    return out


# ---------------------------------------------------------------- events
@dataclass
class EventFile:
    """One stream's events, sorted by ts (stable: ties keep file order)."""

    stream: str
    cols: dict[str, np.ndarray]
    malformed: list[tuple[int, str]] = field(default_factory=list)  # (line, reason)
    #: string fields factorized over the whole file: field -> (codes aligned with cols, uniques)
    codes: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.cols["ts"].shape[0])


def load_events(stream: str, path: str | Path) -> EventFile:
    """Read and validate a CSV of one stream (header names the fields, any order)."""
    if stream not in STREAMS:
        raise BacktestInputError(f"unknown stream {stream!r} (expected one of {', '.join(STREAMS)})")
    spec = STREAMS[stream]
    path = Path(path)
    with path.open("r", newline="", encoding="utf-8", errors="replace") as fh:
        header_line = fh.readline()
    header = [h.strip() for h in header_line.strip().split(",")]
    missing = [f for f in spec.fields if f not in header]
    if missing:
        raise BacktestInputError(f"{path}: header lacks field(s) {', '.join(missing)} of {stream}")
    bad_rows: list[tuple[int, str]] = []

    def on_invalid(row: Any) -> str:
        bad_rows.append(
            (int(row.number or 0), f"expected {row.expected_columns} fields, got {row.actual_columns}")
        )
        return "skip"

    # One row is one line, as in the feed reader (``tidewatch.wire.csv_io``): a line that is not UTF-8,
    # or has an odd number of quotes (a quoted field that spans lines or never closes), is
    # emptied before Arrow parses the file and reported by its line number.  Arrow would
    # otherwise swallow every line after an open quote, and hands a row with the wrong field
    # count to ``on_invalid`` as text, which fails inside Arrow for bytes that are not UTF-8.
    source: Any = path
    blanked: dict[int, str] = {}  # line number -> why it was emptied
    utf8, quoted = _scan(path)
    if not utf8 or quoted:
        source, blanked = _blank_broken_lines(path.read_bytes(), check_utf8=not utf8)

    def read(typed: bool) -> pa.Table:
        types = {h: pa.string() for h in header}
        if typed:
            for name, f in spec.fields.items():
                # strings dictionary-encoded: one Python str per distinct value, not per row
                types[name] = (
                    pa.int64()
                    if f.type == "int"
                    else pa.float64()
                    if f.type == "float"
                    else pa.dictionary(pa.int32(), pa.string())
                )
        return pacsv.read_csv(
            pa.BufferReader(source) if isinstance(source, bytes) else source,
            read_options=pacsv.ReadOptions(use_threads=False),
            parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                strings_can_be_null=False,
                null_values=[],
                include_columns=list(spec.fields),
            ),
        )

    try:  # fast path: every value parses with its type
        table, typed = read(True), True
    except pa.ArrowInvalid:
        bad_rows.clear()
        table, typed = read(False), False
    bad_rows.extend(blanked.items())
    n = table.num_rows
    ok = np.ones(n, bool)
    reasons: dict[int, str] = {}
    cols: dict[str, np.ndarray] = {}
    facts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, f in spec.fields.items():
        column = table.column(name)
        if f.numeric:
            if typed:
                num = column.to_numpy()
                raw = None
            else:
                raw = column.to_numpy(zero_copy_only=False).astype(object)
                num = pd.to_numeric(pd.Series(raw).str.strip(), errors="coerce").to_numpy(dtype=np.float64)
            parsed = np.ones(len(num), bool)  # an int field must hold a whole number
            if num.dtype.kind == "f" and f.type == "int":
                with np.errstate(invalid="ignore"):
                    parsed = ~np.isfinite(num) | (np.floor(num) == num)
            if raw is not None:  # not a number at all (pd.to_numeric gave NaN for it)
                parsed &= ~(
                    np.isnan(num)
                    & ~pd.Series(raw).str.strip().str.lower().isin(["nan", "+nan", "-nan"]).to_numpy()
                )
            for i in np.flatnonzero(ok & ~parsed)[:100_000]:
                shown = raw[i] if raw is not None else num[i]
                reasons.setdefault(int(i), f"bad {name} {shown!r}")
            ok &= parsed
            good = valid(f, num)  # the field's domain (tidewatch.schema), as the engine checks it
            bad = np.flatnonzero(ok & ~good)[:100_000]
            for i, text in zip(bad.tolist(), violations(f, num[bad]).tolist(), strict=True):
                reasons.setdefault(i, text)
            ok &= good
            if f.type == "int":
                cols[name] = num if num.dtype == np.int64 else np.where(good, num, 0).astype(np.int64)
            else:
                cols[name] = num.astype(np.float64)
        else:
            raw, good, fact = _strings(column, f)
            if fact is not None:
                facts[name] = fact
            bad = np.flatnonzero(ok & ~good)[:100_000]
            for i, text in zip(bad.tolist(), violations(f, raw[bad]).tolist(), strict=True):
                reasons.setdefault(i, text)
            ok &= good
            cols[name] = raw
    if reasons:
        lines = _row_lines(path, n, {b for b, _ in bad_rows} | set(blanked))
        bad_rows.extend((lines[i], r) for i, r in reasons.items())
    bad_rows.sort()
    if not ok.all():
        cols = {k: v[ok] for k, v in cols.items()}
        facts = {k: (c[ok], u) for k, (c, u) in facts.items()}
    order = np.argsort(cols["ts"], kind="stable")
    if order.shape[0] > 1 and np.any(order[1:] < order[:-1]):
        cols = {k: v[order] for k, v in cols.items()}
        facts = {k: (c[order], u) for k, (c, u) in facts.items()}
    return EventFile(stream, cols, bad_rows, facts)


def _strings(
    column: pa.ChunkedArray, f: FieldSpec
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """An Arrow string column (plain or dictionary-encoded) as a NumPy object array of str; the
    mask of its rows in the domain of ``f`` (tested once per distinct value); and for a
    dictionary-encoded column its (codes, uniques) over the whole file (the evaluator then
    hashes no strings per batch)."""
    if not pa.types.is_dictionary(column.type):
        raw = np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)
        uniq, inverse = np.unique(raw, return_inverse=True) if len(raw) else (raw, np.zeros(0, np.int64))
        return raw, valid_strings(f, uniq)[inverse.reshape(-1)], None
    column = column.unify_dictionaries()  # one dictionary for every chunk
    if column.num_chunks == 0:
        return np.zeros(0, dtype=object), np.zeros(0, bool), None
    uniques = np.asarray(column.chunk(0).dictionary.to_numpy(zero_copy_only=False), dtype=object)
    codes = np.concatenate(
        [np.asarray(c.indices.to_numpy(zero_copy_only=False), dtype=np.int64) for c in column.chunks]
    )
    raw = uniques[codes]
    return raw, valid_strings(f, uniques)[codes], (codes, uniques)


def _scan(path: Path, chunk: int = 1 << 24) -> tuple[bool, bool]:
    """Whether the whole file is UTF-8 text, and whether it holds a quote character (one pass in
    chunks: a large file is never held twice)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    utf8, quoted = True, False
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            quoted = quoted or b'"' in block
            if utf8:
                try:
                    decoder.decode(block)
                except UnicodeDecodeError:
                    utf8 = False
        if utf8:
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                utf8 = False
    return utf8, quoted


def _blank_broken_lines(data: bytes, check_utf8: bool) -> tuple[bytes, dict[int, str]]:
    """``data`` with every line after the header emptied that is not UTF-8 (when ``check_utf8``)
    or has an odd number of quote characters -- the feed reader's own checks
    (:func:`tidewatch.wire.csv_io.line_stats`, :func:`tidewatch.wire.csv_io.lines_not_utf8`); and why, by line
    number (header is line 1).  Line numbers do not change: an emptied line is still a line,
    and Arrow skips it."""
    from tidewatch.wire.csv_io import line_stats, lines_not_utf8

    lines = data.split(b"\n")
    _, quotes, _ = line_stats(data + b"\n", len(lines))
    not_utf8 = lines_not_utf8(lines) if check_utf8 else np.zeros(len(lines), bool)
    why = {}
    for i in np.flatnonzero((quotes % 2 == 1) | not_utf8):
        if i > 0:
            why[int(i) + 1] = CSV_NOT_UTF8 if not_utf8[i] else CSV_UNBALANCED_QUOTE
            lines[i] = b""
    return b"\n".join(lines), why


def _row_lines(path: Path, n: int, skipped: set[int]) -> list[int]:
    """Physical line number of each parsed row (header is line 1; empty and skipped lines excluded)."""
    out: list[int] = []
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            if lineno == 1 or lineno in skipped or not line.strip():
                continue
            out.append(lineno)
            if len(out) == n:
                break
    return out


# ---------------------------------------------------------------- the run
@dataclass
class BacktestResult:
    events: int
    malformed: int
    rules: int
    lookups: int
    alerts: int
    seconds: float
    eval_seconds: float
    cpu_seconds: float
    strategy: str
    stats: dict[str, int]

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        return (
            f"backtest ({self.strategy}): {self.events:,} events ({self.malformed:,} malformed rows skipped), "
            f"{self.rules:,} rules, {self.lookups:,} lookups, {self.alerts:,} alerts in {self.seconds:.2f} s "
            f"= {self.events_per_s:,.0f} events/s (CPU {self.cpu_seconds:.2f} s; evaluation alone {self.eval_seconds:.2f} s); "
            f"index candidates {self.stats.get('candidates', 0):,}, keys post-checked {self.stats.get('post_checked', 0):,}"
        )


def lookup_times(files: list[EventFile], every: int) -> np.ndarray:
    """tau = t0, t0 + every, ... up to the first tau >= the largest ts (RULES.md)."""
    if every <= 0:
        raise BacktestInputError("--every must be a positive number of milliseconds")
    nonempty = [f for f in files if f.n]
    if not nonempty:
        return np.zeros(0, np.int64)
    lo = min(int(f.cols["ts"][0]) for f in nonempty)
    hi = max(int(f.cols["ts"][-1]) for f in nonempty)
    t0 = (lo // every) * every
    count = -(-(hi - t0) // every) + 1  # ceil
    return t0 + every * np.arange(count, dtype=np.int64)


def iter_changes(
    rules: list[tuple[str, str, Plan]],
    files: list[EventFile],
    every: int,
    evaluator: Evaluator | Any,
    progress: Callable[[int, int], None] | None = None,
    skip: Callable[[int], frozenset[str]] | None = None,
) -> Iterator[Changes]:
    """Each lookup's :class:`Changes` (alerts as columns), in lookup order, from ``evaluator``
    (an :class:`Evaluator` or a :class:`engine.evaluation.scan.ScanEvaluator`).

    ``skip``: the lookup schedule, ``tau -> the rules not looked up at tau``
    (:meth:`Evaluator.step`'s ``skip``; the engine's overload policy, :mod:`engine.overload`,
    e.g. :func:`engine.overload.schedule` of the strides an engine recorded): each rule is then
    looked up at its own times only, its changes diffed against its own previous lookup.
    None: every rule at every lookup time."""
    ev = evaluator
    ev.add_rules((name, plan) for name, _text, plan in rules)
    taus = lookup_times(files, every)
    bounds = {f.stream: np.searchsorted(f.cols["ts"], taus, side="right") for f in files}
    starts = {f.stream: 0 for f in files}
    total = len(taus)
    for j, tau in enumerate(taus):
        for f in files:
            a, b = starts[f.stream], int(bounds[f.stream][j])
            if b > a:
                fact = {k: (c[a:b], u) for k, (c, u) in f.codes.items()}
                ev.apply(f.stream, {k: v[a:b] for k, v in f.cols.items()}, fact)
                starts[f.stream] = b
        off = skip(int(tau)) if skip is not None else frozenset()
        yield ev.step(int(tau), off) if off else ev.step(int(tau))
        if progress is not None and (j % 64 == 0 or j == total - 1):
            progress(j + 1, total)


def make_evaluator(strategy: str, ci_p: int, pane_ms: int | None = None) -> Evaluator | Any:
    """The evaluator of a backtest strategy: ``shared`` / ``naive`` (:class:`Evaluator`) or
    ``scan`` (:class:`engine.evaluation.scan.ScanEvaluator`)."""
    if strategy == "scan":
        from engine.evaluation.scan import ScanEvaluator

        return ScanEvaluator(ci_p=ci_p, pane_ms=pane_ms)
    return Evaluator(strategy, ci_p=ci_p, pane_ms=pane_ms)


def iter_alerts(
    rules: list[tuple[str, str, Plan]],
    files: list[EventFile],
    every: int,
    strategy: str = "shared",
    progress: Callable[[int, int], None] | None = None,
    evaluator: Evaluator | None = None,
    *,
    ci_p: int | None = None,
    skip: Callable[[int], frozenset[str]] | None = None,
) -> Iterator[tuple[int, str, str, str]]:
    """(as_of, rule, key, kind) alerts in RULES.md order, from ``evaluator`` (default: a new
    one of ``strategy`` with the CI-COUNT / CI-SUM parameter ``ci_p``, then required);
    ``skip``: the lookup schedule (:func:`iter_changes`)."""
    if evaluator is None:
        if ci_p is None:
            raise TypeError("iter_alerts needs an evaluator or ci_p")
        evaluator = make_evaluator(strategy, ci_p)
    for changes in iter_changes(rules, files, every, evaluator, progress, skip):
        yield from changes.rows()


def run_backtest(
    rules_path: str | Path,
    events: list[tuple[str, str | Path]],
    every: int,
    out: IO[str] | IO[bytes],
    strategy: str = "shared",
    on_malformed: Callable[[str, int, str], None] | None = None,
    strict: bool = False,
    progress: Callable[[int, int], None] | None = None,
    *,
    settings: Settings,
) -> BacktestResult:
    """The whole backtest; raises BacktestInputError (incl. RuleFileError) on unusable input.
    ``settings``: the rule language limits and the CI-COUNT / CI-SUM parameter ``ci_p``."""
    t_start = time.perf_counter()
    c_start = time.process_time()
    rules = load_rules(rules_path, settings)
    streams = [s for s, _ in events]
    if len(set(streams)) != len(streams):
        raise BacktestInputError("each stream may be given once with --events")
    files = [load_events(s, p) for s, p in events]
    malformed = 0
    for (_, p), f in zip(events, files, strict=True):
        for line, reason in f.malformed:
            malformed += 1
            if on_malformed is not None:
                on_malformed(str(p), line, reason)
    if strict and malformed:
        raise MalformedRows(malformed)
    # lookups at multiples of ``every``: windows that are multiples of it are served from
    # (key, pane) rows of width ``every``, the others from raw events (identical answers)
    ev = make_evaluator(strategy, settings.ci_p, pane_ms=every)
    t_eval = time.perf_counter()
    writer = AlertWriter(out)  # alerts as columns, JSON lines in bulk (alert_lines)
    for changes in iter_changes(rules, files, every, ev, progress):
        writer.add(changes)
    writer.flush()
    n_alerts = writer.count
    t_end = time.perf_counter()
    n_events = sum(f.n for f in files)
    return BacktestResult(
        events=n_events,
        malformed=malformed,
        rules=len(rules),
        lookups=ev.stats["lookups"],
        alerts=n_alerts,
        seconds=t_end - t_start,
        eval_seconds=t_end - t_eval,
        cpu_seconds=time.process_time() - c_start,
        strategy=strategy,
        stats=dict(ev.stats),
    )
