"""Helpers for tests that tamper with state snapshots (:mod:`engine.runtime.state_codec`)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

from engine.runtime.state_codec import _HEADER


def split(data: bytes) -> tuple[int, dict[str, Any], bytes]:
    """(format version, JSON document, data section) of a snapshot."""
    _, version, _, doc_len, _ = _HEADER.unpack_from(data)
    doc = json.loads(data[_HEADER.size : _HEADER.size + doc_len].rstrip(b"\x00"))
    return version, doc, data[_HEADER.size + doc_len :]


def build(
    doc: dict[str, Any], section: bytes, version: int | None = None, magic: bytes | None = None
) -> bytes:
    """A snapshot of ``doc`` and ``section`` with a correct checksum (a well-formed file of any content)."""
    from engine.runtime.state_codec import FORMAT_VERSION, MAGIC

    raw = json.dumps(doc).encode()
    raw += bytes(-len(raw) % 64)
    crc = zlib.crc32(section, zlib.crc32(raw))
    head = _HEADER.pack(
        magic or MAGIC, FORMAT_VERSION if version is None else version, crc, len(raw), len(section)
    )
    return head + raw + section


def rewrite(data: bytes, edit: Callable[[str], str]) -> bytes:
    """``data`` with its document's JSON text edited by ``edit`` (checksum redone)."""
    _, doc, section = split(data)
    return build(json.loads(edit(json.dumps(doc))), section)
