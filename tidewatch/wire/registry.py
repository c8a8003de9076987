"""Confluent Schema Registry wire compatibility (``settings.schema_registry_url``).

With a registry, the schema id in every Tidewatch frame (:mod:`tidewatch.wire.avro`) is the id
the registry gives, not ``schemas/registry.json``'s:

* writing: the current schema of each stream is registered under the subject
  ``<topic>-value`` (Confluent's default ``TopicNameStrategy``; the topics from the settings) the
  first time a record of it is encoded, and records are framed with the id the registry returns;
* reading: a frame id not seen before is looked up in the registry (``GET /schemas/ids/{id}``,
  once per id and process: ids are immutable) and mapped to the schema of ``registry.json`` with
  the same Avro Parsing Canonical Form fingerprint (Avro specification, "Schema Fingerprints"),
  any version of it.  An id the registry does not know, or a schema that is none of ours,
  names no schema: such records are undecodable (dead letters), as records with a wrong id.

The registry is reached through confluent-kafka's ``SchemaRegistryClient``, so a Confluent
Schema Registry, Karapace or Apicurio Registry's Confluent-compatible API (``/apis/ccompat/v7``)
all work.  A registry that cannot be reached raises :class:`SchemaRegistryError`: a record is never
dead-lettered because the registry was down.

:func:`install` (called by ``tidewatch.cli`` for every command) makes a :class:`RegistryIds` this
process's frame ids when the setting is set; it connects lazily, at the first record.  Without a
registry (the default) the ids of ``registry.json`` are used and nothing here runs.  Records
framed with one kind of id are not readable with the other: a topic switches with its producers
and readers together (docs/feeds.md, "Schema Registry").
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from tidewatch.errors import TidewatchError
from tidewatch.wire import avro
from tidewatch.wire.frame_ids import use_frame_ids

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from tidewatch.settings import Settings


class SchemaRegistryError(TidewatchError, RuntimeError):
    """The Schema Registry could not be reached or refused a request."""


def subjects(settings: Settings) -> dict[str, str]:
    """Schema name -> its registry subject, ``<topic>-value`` of the topic its records go to."""
    topics = {
        "trades": settings.topic_trades,
        "packets": settings.topic_packets,
        "alerts": settings.topic_alerts,
        "results": settings.topic_results,
        "dead_letter": settings.topic_dead_letter,
    }
    return {name: f"{topic}-value" for name, topic in topics.items()}


def fingerprint(schema: Any) -> str:
    """The CRC-64-AVRO fingerprint of the Parsing Canonical Form of ``schema`` (JSON text or dict)."""
    from fastavro.schema import fingerprint as fp
    from fastavro.schema import to_parsing_canonical_form

    parsed = json.loads(schema) if isinstance(schema, str) else schema
    return str(fp(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


@cache
def local_fingerprints() -> dict[str, int]:
    """Fingerprint -> ``registry.json`` id of every schema there (the current one wins a tie)."""
    out: dict[str, int] = {}
    current = {avro.schema_id(n) for n in avro.schema_names()}
    for sid in sorted(avro.local_schema_ids()):
        f = fingerprint(avro.schema_json_by_id(sid))
        if f not in out or sid in current:
            out[f] = sid
    return out


def _not_found(exc: Exception) -> bool:
    return getattr(exc, "http_status_code", None) == 404


class RegistryIds:
    """:class:`tidewatch.wire.frame_ids.FrameIds` of a Schema Registry (module docstring).
    Thread-safe; each id is asked for once."""

    def __init__(self, client: SchemaRegistryClient, subject_of: Mapping[str, str]) -> None:
        self.client = client
        self.subject_of = dict(subject_of)
        self._write: dict[str, int] = {}
        self._local: dict[int, int | None] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> RegistryIds:
        """The registry at ``settings.schema_registry_url`` (no request is made here)."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        if not settings.schema_registry_url:
            raise ValueError("schema_registry_url is not set")
        return cls(SchemaRegistryClient({"url": settings.schema_registry_url}), subjects(settings))

    def write_id(self, name: str) -> int:
        """Register the current schema of ``name`` under its subject (idempotent: an identical
        schema keeps its id) and return the id."""
        with self._lock:
            if name in self._write:
                return self._write[name]
        from confluent_kafka.schema_registry import Schema

        text = avro.load_schema_json(name)
        try:
            sid = int(self.client.register_schema(self.subject_of[name], Schema(text, "AVRO")))
        except Exception as exc:  # SchemaRegistryError of confluent-kafka, or the HTTP client's
            raise SchemaRegistryError(f"registering {name!r} under {self.subject_of[name]!r}: {exc}") from exc
        with self._lock:
            self._write[name] = sid
            self._local[sid] = avro.schema_id(name)
        return sid

    def local_id(self, frame_id: int) -> int | None:
        """The ``registry.json`` id of the schema the registry has under ``frame_id`` (None: the
        registry has no such id, or the schema is none of ours)."""
        with self._lock:
            if frame_id in self._local:
                return self._local[frame_id]
        try:
            schema = self.client.get_schema(frame_id)
        except Exception as exc:
            if not _not_found(exc):
                raise SchemaRegistryError(f"looking up schema id {frame_id}: {exc}") from exc
            local = None
        else:
            local = None
            if (schema.schema_type or "AVRO").upper() == "AVRO" and schema.schema_str:
                try:
                    local = local_fingerprints().get(fingerprint(schema.schema_str))
                except (ValueError, TypeError, KeyError):  # not parseable Avro
                    local = None
        with self._lock:
            self._local[frame_id] = local
        return local

    def register_all(self) -> dict[str, int]:
        """Register every current schema now; name -> id (e.g. to fail early at start-up)."""
        return {name: self.write_id(name) for name in avro.schema_names()}


def install(settings: Settings) -> RegistryIds | None:
    """This process's frame ids from ``settings``: a :class:`RegistryIds` when
    ``schema_registry_url`` is set (returned), else ``registry.json``'s (None)."""
    ids = RegistryIds.from_settings(settings) if settings.schema_registry_url else None
    use_frame_ids(ids)
    return ids
