"""The ``tidewatch`` command line.

Each area registers its own sub-commands from its own package, so the CLI is a
thin shell over the library:

* ``tidewatch up | down | status``          -- the embedded stack (:mod:`tidewatch.stack`)
* ``tidewatch rules …``, ``backtest``,
  ``subscribe``, ``subscriptions …``        -- rules and subscriptions (:mod:`subscriptions.cli`)
* ``tidewatch feed …``, ``export``          -- feeds (:mod:`ingest.cli`)
* ``tidewatch engine …``                    -- the Spark engine (:mod:`engine.cli`)
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="tidewatch",
    help="Tidewatch: standing rules over live trade and packet streams, evaluated together "
    "through shared sliding-window indexes.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)

# (module, attribute) pairs; each module exposes ``register(app: typer.Typer) -> None``.
_AREAS = [
    "tidewatch.stack",
    "subscriptions.cli",
    "subscriptions.store_cli",
    "ingest.cli",
    "engine.cli",
    "dashboard.cli",
]


def _register_areas() -> None:
    for name in _AREAS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # an area not built yet
            if exc.name == name:
                continue
            raise
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


@app.callback()
def _root() -> None:
    """Tidewatch: standing rules over live trade and packet streams, evaluated together."""


@app.command()
def version() -> None:
    """Print Tidewatch's version and the versions of the real parts it runs on."""
    from importlib.metadata import version as pkg_version

    from tidewatch.settings import get_settings

    settings = get_settings()
    typer.echo(f"tidewatch {pkg_version('tidewatch')}")
    typer.echo(f"pyspark {pkg_version('pyspark')} (Spark {settings.spark_version})")
    typer.echo(f"Apache Kafka {settings.kafka_version} (embedded)")


_register_areas()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
