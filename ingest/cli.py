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
line becomes a summary line every 10 s.  The commands only parse their options: the
feeds' logic (sources, pacing, resume, sending) is in :mod:`ingest.feed`.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ingest.feed import (
    _file_feed,
    _generated_feed,
    _history_not_in_topic,
    _resume_target,
    _trade_generator,
    err,
    parse_duration_ms,
    parse_time_ms,
    run_feed,
)
from tidewatch.settings import get_settings

feed_app = typer.Typer(help="Send trades or packets into Kafka (Avro).", no_args_is_help=True)


class ExportStream(StrEnum):
    trades = "trades"
    packets = "packets"


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
    target = _resume_target(s, "trades", csv, resume, progress_file, topic)
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
            hist = _history_not_in_topic(s, "trades", start_ms, hist, topic, bootstrap)
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
            size_median=s.demo_trade_size_median if demo else None,
        )
        source = _generated_feed(gen, start_ms, duration, hist, speed, asap, rate)
    raise typer.Exit(
        run_feed(
            "trades",
            source,
            settings=s,
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
    target = _resume_target(s, "packets", pcap or csv, resume, progress_file, topic)
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
            settings=s,
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
