"""``tidewatch engine …``: run the Spark engine."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add the ``engine`` command group to the root CLI."""
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
        source: Annotated[
            str | None,
            typer.Option(
                help="how to read Kafka: 'spark' (Spark's Kafka source, scales with executors) or "
                "'direct' (a Kafka consumer in the driver: one machine, less CPU)"
            ),
        ] = None,
        run_seconds: Annotated[
            float | None, typer.Option(help="stop after this many seconds (default: until Ctrl-C)")
        ] = None,
    ) -> None:
        """Run the engine until interrupted (SIGINT / SIGTERM stop it cleanly)."""
        from engine.app import EngineApp
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
                "engine_source": source,
            }.items()
            if v is not None
        }
        if source is not None and source not in ("spark", "direct"):
            raise typer.BadParameter(f"--source must be 'spark' or 'direct', not {source!r}")
        settings = get_settings().model_copy(update=update)
        spark = None
        if settings.engine_source == "spark":
            from engine.spark_session import build_spark

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
            if spark is not None:
                spark.stop()
            typer.echo(
                f"engine stopped: {int(app.totals['events'])} events, {int(app.totals['alerts'])} alerts, "
                f"{int(app.totals['dead_letters'])} dead letters in {app.batches_done} batches"
            )

    app.add_typer(engine, name="engine")
