"""SQLAlchemy engine and session factory of a database URL (callers pass ``settings.sqlalchemy_url``).

A SQLAlchemy :class:`~sqlalchemy.Engine` is a *db engine* here (:func:`make_db_engine`,
:func:`get_db_engine`, variables ``db_engine``), never to be confused with Tidewatch's engine
(the :mod:`engine` package).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker


def make_db_engine(url: str, **kw: object) -> Engine:
    """A new SQLAlchemy engine (pool pre-ping on: the embedded server may be restarted under us)."""
    return create_engine(url, pool_pre_ping=True, future=True, **kw)  # type: ignore[arg-type]


@lru_cache(maxsize=8)
def get_db_engine(url: str) -> Engine:
    """The process-wide SQLAlchemy engine for ``url``."""
    return make_db_engine(url)


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(bind=get_db_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on error."""
    with session_factory(url)() as session, session.begin():
        yield session
