"""``tidewatch db``: the database schema's Alembic migrations (``migrations/``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from tidewatch.settings import get_settings

out = Console()

db_app = typer.Typer(help="Database schema (Alembic migrations in migrations/).", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Migrate the database up to REVISION (default head)."""
    from tidewatch.db import migrate as db_migrate

    url = get_settings().sqlalchemy_url
    db_migrate.upgrade(url, revision=revision)
    out.print(f"database at {db_migrate.current(url)}")


@db_app.command("downgrade")
def db_downgrade(revision: Annotated[str, typer.Argument(help="target revision, e.g. base or -1")]) -> None:
    """Migrate the database down to REVISION."""
    from tidewatch.db import migrate as db_migrate

    url = get_settings().sqlalchemy_url
    db_migrate.downgrade(url, revision=revision)
    out.print(f"database at {db_migrate.current(url)}")


@db_app.command("current")
def db_current() -> None:
    """Print the revision the database is at."""
    from tidewatch.db import migrate as db_migrate

    out.print(str(db_migrate.current(get_settings().sqlalchemy_url)))
