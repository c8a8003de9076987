"""Tidewatch's PostgreSQL schema (SQLAlchemy 2 models) and session factory.

The schema is managed by Alembic (``migrations/``); :mod:`tidewatch.db.migrate` runs it.
"""
