"""Run Alembic migrations programmatically (``tidewatch up``, ``tidewatch db …``, tests)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from tidewatch.settings import PROJECT_ROOT


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for ``url``, independent of the cwd (without a URL, ``migrations/env.py``
    reads the settings' URL; :func:`head` needs none)."""
    ini = PROJECT_ROOT / "alembic.ini"
    cfg = Config(str(ini)) if ini.exists() else Config()
    cfg.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    if url:
        cfg.attributes["url"] = url
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The revision the database is at (``None`` when unversioned)."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine, pool

    db_engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with db_engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        db_engine.dispose()


def head() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()
