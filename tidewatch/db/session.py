"""Engine and session factory from ``settings.sqlalchemy_url``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

from tidewatch.settings import get_settings


def make_engine(url: str | None = None, **kw: object) -> Engine:
    """A new engine (pool pre-ping on: the embedded server may be restarted under us)."""
    return create_engine(url or get_settings().sqlalchemy_url, pool_pre_ping=True, future=True, **kw)  # type: ignore[arg-type]


@lru_cache(maxsize=8)
def get_engine(url: str | None = None) -> Engine:
    """The process-wide engine for ``url`` (default: the settings' URL)."""
    return make_engine(url)


def session_factory(url: str | None = None) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on error."""
    with session_factory(url)() as session, session.begin():
        yield session
