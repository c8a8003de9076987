"""The feeds' logic behind ``tidewatch feed …`` (:mod:`ingest.cli`): sources, pacing, resume.

A feed is a source of ``(columns, pacer)`` chunks -- a file replay (:func:`_file_feed`) or a
synthetic stream (:func:`_generated_feed`: history as fast as possible, then live) -- sent by
:func:`run_feed` through a :class:`~ingest.producer.KafkaFeed`, or with ``--resume`` a
:class:`~ingest.producer.TransactionalFeed` (:func:`_resumable_feed`).  Ctrl-C stops cleanly:
what was queued is flushed and a final count printed (exit status 130); SIGTERM does the same.
When stderr is not a terminal (a service log) the progress line becomes a summary line every 10 s.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tidewatch import durations
from tidewatch.settings import Settings

err = Console(stderr=True, soft_wrap=True)


# --------------------------------------------------------------------------- parsing helpers


def parse_duration_ms(text: str) -> int:
    """``'90s'``, ``'5m'``, ``'1.5h'``, ``'250ms'``, ``'2d'``; a bare number is seconds
    (:func:`tidewatch.durations.parse_duration_ms`, as a command-line parameter)."""
    try:
        return durations.parse_duration_ms(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def parse_time_ms(text: str) -> int:
    """``'now'``, epoch milliseconds, or an ISO-8601 date-time (UTC unless it has an offset)."""
    t = text.strip()
    if t.lower() == "now":
        return int(time.time() * 1000)
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError as exc:
        raise typer.BadParameter(f"not a time: {text!r} (now, epoch ms, or ISO 8601)") from exc
    if dt.tzinfo is None:
        from datetime import UTC

        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


# --------------------------------------------------------------------------- running a feed
def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        TextColumn("{task.fields[line]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


def _progress_line(sent: int, delivered: int, failed: int, bad: int, rate: float, mb: float) -> str:
    line = f"{sent:,} sent · {delivered:,} delivered · {rate:,.0f}/s · {mb:,.1f} MB"
    if failed:
        line += f" · [red]{failed:,} failed[/red]"
    if bad:
        line += f" · [yellow]{bad:,} bad lines[/yellow]"
    return line


def run_feed(
    stream: str,
    source: Iterator[tuple[dict[str, Any], Any]],
    *,
    settings: Settings,
    topic: str | None,
    bootstrap: str | None,
    show_progress: bool,
    report: Any = None,
    producer: Any = None,
    resume: tuple[Path, Path] | None = None,
    commit_every: int | None = None,
) -> int:
    """Send ``(columns, pacer)`` chunks; print bad lines and the final count; return the exit status."""
    from ingest.producer import FeedStats, KafkaFeed

    s = settings
    log_lines = show_progress and not err.is_terminal
    prog = _progress() if show_progress and err.is_terminal else None
    task = None
    window: list[tuple[float, int]] = []

    last_log = [time.monotonic()]

    def on_progress(st: FeedStats, in_flight: int) -> None:
        now = time.monotonic()
        if prog is None or task is None:
            if log_lines and now - last_log[0] >= 10.0:  # not a terminal (a service log): a line every 10 s
                last_log[0] = now
                err.print(f"{stream}: {st.summary()}", highlight=False)
            return
        window.append((now, st.produced))
        while len(window) > 2 and now - window[0][0] > 3.0:
            window.pop(0)
        dt = now - window[0][0]
        rate = (st.produced - window[0][1]) / dt if dt > 0 else 0.0
        prog.update(
            task,
            completed=st.produced,
            line=_progress_line(
                st.produced, st.delivered(in_flight), st.failed, st.bad_input, rate, st.bytes / 1e6
            ),
        )

    feed: KafkaFeed
    if resume is not None:
        feed = _resumable_feed(s, stream, resume, topic, bootstrap, commit_every, on_progress)
    else:
        feed = KafkaFeed(
            stream, settings=s, topic=topic, bootstrap=bootstrap, on_progress=on_progress, producer=producer
        )
    dest = f"{stream} → {feed.topic}"
    err.print(f"{stream} → topic {feed.topic} at {bootstrap or s.kafka_bootstrap}", highlight=False)
    interrupted = False
    shown_bad = 0

    def on_sigint(signum: int, frame: Any) -> None:
        # first Ctrl-C: stop after the current slice and flush; second: abort the flush
        if feed.stopping:
            raise KeyboardInterrupt
        feed.stopping = True

    old_handlers: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():  # Ctrl-C, and SIGTERM from a service manager
        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, on_sigint)
    if prog is not None:
        prog.start()
        task = prog.add_task(dest, total=None, line=_progress_line(0, 0, 0, 0, 0.0, 0.0))
    try:
        for columns, pacer in source:
            feed.send(columns, pacer)
            if feed.stopping:
                interrupted = True
                err.print("[yellow]interrupted: flushing what was queued ...")
                break
            if report is not None:
                feed.stats.bad_input = report.bad
                for b in report.bad_lines[shown_bad:]:
                    err.print(f"[yellow]{report.path}: {b}", highlight=False)
                shown_bad = len(report.bad_lines)
        else:
            if hasattr(feed, "finish"):
                feed.finish()
    except KeyboardInterrupt:
        interrupted = True
        err.print("[yellow]interrupted: flushing what was queued ...")
    finally:
        try:
            stats = feed.close(timeout=15.0)
        except KeyboardInterrupt:  # a second Ctrl-C: give up waiting
            stats = feed.stats
            stats.unconfirmed = feed.in_flight()
        if prog is not None:
            prog.stop()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
    if report is not None and report.bad > len(report.bad_lines):
        err.print(f"[yellow]{report.path}: … {report.bad - len(report.bad_lines):,} more bad lines not shown")
    err.print(f"{dest}: {stats.summary()}", highlight=False)
    if resume is not None:
        err.print(
            f"progress: {feed.acked:,} records of the file committed "  # type: ignore[attr-defined]
            f"({feed.skipped:,} skipped as already committed) — {feed.progress.path}",  # type: ignore[attr-defined]
            highlight=False,
        )
    for e in stats.first_errors:
        err.print(f"[red]delivery error: {e}")
    if interrupted:
        return 130
    return 1 if (stats.failed or stats.unconfirmed) else 0


def _resumable_feed(
    settings: Settings,
    stream: str,
    resume: tuple[Path, Path],
    topic: str | None,
    bootstrap: str | None,
    commit_every: int | None,
    on_progress: Any,
) -> Any:
    """A :class:`~ingest.producer.TransactionalFeed` of ``file`` (exit status 2 if its progress
    file describes another file)."""
    from ingest.producer import FeedProgress, ProgressMismatch, TransactionalFeed, file_identity

    s = settings
    t = topic or s.stream_topic(stream)
    file, path = resume
    try:
        progress = FeedProgress.open(path, file_identity(file), t)
    except ProgressMismatch as exc:
        err.print(f"[red]{exc}")
        raise typer.Exit(2) from exc
    feed = TransactionalFeed(
        stream,
        progress,
        settings=s,
        topic=t,
        bootstrap=bootstrap,
        commit_every=commit_every,
        on_progress=on_progress,
    )
    if feed.acked:
        err.print(f"resuming {file}: {feed.acked:,} records already committed are skipped", highlight=False)
    return feed


def _file_source(
    chunks: Iterator[dict[str, Any]], speed: float | None, rate: float | None
) -> Iterator[tuple[dict[str, Any], Any]]:
    from ingest.producer import Pacer

    pacer = Pacer(speed=speed, rate=rate)
    for ch in chunks:
        yield ch, pacer


def _synthetic_source(
    gen: Any,
    *,
    start_ms: int,
    duration_ms: int | None,
    history_ms: int,
    live: bool,
    speed: float | None,
    rate: float | None,
) -> Iterator[tuple[dict[str, Any], Any]]:
    """History (``start - history`` .. ``start``) as fast as possible, then from ``start`` paced."""
    from ingest.producer import Pacer

    if history_ms > 0:
        fast = Pacer(rate=rate) if rate else None
        for ch in gen.chunks(start_ms - history_ms, start_ms, 1000):
            yield ch, fast
    # live: each event is due when the wall clock reaches its ts, however long the backfill took
    pacer = Pacer(
        speed=1.0 if live else speed,
        rate=rate,
        anchor_ts=start_ms if (live or speed) else None,
        wall_clock=live,
    )
    end = None if duration_ms is None else start_ms + duration_ms
    for ch in gen.chunks(start_ms, end, 200 if (live or speed) else 1000):
        yield ch, pacer


def _resume_target(
    settings: Settings,
    stream: str,
    file: Path | None,
    resume: bool,
    progress_file: Path | None,
    topic: str | None,
) -> tuple[Path, Path] | None:
    """``(file, its progress file)`` when the feed is resumable, else None."""
    if not resume and progress_file is None:
        return None
    if file is None:
        raise typer.BadParameter("--resume and --progress-file apply to --csv / --pcap files only")
    return file, _progress_file(settings, stream, file, progress_file, topic)


def _progress_file(
    settings: Settings, stream: str, file: Path, progress_file: Path | None, topic: str | None
) -> Path:
    from ingest.producer import default_progress_path

    t = topic or settings.stream_topic(stream)
    return progress_file or default_progress_path(settings, stream, t, file)


def _pacing(speed: float | None, asap: bool) -> float | None:
    return None if asap else speed


def _file_feed(
    path: Path, open_chunks: Any, speed: float | None, asap: bool, rate: float | None
) -> tuple[Iterator[tuple[dict[str, Any], Any]], Any]:
    """A file replay: ``open_chunks(report)`` yields column chunks; a file that cannot be
    opened or whose header is wrong stops the command with exit status 2."""
    from ingest.pcap import PcapError
    from tidewatch.wire.csv_io import CsvError, CsvReport

    report = CsvReport(str(path))
    try:
        chunks = open_chunks(report)
        first = next(chunks, None)
    except (CsvError, PcapError, OSError) as exc:
        err.print(f"[red]{exc}")
        raise typer.Exit(2) from exc

    def all_chunks() -> Iterator[dict[str, Any]]:
        if first is not None:
            yield first
        yield from chunks

    return _file_source(all_chunks(), _pacing(speed, asap), rate), report


def _generated_feed(
    gen: Any,
    start_ms: int,
    duration: str | None,
    history_ms: int,
    speed: float | None,
    asap: bool,
    rate: float | None,
) -> Iterator[tuple[dict[str, Any], Any]]:
    """A synthetic stream: history as fast as possible, then live unless paced otherwise."""
    return _synthetic_source(
        gen,
        start_ms=start_ms,
        duration_ms=parse_duration_ms(duration) if duration else None,
        history_ms=history_ms,
        live=not asap and speed is None,
        speed=_pacing(speed, asap),
        rate=rate,
    )


def _history_not_in_topic(
    settings: Settings, stream: str, start_ms: int, history_ms: int, topic: str | None, bootstrap: str | None
) -> int:
    """The demo's history backfill, shortened to start after the newest event already in the
    topic: on a restart (``tidewatch down`` / ``up``) a full backfill would be all late for an
    engine that has read the first one, and every event of it a dead letter."""
    from ingest.producer import newest_event_ms

    s = settings
    name = topic or s.stream_topic(stream)
    newest = newest_event_ms(s, bootstrap or s.kafka_bootstrap, name, stream)
    if newest is None or newest < start_ms - history_ms:
        return history_ms
    kept = max(0, start_ms - newest - 1)
    err.print(
        f"{name} already holds events up to {datetime.fromtimestamp(newest / 1000):%H:%M:%S}: "
        f"history backfill shortened to {kept / 60_000:.1f} min",
        highlight=False,
    )
    return kept


def _trade_generator(
    seed: int,
    symbols: int,
    gen_rate: float,
    start_ms: int,
    episodes: bool,
    first_ep_ms: int,
    episode_every_ms: int,
    n_episodes: int,
    size_median: float | None = None,
) -> Any:
    from ingest.trades_gen import SESSION_MS, TradeConfig, TradeGenerator, demo_episodes

    cfg = TradeConfig(n_symbols=symbols, rate=gen_rate)
    if size_median is not None:
        cfg = replace(cfg, size_median=size_median)
    # session phase: the stream starts ~1/3 into a session (mid-morning)
    gen = TradeGenerator(cfg, seed=seed, session_open_ms=start_ms - SESSION_MS // 3)
    if episodes:
        gen.episodes = demo_episodes(gen, first_ep_ms, every_ms=episode_every_ms, count=n_episodes)
    return gen
