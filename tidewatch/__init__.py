"""Tidewatch's base layer: settings, stream schemas, wire formats, Kafka and PostgreSQL helpers.

Layers, lowest first: ``tidewatch`` (this package) -> ``subscriptions`` -> ``engine`` ->
``ingest``, ``dashboard`` -> the launcher (:mod:`tidewatch.cli`, :mod:`tidewatch.stack`).
:class:`TidewatchError` is the root of every Tidewatch error (:mod:`tidewatch.errors`); the
base errors below derive from it directly.  Names other than the error root are imported on
first use (:mod:`tidewatch.lazy`).
"""

from __future__ import annotations

from tidewatch.errors import TidewatchError
from tidewatch.lazy import lazy_exports

TYPE_CHECKING = False  # not typing's: importing typing costs more than this package
if TYPE_CHECKING:
    from tidewatch.kafka.topics import TopicSpec, topic_spec, topic_specs
    from tidewatch.kafka.txn import KafkaStalled
    from tidewatch.settings import Settings, get_settings
    from tidewatch.wire.avro import AvroDecodeError
    from tidewatch.wire.csv_io import CsvError

__all__ = [
    "AvroDecodeError",
    "CsvError",
    "KafkaStalled",
    "Settings",
    "TidewatchError",
    "TopicSpec",
    "get_settings",
    "topic_spec",
    "topic_specs",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AvroDecodeError": "tidewatch.wire.avro",
        "CsvError": "tidewatch.wire.csv_io",
        "KafkaStalled": "tidewatch.kafka.txn",
        "Settings": "tidewatch.settings",
        "TopicSpec": "tidewatch.kafka.topics",
        "get_settings": "tidewatch.settings",
        "topic_spec": "tidewatch.kafka.topics",
        "topic_specs": "tidewatch.kafka.topics",
    },
)
