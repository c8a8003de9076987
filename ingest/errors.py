"""The root of the ``ingest`` package's errors.

:class:`IngestError` (under :class:`tidewatch.errors.TidewatchError`) is the root of every
error of the feeds: :class:`ingest.pcap.PcapError` (a capture that cannot be read),
:class:`ingest.producer.ProgressMismatch` (a progress file of another feed).
"""

from __future__ import annotations

from tidewatch.errors import TidewatchError

__all__ = ["IngestError"]


class IngestError(TidewatchError):
    """The root of every error of the ``ingest`` package."""
