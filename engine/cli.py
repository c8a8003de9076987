"""``tidewatch engine …``: run the Spark engine; ``tidewatch backtest``: its evaluation code over files (RULES.md)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from tidewatch.settings import Settings

log = logging.getLogger("engine.cli")
#: how long a stop waits for the micro-batch in progress before stopping the query anyway
STOP_DRAIN_S = 25.0
#: a batch that arrives while the query is being stopped starts its Spark jobs this much later,
#: after ``StreamingQuery.stop()`` has cancelled what was running (nothing of this batch)
STOP_HOLD_S = 1.0


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


def backtest_cmd(
    rules: Annotated[Path, typer.Option("--rules", exists=True, dir_okay=False, help="RULES.jsonl")],
    events: Annotated[list[str], typer.Option("--events", help="STREAM=FILE.csv (repeatable)")],
    every: Annotated[int, typer.Option("--every", help="lookup period in ms")],
    out: Annotated[Path, typer.Option("--out", help="ALERTS.jsonl to write")],
    strategy: Annotated[
        str,
        typer.Option(
            "--strategy",
            help="shared (collective indexes), naive (per rule) or scan (no index, aggregates shared)",
        ),
    ] = "shared",
    strict: Annotated[bool, typer.Option("--strict", help="exit 1 on any malformed CSV row")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
) -> None:
    """Run rules over event files with the engine's evaluation code (RULES.md backtest contract)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.evaluation.backtest import BacktestInputError, MalformedRows, RuleFileError, run_backtest
    from engine.runtime.gc_tuning import tune_gc
    from engine.runtime.hugepages import numpy_hugepages
    from tidewatch.settings import get_settings

    settings = get_settings()
    tune_gc(settings.engine_gc_threshold)  # one alert allocates a few objects: see engine.runtime.gc_tuning
    numpy_hugepages(settings.engine_numpy_hugepages)  # growing state arrays: see engine.runtime.hugepages
    if strategy not in ("shared", "naive", "scan"):
        _err("--strategy must be 'shared', 'naive' or 'scan'")
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
        with progress, out.open("wb") as fh:  # ASCII lines, written as built (alert_lines)
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
        shards: Annotated[
            int | None,
            typer.Option(
                help="sharded evaluation: the indexes held in Spark's executors, N shards by key "
                "(default: settings, 1; 0: on the driver; fixed for a checkpoint; on one machine 1: "
                "more shards on one executor take its Python workers in turn)",
                min=0,
                max=64,
            ),
        ] = None,
    ) -> None:
        """Run the engine until interrupted (Ctrl-C or SIGTERM stop it cleanly, exit 0).

        A stop waits for the micro-batch in progress, stops the streaming query between two
        batches, then Spark.  A fatal error exits 1.  Either way the dashboard's Health view and
        `tidewatch status` say how the run ended.
        \f
        The stop: :class:`StopGate`; the run record: :mod:`engine.liveness`."""
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
                "engine_shards": shards,
            }.items()
            if v is not None
        }
        settings = get_settings().model_copy(update=update)
        code = run_engine(settings, engine_id, max_offsets_per_trigger, run_seconds)
        if code:
            raise typer.Exit(code)

    app.add_typer(engine, name="engine")


class StopGate:
    """Wraps the engine's ``foreachBatch`` function so that the streaming query can be stopped
    *between* two micro-batches.

    ``StreamingQuery.stop()`` interrupts the query's thread and cancels the Spark jobs running:
    one in the middle of a batch's ``toArrow()`` made the Python callback fail (py4j logged its
    ``SPARK_JOB_CANCELLED`` stack trace) and the JVM's check of that huge message overflowed
    its stack (~1,170 log lines per stop, issue #21); one while the thread wrote its checkpoint
    logged Hadoop's ``InterruptedException``.  :meth:`stop` waits for the batch in progress to
    finish (at most ``drain_s``), then for the next batch to reach this gate (at most
    ``next_s``; it is held there, the query's thread waiting in the callback, nothing of Spark
    running), stops the query, and lets the held batch go on ``hold_s`` later: the cancel has
    then passed, the batch runs to its end and the query ends after it.  Nothing is skipped: a
    batch either completes or never started."""

    def __init__(
        self, fn: Any, *, drain_s: float = STOP_DRAIN_S, next_s: float = 3.0, hold_s: float = STOP_HOLD_S
    ) -> None:
        self._fn, self._drain_s, self._next_s, self._hold_s = fn, drain_s, next_s, hold_s
        self._cv = threading.Condition()
        self._busy = 0
        self._held = 0
        self._closing = False
        self._issued = False

    def __call__(self, df: Any, batch_id: int) -> None:
        with self._cv:
            held = self._closing and not self._issued
            self._held += held
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self._closing or self._issued)
            self._held -= held
            self._busy += 1
        try:
            if held:
                time.sleep(self._hold_s)
                _clear_interrupt(df, batch_id)
            self._fn(df, batch_id)
        finally:
            with self._cv:
                self._busy -= 1
                self._cv.notify_all()

    def stop(self, query: Any) -> bool:
        """Stop ``query`` between batches; False if the batch in progress outlasted ``drain_s``
        (the query is stopped anyway, cancelling it)."""
        with self._cv:
            self._closing = True
            between = self._cv.wait_for(lambda: self._busy == 0, timeout=self._drain_s)
            if between:  # an idle stream: no batch comes, the query is stopped while it waits
                self._cv.wait_for(lambda: self._held > 0, timeout=self._next_s)
            self._issued = True
            self._cv.notify_all()
        if not between:
            log.warning("the batch in progress did not finish in %.0f s: stopping it", self._drain_s)
        query.stop()
        return between


def _clear_interrupt(df: Any, batch_id: int) -> None:
    """Clear the interrupt ``StreamingQuery.stop()`` left on the query's JVM thread, so that the
    held batch's jobs and checkpoint writes run to their end (the query still ends after it).
    py4j pins threads: a call made while serving the JVM's callback runs on the calling thread."""
    try:
        was = df.sparkSession._jvm.java.lang.Thread.interrupted()
        log.info(
            "stop: batch %d came while the query stopped: it runs to its end first (interrupt cleared: %s)",
            batch_id,
            was,
        )
    except Exception as exc:  # noqa: BLE001 -- best effort: the batch runs anyway
        log.warning("stop: could not clear the query thread's interrupt: %s", type(exc).__name__)


def run_engine(
    settings: Settings, engine_id: str, max_offsets_per_trigger: int | None, run_seconds: float | None
) -> int:
    """Run the engine until SIGTERM / SIGINT (0), ``run_seconds`` (0) or a fatal error (1),
    recording the run's start and end (:mod:`engine.liveness`)."""
    from datetime import UTC, datetime

    from engine import liveness
    from engine.app import EngineApp
    from engine.shards.engine import ShardedEngine
    from engine.spark_session import build_spark

    stop = threading.Event()

    def _stop(*_: object) -> None:
        stop.set()

    def _install() -> None:
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)

    _install()
    liveness.write_record(settings, liveness.started(settings, engine_id))
    spark: Any = None
    app: Any = None
    query: Any = None
    gate: StopGate | None = None
    failure: BaseException | None = None
    t_end = None if run_seconds is None else time.monotonic() + run_seconds
    try:
        spark = build_spark(settings, "tidewatch-engine")
        # PySpark's SparkContext takes SIGINT (it cancels every job, then raises
        # KeyboardInterrupt in the main thread): Ctrl-C is a stop between batches here too
        _install()
        app = (
            ShardedEngine(settings, engine_id=engine_id)
            if settings.engine_shards
            else EngineApp(settings, engine_id=engine_id)
        )
        gate = StopGate(app.on_batch, next_s=max(3.0, 2 * settings.trigger_seconds))
        query = app.start(spark, max_offsets_per_trigger=max_offsets_per_trigger, wrap=lambda _fn: gate)
        while not stop.is_set() and query.isActive and (t_end is None or time.monotonic() < t_end):
            stop.wait(0.5)
        failure = query.exception()
    except Exception as exc:  # noqa: BLE001 -- every fatal error is recorded, then exits 1
        failure = exc
    finally:
        failure = _shutdown(spark, app, query, gate, failure)
    if failure is not None:
        rec = liveness.failed(engine_id, failure, settings)
        log.error("engine failed: %s", rec.failure, exc_info=failure)
        log.error("hint: %s", rec.hint)
        liveness.write_record(settings, rec)
        return 1
    liveness.write_record(settings, liveness.RunRecord(engine_id, "stopped", datetime.now(UTC)))
    if app is not None:
        typer.echo(
            f"engine stopped: {int(app.totals['events'])} events, {int(app.totals['alerts'])} alerts, "
            f"{int(app.totals['dead_letters'])} dead letters in {app.batches_done} batches"
        )
    return 0


def _shutdown(
    spark: Any, app: Any, query: Any, gate: StopGate | None, failure: BaseException | None
) -> BaseException | None:
    """Stop the query (between batches), close the app, stop Spark; the first error of these
    becomes the run's failure when it had none."""
    steps: list[Any] = []
    if query is not None and query.isActive:
        steps.append(lambda: gate.stop(query) if gate is not None else query.stop())
    if app is not None:
        steps.append(app.close)
    if spark is not None:
        steps.append(spark.stop)
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 -- go on stopping; keep the first error
            log.warning(
                "while stopping: %s: %s", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""
            )
            failure = failure or exc
    return failure
