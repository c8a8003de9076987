"""The root of every Tidewatch error.

Every exception Tidewatch raises on purpose derives from :class:`TidewatchError`, through the
root of its own package (as in Quix Streams: one root per package):

* ``tidewatch`` (base layer): the base errors derive from :class:`TidewatchError` itself --
  :class:`tidewatch.kafka.txn.KafkaStalled`, :class:`tidewatch.kafka.client.KafkaTlsConfigError`,
  :class:`tidewatch.wire.csv_io.CsvError`,
  :class:`tidewatch.wire.avro.AvroDecodeError`, the launcher's
  :class:`tidewatch.stack.processes.StartupFailed`;
* :class:`subscriptions.errors.SubscriptionsError`, :class:`engine.errors.EngineError`,
  :class:`ingest.errors.IngestError`, :class:`dashboard.errors.DashboardError`.

An error that used to be a ``ValueError`` or a ``RuntimeError`` still is one (it keeps that
builtin base after its Tidewatch root), so ``except ValueError`` keeps catching it.  Errors
are told apart by their type (or, for Kafka's, by the error code), never by their text.
"""

from __future__ import annotations

__all__ = ["TidewatchError"]


class TidewatchError(Exception):
    """The root of every Tidewatch error (see the module docstring)."""
