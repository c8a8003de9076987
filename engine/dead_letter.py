"""Dead letters: records the engine cannot use, kept with the reason, never dropped.

A record goes here when it does not decode (``undecodable``), breaks an invariant of
its stream's schema (``invalid``: a field outside its domain, :mod:`tidewatch.schema`),
carries an event time too far ahead of the time Kafka got it (``future``), or comes
after the engine has already looked up past its event time (``late``, docs/engine.md
"Time and exactness": later than the allowed lateness behind the watermark).  Offsets the
topic's retention deleted before the engine read them are one ``lost`` dead letter per range
(:mod:`engine.sources.retention`; no raw bytes: the records are gone).  Each dead letter
keeps the source topic, partition and offset and the raw key/value bytes, and is
published as an Avro ``DeadLetter`` (``tidewatch/wire/schemas/dead_letter.avsc``) keyed by
the source topic name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

REASONS = ("undecodable", "invalid", "future", "late", "lost")


@dataclass
class DeadLetters:
    """A column store of dead letters of one micro-batch (all topics)."""

    source_topic: list[str] = field(default_factory=list)
    source_partition: list[int] = field(default_factory=list)
    source_offset: list[int] = field(default_factory=list)
    key: list[bytes | None] = field(default_factory=list)
    value: list[bytes | None] = field(default_factory=list)
    reason: list[str] = field(default_factory=list)
    detail: list[str] = field(default_factory=list)
    event_ts: list[int | None] = field(default_factory=list)
    watermark: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.reason)

    def add(
        self,
        topic: str,
        partitions: np.ndarray,
        offsets: np.ndarray,
        keys: Iterable[bytes | None],
        values: Iterable[bytes | None],
        reason: str,
        details: Iterable[str] | str = "",
        event_ts: Iterable[int | None] | None = None,
        watermark: int | None = None,
    ) -> None:
        """Append ``len(partitions)`` dead letters with one reason."""
        if reason not in REASONS:
            raise ValueError(f"unknown dead-letter reason {reason!r}")
        n = len(partitions)
        if n == 0:
            return
        self.source_topic.extend([topic] * n)
        self.source_partition.extend(int(p) for p in partitions)
        self.source_offset.extend(int(o) for o in offsets)
        self.key.extend(keys)
        self.value.extend(values)
        self.reason.extend([reason] * n)
        self.detail.extend([details] * n if isinstance(details, str) else details)
        self.event_ts.extend(
            [None] * n if event_ts is None else [None if t is None else int(t) for t in event_ts]
        )
        self.watermark.extend([watermark] * n)

    def extend(self, other: DeadLetters) -> None:
        """Append all dead letters of ``other``."""
        for name in self.__dataclass_fields__:
            getattr(self, name).extend(getattr(other, name))

    def counts(self) -> dict[str, int]:
        """Number of dead letters per reason (every reason present, 0 when none)."""
        c = Counter(self.reason)
        return {r: c.get(r, 0) for r in REASONS}

    def counts_by_topic(self) -> dict[tuple[str, str], int]:
        """Number of dead letters per (source topic, reason)."""
        return dict(Counter(zip(self.source_topic, self.reason, strict=True)))

    def records(self, logged_at: int) -> list[dict[str, Any]]:
        """The dead letters as ``DeadLetter`` Avro records (dicts), in insertion order."""
        return [
            {
                "source_topic": self.source_topic[i],
                "source_partition": self.source_partition[i],
                "source_offset": self.source_offset[i],
                "key": self.key[i],
                "value": self.value[i],
                "reason": self.reason[i],
                "detail": self.detail[i],
                "event_ts": self.event_ts[i],
                "watermark": self.watermark[i],
                "logged_at": logged_at,
            }
            for i in range(len(self))
        ]
