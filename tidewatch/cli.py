"""The ``tidewatch`` command line.

Each area registers its own sub-commands from its own package (imported explicitly below),
so the CLI is a thin shell over the library:

* ``tidewatch up | down | status | restart`` -- the embedded stack (:mod:`tidewatch.stack.embedded`;
  the apps under supervisord: :mod:`tidewatch.stack.supervision`)
* ``tidewatch rules …``, ``backtest``,
  ``subscribe``, ``subscriptions …``        -- rules and subscriptions (:mod:`subscriptions.cli`, :mod:`engine.cli`)
* ``tidewatch feed …``, ``export``          -- feeds (:mod:`ingest.cli`)
* ``tidewatch engine …``                    -- the Spark engine (:mod:`engine.cli`)
* ``tidewatch kafka TOOL …``                -- Kafka's own command-line tools (:mod:`tidewatch.kafka.tools`)
"""

from __future__ import annotations

import inspect

import typer

from dashboard import cli as dashboard_cli
from dashboard import tail as alerts_tail
from engine import cli as engine_cli
from ingest import cli as ingest_cli
from subscriptions import cli as subscriptions_cli
from tidewatch.kafka import tools as kafka_tools
from tidewatch.stack import embedded as stack

app = typer.Typer(
    name="tidewatch",
    help="Tidewatch: standing rules over live trade and packet streams, evaluated together "
    "through shared sliding-window indexes.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)


@app.callback()
def _root() -> None:
    """Tidewatch: standing rules over live trade and packet streams, evaluated together."""
    from tidewatch.settings import get_settings

    if get_settings().schema_registry_url:  # frame ids from a Schema Registry (tidewatch/wire/registry.py)
        from tidewatch.wire import registry

        registry.install(get_settings())


@app.command()
def version() -> None:
    """Print Tidewatch's version and the versions of the real parts it runs on."""
    from importlib.metadata import version as pkg_version

    from tidewatch.settings import get_settings

    settings = get_settings()
    typer.echo(f"tidewatch {pkg_version('tidewatch')}")
    typer.echo(f"pyspark {pkg_version('pyspark')} (Spark {settings.spark_version})")
    typer.echo(f"Apache Kafka {settings.kafka_version} (embedded)")


#: a line of a help paragraph that stays on its own line: a list item or an indented example
_OWN_LINE = ("* ", "- ", "• ", "    ")


def reflow(text: str) -> str:
    """A command's help with each paragraph's lines joined, as a terminal user reads it.

    Typer's rich help keeps a docstring's single line breaks after the first paragraph, so a
    paragraph wrapped at the source's width came out cut short at every source line inside
    the terminal's own wrapping.  Here a line is joined to the one before unless it starts a
    list item or is indented as an example (``_OWN_LINE``); paragraphs starting with Click's
    ``\\b`` (keep as is) and everything after ``\\f`` (the developer's notes, not shown) are
    left alone."""
    shown, cut, rest = inspect.cleandoc(text).partition("\f")
    out = []
    for para in shown.split("\n\n"):
        if para.startswith("\b"):
            out.append(para)
            continue
        lines: list[str] = []
        for line in para.splitlines():
            if lines and not line.startswith(_OWN_LINE) and not line.lstrip().startswith(_OWN_LINE[:3]):
                lines[-1] = f"{lines[-1]} {line.strip()}"
            else:
                lines.append(line.rstrip())
        out.append("\n".join(lines))
    return "\n\n".join(out) + cut + rest


def reflow_help(typer_app: typer.Typer) -> None:
    """:func:`reflow` the help of every command under ``typer_app``, its groups' too."""
    for info in typer_app.registered_commands:
        doc = info.help or (inspect.getdoc(info.callback) if info.callback else None)
        if doc:
            info.help = reflow(doc)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)


# Each area adds its own commands; the order is the order of ``tidewatch --help``.
for _area in (stack, subscriptions_cli, engine_cli, ingest_cli, dashboard_cli, alerts_tail, kafka_tools):
    _area.register(app)
reflow_help(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
