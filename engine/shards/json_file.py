"""A small JSON document of the engine's checkpoint directory that the driver replaces whole
(:func:`~engine.runtime.snapshot_writer.atomic_write`) and the shards read: the overload strides
(:mod:`engine.shards.strides`) and the pending chart requests (:mod:`engine.shards.charts`).

One reading rule for both: a file that does not exist yet is ``default`` (nothing decided or
asked yet); a file that cannot be read or parsed, or is not of the shape its reader expects, is
:class:`~engine.errors.CheckpointMismatch` naming the file and what to do -- never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from engine.errors import CheckpointMismatch

__all__ = ["RESTORE_ADVICE", "read_json"]

_T = TypeVar("_T")

#: what the user does about a damaged checkpoint file
RESTORE_ADVICE = (
    "the checkpoint directory must be whole; restore it, or start with a new checkpoint "
    "directory and a new --engine-id"
)


def read_json(path: Path, what: str, default: _T, shaped: Callable[[Any], _T]) -> _T:
    """``shaped(document)`` of the JSON file ``path`` (``default`` when there is none).
    ``shaped`` checks the document and gives the reader's value of it, raising ``ValueError``,
    ``TypeError`` or ``KeyError`` on a document of another shape; ``what`` names the file in
    the error (e.g. ``"the overload policy's strides file"``)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        raise CheckpointMismatch(f"{what} {path} cannot be read ({exc}): {RESTORE_ADVICE}") from exc
    try:
        return shaped(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointMismatch(
            f"{what} {path} is not one this engine wrote ({type(exc).__name__}: {exc}): {RESTORE_ADVICE}"
        ) from exc
