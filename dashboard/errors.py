"""The root of the ``dashboard`` package's errors.

:class:`DashboardError` (under :class:`tidewatch.errors.TidewatchError`) is the root of every
error of the dashboard: :class:`dashboard.auth.AuthError` (a refusal to show the user) and
:class:`dashboard.detail.KafkaUnavailable` (a stream Kafka did not serve).
"""

from __future__ import annotations

from tidewatch.errors import TidewatchError

__all__ = ["DashboardError"]


class DashboardError(TidewatchError):
    """The root of every error of the ``dashboard`` package."""
