"""``tidewatch engine …``: run the Spark engine; ``tidewatch backtest``: its evaluation code over files (RULES.md)."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Annotated

import typer


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


def backtest_cmd(
    rules: Annotated[Path, typer.Option("--rules", exists=True, dir_okay=False, help="RULES.jsonl")],
    events: Annotated[list[str], typer.Option("--events", help="STREAM=FILE.csv (repeatable)")],
    every: Annotated[int, typer.Option("--every", help="lookup period in ms")],
    out: Annotated[Path, typer.Option("--out", help="ALERTS.jsonl to write")],
    strategy: Annotated[
        str, typer.Option("--strategy", help="shared (collective indexes) or naive")
    ] = "shared",
    strict: Annotated[bool, typer.Option("--strict", help="exit 1 on any malformed CSV row")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
) -> None:
    """Run rules over event files with the engine's evaluation code (RULES.md backtest contract)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.evaluation.backtest import BacktestInputError, MalformedRows, RuleFileError, run_backtest
    from engine.runtime.gc_tuning import tune_gc
    from tidewatch.settings import get_settings

    settings = get_settings()
    tune_gc(settings.engine_gc_threshold)  # one alert allocates a few objects: see engine.runtime.gc_tuning
    if strategy not in ("shared", "naive"):
        _err("--strategy must be 'shared' or 'naive'")
        raise typer.Exit(2)
    pairs: list[tuple[str, str | Path]] = []
    for spec in events:
        stream, sep, path = spec.partition("=")
        if not sep or not path:
            _err(f"--events expects STREAM=FILE, got {spec!r}")
            raise typer.Exit(2)
        if not Path(path).is_file():
            _err(f"--events {spec}: no such file")
            raise typer.Exit(2)
        pairs.append((stream.strip(), path))

    console = Console(stderr=True)
    shown = {"n": 0}

    def on_malformed(path: str, line: int, reason: str) -> None:
        shown["n"] += 1
        if shown["n"] <= 100:
            console.print(f"[yellow]{path}:{line}: malformed row skipped: {reason}[/yellow]", highlight=False)
        elif shown["n"] == 101:
            console.print("[yellow]... further malformed rows not shown[/yellow]")

    progress = Progress(
        TextColumn("backtest"), BarColumn(), MofNCompleteColumn(), TextColumn("lookups"), TimeElapsedColumn(),
        console=console, disable=quiet or not console.is_terminal, transient=False,
    )  # fmt: skip
    task = progress.add_task("lookups", total=None)

    def on_progress(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    try:
        with progress, out.open("w") as fh:
            result = run_backtest(
                rules, pairs, every, fh, strategy=strategy, on_malformed=on_malformed, strict=strict,
                progress=on_progress, settings=settings,
            )  # fmt: skip
    except RuleFileError as exc:
        _err(str(exc))
        raise typer.Exit(2) from None
    except MalformedRows as exc:  # --strict and malformed rows: exit 1 (RULES.md)
        _err(f"backtest: {exc}")
        raise typer.Exit(1) from None
    except BacktestInputError as exc:
        _err(f"backtest: {exc}")
        raise typer.Exit(2) from None
    if result.malformed:
        console.print(f"{result.malformed} malformed row(s) skipped", highlight=False)
    console.print(result.summary(), highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add the ``engine`` command group and ``backtest`` to the root CLI."""
    app.command("backtest")(backtest_cmd)
    engine = typer.Typer(
        help="The Spark engine: Kafka in, shared indexes, exact alerts out.", no_args_is_help=True
    )

    @engine.command("run")
    def run(
        master: Annotated[
            str | None, typer.Option(help="Spark master (default: settings; local[2], spark://h:7077)")
        ] = None,
        pane_ms: Annotated[
            int | None, typer.Option("--pane-ms", help="pane width g in ms (divides every window)")
        ] = None,
        trigger: Annotated[float | None, typer.Option(help="micro-batch trigger interval in seconds")] = None,
        checkpoint: Annotated[
            Path | None, typer.Option(help="checkpoint dir (Spark offsets, batch log, snapshots)")
        ] = None,
        bootstrap: Annotated[
            str | None, typer.Option(help="Kafka bootstrap servers (default: settings)")
        ] = None,
        database_url: Annotated[
            str | None, typer.Option(help="SQLAlchemy URL of PostgreSQL (default: settings)")
        ] = None,
        engine_id: Annotated[
            str, typer.Option(help="engine instance id (Kafka transactional id suffix)")
        ] = "default",
        max_offsets_per_trigger: Annotated[
            int | None, typer.Option(help="cap on Kafka records per micro-batch")
        ] = None,
        run_seconds: Annotated[
            float | None, typer.Option(help="stop after this many seconds (default: until Ctrl-C)")
        ] = None,
    ) -> None:
        """Run the engine until interrupted (SIGINT / SIGTERM stop it cleanly)."""
        from engine.app import EngineApp
        from engine.spark_session import build_spark
        from tidewatch.settings import get_settings

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # py4j logs every call from the JVM at INFO ("Received command c on object id p0"): one
        # line per micro-batch that says nothing to an operator
        logging.getLogger("py4j").setLevel(logging.WARNING)
        update = {
            k: v
            for k, v in {
                "spark_master": master,
                "pane_ms": pane_ms,
                "trigger_seconds": trigger,
                "checkpoint_dir": checkpoint,
                "kafka_bootstrap": bootstrap,
                "database_url": database_url,
            }.items()
            if v is not None
        }
        settings = get_settings().model_copy(update=update)
        spark = build_spark(settings, "tidewatch-engine")
        app = EngineApp(settings, engine_id=engine_id)
        query = app.start(spark, max_offsets_per_trigger=max_offsets_per_trigger)
        stop = {"now": False}

        def _stop(*_: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        t_end = None if run_seconds is None else time.monotonic() + run_seconds
        try:
            while not stop["now"] and query.isActive and (t_end is None or time.monotonic() < t_end):
                time.sleep(0.5)
            if query.exception() is not None:
                raise typer.Exit(1)
        finally:
            query.stop()
            app.close()
            spark.stop()
            typer.echo(
                f"engine stopped: {int(app.totals['events'])} events, {int(app.totals['alerts'])} alerts, "
                f"{int(app.totals['dead_letters'])} dead letters in {app.batches_done} batches"
            )

    app.add_typer(engine, name="engine")
