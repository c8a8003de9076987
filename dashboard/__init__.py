"""The Streamlit dashboard: log-in, subscriptions, alerts, key detail and health pages.

:class:`DashboardError` is the root of the package's errors (:mod:`dashboard.errors`).  Names
other than the error root are imported on first use (:mod:`tidewatch.lazy`): ``import
dashboard`` does not load Streamlit, SQLAlchemy or the engine's evaluator.
"""

from __future__ import annotations

from dashboard.errors import DashboardError
from tidewatch.lazy import lazy_exports

TYPE_CHECKING = False  # not typing's: importing typing costs more than this package
if TYPE_CHECKING:
    from dashboard.auth import AuthError, RateLimited, sign_up
    from dashboard.detail import KafkaUnavailable
    from dashboard.rules import DEMO_SUBSCRIPTIONS, TEMPLATES

__all__ = [
    "DEMO_SUBSCRIPTIONS",
    "TEMPLATES",
    "AuthError",
    "DashboardError",
    "KafkaUnavailable",
    "RateLimited",
    "sign_up",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AuthError": "dashboard.auth",
        "KafkaUnavailable": "dashboard.detail",
        "RateLimited": "dashboard.auth",
        "DEMO_SUBSCRIPTIONS": "dashboard.rules",
        "TEMPLATES": "dashboard.rules",
        "sign_up": "dashboard.auth",
    },
)
