"""Launchers of the embedded stack's real services (Kafka, PostgreSQL) and its app processes.

Everything here runs on this machine without a container engine: Kafka from the Maven
Central jars in ``.cache/kafka/<version>/libs`` (see :mod:`tidewatch.jars`),
PostgreSQL from Debian's ``postgresql`` package, each with its own data dir and a private
port on 127.0.0.1 under ``settings.run_dir``.
"""
