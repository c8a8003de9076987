"""Frame ids: which schema id a Tidewatch Avro frame carries, and which schema an id names.

Every Kafka value is ``0x00 + big-endian int32 schema id + Avro body`` (:mod:`tidewatch.wire.avro`).
Two sources of ids:

* :data:`LOCAL_IDS` (default): the ids of ``schemas/registry.json``, fixed in the repository;
* a Confluent Schema Registry (``settings.schema_registry_url``):
  :class:`tidewatch.wire.registry.RegistryIds` registers each schema and frames records with the
  id the registry gives; a frame id read is looked up in the registry and mapped to our schema of
  the same Avro fingerprint.  Producers that use a registry (Confluent's serializers, Kafka
  Connect) then write records Tidewatch decodes, and Tidewatch's records are read by theirs.

The encoders and decoders of :mod:`tidewatch.wire.avro` use this process's :class:`FrameIds`
(:func:`use_frame_ids`, set once at an entry point from the settings) unless given ``ids``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class FrameIds(Protocol):
    """Which frame id each schema is written with, and which schema a frame id names."""

    def write_id(self, name: str) -> int:
        """The id framed on records of the current schema of ``name``."""
        ...

    def local_id(self, frame_id: int) -> int | None:
        """The ``registry.json`` id of the schema ``frame_id`` names (None: none of ours)."""
        ...


class LocalIds:
    """The ids of ``schemas/registry.json`` (no Schema Registry)."""

    def write_id(self, name: str) -> int:
        from tidewatch.wire.avro import schema_id

        return schema_id(name)

    def local_id(self, frame_id: int) -> int | None:
        from tidewatch.wire.avro import local_schema_ids

        return frame_id if frame_id in local_schema_ids() else None


#: the default :class:`FrameIds`
LOCAL_IDS = LocalIds()
_current: list[FrameIds] = [LOCAL_IDS]


def use_frame_ids(ids: FrameIds | None) -> None:
    """Make ``ids`` (None: :data:`LOCAL_IDS`) this process's frame ids: what ``avro.encode`` and
    ``avro.encode_batch`` write and what the decoders read when not given ``ids``."""
    _current[0] = ids if ids is not None else LOCAL_IDS


def frame_ids() -> FrameIds:
    """This process's frame ids (:func:`use_frame_ids`)."""
    return _current[0]


def accepted_ids(
    name: str, data: np.ndarray, starts: np.ndarray, ends: np.ndarray, ids: FrameIds
) -> np.ndarray:
    """The frame ids (int64) ``avro.decode_batch`` accepts for the current schema of ``name`` in
    the records ``data[starts[i]:ends[i]]``: its ``registry.json`` id with :class:`LocalIds`; else
    the distinct frame ids of the records (read column-wise, one look-up per distinct id) that
    ``ids`` maps to it."""
    from tidewatch.wire.avro import HEADER_LEN, MAGIC, schema_id

    current = schema_id(name)
    if isinstance(ids, LocalIds):
        return np.array([current], np.int64)
    if len(data) == 0:
        return np.zeros(0, np.int64)
    framed = (ends - starts >= HEADER_LEN) & (data[np.minimum(starts, len(data) - 1)] == MAGIC)
    at = starts[framed]
    fids = np.zeros(len(at), np.int64)
    for k in range(1, HEADER_LEN):  # big-endian int32
        fids = (fids << 8) | data[at + k].astype(np.int64)
    return np.array([f for f in np.unique(fids).tolist() if ids.local_id(int(f)) == current], np.int64)
