"""``tidewatch feed …`` and ``tidewatch export …``: the feeds' command line.

* ``tidewatch feed trades --csv F | --synthetic | --demo``
* ``tidewatch feed packets --pcap F | --csv F | --synthetic | --demo``
* ``tidewatch export trades|packets --out F.csv`` (same synthetic streams, to CSV)

Pacing: ``--speed X`` replays at X × the recorded pace of ``ts`` (1 = real
time), ``--asap`` as fast as possible, ``--rate R`` caps events/s.  Files are
sent as fast as possible unless told otherwise; synthetic streams go out live
(each event when the wall clock reaches its ``ts``).  Ctrl-C stops cleanly:
what was queued is flushed and a final count printed (exit status 130); SIGTERM
does the same.  When stderr is not a terminal (a service log) the progress
line becomes a summary line every 10 s.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tidewatch.settings import get_settings

err = Console(stderr=True, soft_wrap=True)

feed_app = typer.Typer(help="Send trades or packets into Kafka (Avro).", no_args_is_help=True)


class ExportStream(StrEnum):
    trades = "trades"
    packets = "packets"


# --------------------------------------------------------------------------- parsing helpers
_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h|d)?\s*$")


def parse_duration_ms(text: str) -> int:
    """``'90s'``, ``'5m'``, ``'1.5h'``, ``'250ms'``, ``'2d'``; a bare number is seconds."""
    m = _DUR.match(text)
    if not m:
        raise typer.BadParameter(f"not a duration: {text!r} (e.g. 90s, 5m, 1h)")
    unit = {"ms": 1, "s": 1000, None: 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}[
        m.group(2)
    ]
    return int(round(float(m.group(1)) * unit))


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

    s = get_settings()
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
        feed = _resumable_feed(stream, resume, topic, bootstrap, commit_every, on_progress)
    else:
        feed = KafkaFeed(stream, topic=topic, bootstrap=bootstrap, on_progress=on_progress, producer=producer)
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

    s = get_settings()
    t = topic or s.stream_topic(stream)
    file, path = resume
    try:
        progress = FeedProgress.open(path, file_identity(file), t)
    except ProgressMismatch as exc:
        err.print(f"[red]{exc}")
        raise typer.Exit(2) from exc
    feed = TransactionalFeed(
        stream, progress, topic=t, bootstrap=bootstrap, commit_every=commit_every, on_progress=on_progress
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
    pacer = Pacer(speed=1.0 if live else speed, rate=rate, anchor_ts=start_ms if (live or speed) else None)
    end = None if duration_ms is None else start_ms + duration_ms
    for ch in gen.chunks(start_ms, end, 200 if (live or speed) else 1000):
        yield ch, pacer


# --------------------------------------------------------------------------- common options
Topic = Annotated[str | None, typer.Option(help="Kafka topic (default: from settings)")]
Bootstrap = Annotated[str | None, typer.Option(help="Kafka bootstrap servers (default: from settings)")]
Speed = Annotated[float | None, typer.Option(help="replay at SPEED × recorded pace (1 = real time)")]
Asap = Annotated[bool, typer.Option("--asap", help="as fast as possible (no pacing by ts)")]
Rate = Annotated[float | None, typer.Option(help="send at most RATE events/s")]
Seed = Annotated[int, typer.Option(help="random seed (same seed, same stream)")]
Start = Annotated[str, typer.Option(help="first event time: now, epoch ms or ISO 8601")]
Duration = Annotated[
    str | None, typer.Option(help="how much event time to generate, e.g. 10m (default: forever)")
]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="no progress line")]
Resume = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="files: send in Kafka transactions and keep a progress file; run again after a "
        "crash or Ctrl-C to go on where the last committed transaction ended (docs/feeds.md)",
    ),
]
ProgressFile = Annotated[
    Path | None,
    typer.Option(
        help="--resume: progress file (default: <run_dir>/feed-progress/<stream>-<topic>-<id>.json)"
    ),
]
CommitEvery = Annotated[
    int | None, typer.Option(help="--resume: records per Kafka transaction (default: settings)")
]


def _resume_target(
    stream: str, file: Path | None, resume: bool, progress_file: Path | None, topic: str | None
) -> tuple[Path, Path] | None:
    """``(file, its progress file)`` when the feed is resumable, else None."""
    if not resume and progress_file is None:
        return None
    if file is None:
        raise typer.BadParameter("--resume and --progress-file apply to --csv / --pcap files only")
    return file, _progress_file(stream, file, progress_file, topic)


def _progress_file(stream: str, file: Path, progress_file: Path | None, topic: str | None) -> Path:
    from ingest.producer import default_progress_path

    s = get_settings()
    t = topic or s.stream_topic(stream)
    return progress_file or default_progress_path(stream, t, file)


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
    stream: str, start_ms: int, history_ms: int, topic: str | None, bootstrap: str | None
) -> int:
    """The demo's history backfill, shortened to start after the newest event already in the
    topic: on a restart (``tidewatch down`` / ``up``) a full backfill would be all late for an
    engine that has read the first one, and every event of it a dead letter."""
    from ingest.producer import newest_event_ms

    s = get_settings()
    name = topic or s.stream_topic(stream)
    newest = newest_event_ms(bootstrap or s.kafka_bootstrap, name, stream)
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
) -> Any:
    from ingest.trades_gen import SESSION_MS, TradeConfig, TradeGenerator, demo_episodes

    # session phase: the stream starts ~1/3 into a session (mid-morning)
    gen = TradeGenerator(
        TradeConfig(n_symbols=symbols, rate=gen_rate), seed=seed, session_open_ms=start_ms - SESSION_MS // 3
    )
    if episodes:
        gen.episodes = demo_episodes(gen, first_ep_ms, every_ms=episode_every_ms, count=n_episodes)
    return gen


@feed_app.command("trades")
def feed_trades(
    csv: Annotated[Path | None, typer.Option(help="replay this CSV file (header + one trade a line)")] = None,
    synthetic: Annotated[bool, typer.Option("--synthetic", help="generate a synthetic market")] = False,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="the embedded stack's demo feed: history backfill, "
            "then live with episodes that make RULES.md fire",
        ),
    ] = False,
    seed: Seed = 7,
    symbols: Annotated[int, typer.Option(help="synthetic: number of symbols")] = 3000,
    gen_rate: Annotated[float | None, typer.Option(help="synthetic: mean trades/s of the model")] = None,
    start: Start = "now",
    duration: Duration = None,
    history: Annotated[
        str | None, typer.Option(help="synthetic: backfill this much history first (demo: 31m)")
    ] = None,
    episodes: Annotated[
        bool | None, typer.Option("--episodes/--no-episodes", help="inject episodes (demo: on)")
    ] = None,
    episode_every: Annotated[str, typer.Option(help="time between injected episodes")] = "60s",
    first_episode: Annotated[str, typer.Option(help="first episode this long after the start")] = "10s",
    speed: Speed = None,
    asap: Asap = False,
    rate: Rate = None,
    topic: Topic = None,
    bootstrap: Bootstrap = None,
    no_progress: NoProgress = False,
    resume: Resume = False,
    progress_file: ProgressFile = None,
    commit_every: CommitEvery = None,
) -> None:
    """Send trades to Kafka from a CSV file or from the synthetic market."""
    s = get_settings()
    if sum([csv is not None, synthetic, demo]) != 1:
        raise typer.BadParameter("give exactly one of --csv, --synthetic, --demo")
    target = _resume_target("trades", csv, resume, progress_file, topic)
    report = None
    if csv is not None:
        from tidewatch.wire.csv_io import read_csv_chunks

        source, report = _file_feed(
            csv, lambda r: read_csv_chunks(csv, "trades", report=r), speed, asap, rate
        )
    else:
        start_ms = parse_time_ms(start)
        hist = (
            parse_duration_ms(history) if history else (int(s.demo_history_minutes * 60_000) if demo else 0)
        )
        if demo and hist > 0:
            hist = _history_not_in_topic("trades", start_ms, hist, topic, bootstrap)
        inject = episodes if episodes is not None else demo
        gen = _trade_generator(
            seed,
            symbols,
            gen_rate or s.demo_trade_rate,
            start_ms,
            inject,
            start_ms + parse_duration_ms(first_episode),
            parse_duration_ms(episode_every),
            1000,
        )
        source = _generated_feed(gen, start_ms, duration, hist, speed, asap, rate)
    raise typer.Exit(
        run_feed(
            "trades",
            source,
            topic=topic,
            bootstrap=bootstrap,
            show_progress=not no_progress,
            report=report,
            resume=target,
            commit_every=commit_every,
        )
    )


@feed_app.command("packets")
def feed_packets(
    pcap: Annotated[Path | None, typer.Option(help="replay a pcap / pcapng capture")] = None,
    csv: Annotated[Path | None, typer.Option(help="replay this CSV file")] = None,
    synthetic: Annotated[
        bool, typer.Option("--synthetic", help="generate synthetic network traffic")
    ] = False,
    demo: Annotated[
        bool, typer.Option("--demo", help="live synthetic traffic with attacks that make RULES.md fire")
    ] = False,
    seed: Seed = 7,
    gen_rate: Annotated[
        float | None, typer.Option(help="synthetic: mean packets/s of normal traffic")
    ] = None,
    start: Start = "now",
    duration: Duration = None,
    history: Annotated[str | None, typer.Option(help="synthetic: backfill this much history first")] = None,
    attacks: Annotated[
        bool | None, typer.Option("--attacks/--no-attacks", help="inject attacks (demo: on)")
    ] = None,
    attack_every: Annotated[str, typer.Option(help="time between injected attacks")] = "60s",
    first_attack: Annotated[str, typer.Option(help="first attack this long after the start")] = "10s",
    speed: Speed = None,
    asap: Asap = False,
    rate: Rate = None,
    topic: Topic = None,
    bootstrap: Bootstrap = None,
    no_progress: NoProgress = False,
    resume: Resume = False,
    progress_file: ProgressFile = None,
    commit_every: CommitEvery = None,
) -> None:
    """Send packets to Kafka from a capture, a CSV file, or synthetic traffic."""
    s = get_settings()
    if sum([pcap is not None, csv is not None, synthetic, demo]) != 1:
        raise typer.BadParameter("give exactly one of --pcap, --csv, --synthetic, --demo")
    target = _resume_target("packets", pcap or csv, resume, progress_file, topic)
    report = None
    if pcap is not None or csv is not None:
        from ingest.pcap import read_pcap_chunks
        from tidewatch.wire.csv_io import read_csv_chunks

        if pcap is not None:
            source, report = _file_feed(pcap, lambda r: read_pcap_chunks(pcap, report=r), speed, asap, rate)
        else:
            assert csv is not None
            source, report = _file_feed(
                csv, lambda r: read_csv_chunks(csv, "packets", report=r), speed, asap, rate
            )
    else:
        from ingest.packets_gen import PacketConfig, PacketGenerator, demo_attacks

        start_ms = parse_time_ms(start)
        hist = parse_duration_ms(history) if history else 0
        inject = attacks if attacks is not None else demo
        gen = PacketGenerator(PacketConfig(rate=gen_rate or s.demo_packet_rate), seed=seed)
        if inject:
            gen.attacks = demo_attacks(
                start_ms + parse_duration_ms(first_attack),
                every_ms=parse_duration_ms(attack_every),
                count=1000,
                seed=seed,
            )
        source = _generated_feed(gen, start_ms, duration, hist, speed, asap, rate)
    raise typer.Exit(
        run_feed(
            "packets",
            source,
            topic=topic,
            bootstrap=bootstrap,
            show_progress=not no_progress,
            report=report,
            resume=target,
            commit_every=commit_every,
        )
    )


def export(
    stream: Annotated[ExportStream, typer.Argument(help="trades or packets")],
    out: Annotated[Path, typer.Option(help="CSV file to write")],
    seed: Seed = 7,
    start: Annotated[
        str, typer.Option(help="first event time: now, epoch ms or ISO 8601")
    ] = "2024-03-04T15:00:00Z",
    duration: Annotated[str, typer.Option(help="event time to generate")] = "45m",
    gen_rate: Annotated[float, typer.Option(help="mean events/s of the model")] = 1000.0,
    symbols: Annotated[int, typer.Option(help="trades: number of symbols")] = 3000,
    episodes: Annotated[
        bool, typer.Option("--episodes/--no-episodes", help="inject episodes / attacks")
    ] = True,
    first_episode: Annotated[
        str,
        typer.Option(
            help="first episode / attack this long after the start "
            "(trades: after 31m, the longest window of RULES.md)"
        ),
    ] = "32m",
    episode_every: Annotated[str, typer.Option(help="time between episodes / attacks")] = "3m",
) -> None:
    """Write a synthetic stream to CSV (seeded: the same options give the same file)."""
    from tidewatch.wire.csv_io import write_csv

    start_ms = parse_time_ms(start)
    end_ms = start_ms + parse_duration_ms(duration)
    first_ms = start_ms + parse_duration_ms(first_episode)
    every = parse_duration_ms(episode_every)
    n = max(0, (end_ms - first_ms) // every + 1) if episodes else 0
    if stream == ExportStream.trades:
        gen = _trade_generator(
            seed, symbols, gen_rate, start_ms, episodes and n > 0, first_ms, every, max(n, 1)
        )
    else:
        from ingest.packets_gen import PacketConfig, PacketGenerator, demo_attacks

        gen = PacketGenerator(PacketConfig(rate=gen_rate), seed=seed)
        if episodes and n > 0:
            gen.attacks = demo_attacks(first_ms, every_ms=every, count=int(n), seed=seed)
    rows = write_csv(out, gen.chunks(start_ms, end_ms, 10_000), stream.value)
    err.print(f"wrote {rows:,} {stream.value} to {out}")


def register(app: typer.Typer) -> None:
    """Attach ``feed`` and ``export`` to the root ``tidewatch`` app."""
    app.add_typer(feed_app, name="feed")
    app.command("export")(export)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(typer.main.get_command(feed_app)())
