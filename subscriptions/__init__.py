"""Subscription rules: the rule language (parse, type-check, compile) and the subscription service.

:class:`SubscriptionsError` is the root of the package's errors (:mod:`subscriptions.errors`).
Names other than the errors module's are imported on first use (:mod:`tidewatch.lazy`), so
``import subscriptions`` does not load Lark or SQLAlchemy.
"""

from __future__ import annotations

from subscriptions.errors import InvalidBudget, RuleError, SubscriptionError, SubscriptionsError
from tidewatch.lazy import lazy_exports

TYPE_CHECKING = False  # not typing's: importing typing costs more than this package
if TYPE_CHECKING:
    from subscriptions.compiler import Plan, compile_rule, explain
    from subscriptions.outbox import OutboxRelay, RelayBusy
    from subscriptions.service import (
        InvalidName,
        NameTaken,
        NotFound,
        SubscriptionService,
        SubscriptionView,
    )

__all__ = [
    "InvalidBudget",
    "InvalidName",
    "NameTaken",
    "NotFound",
    "OutboxRelay",
    "Plan",
    "RelayBusy",
    "RuleError",
    "SubscriptionError",
    "SubscriptionService",
    "SubscriptionView",
    "SubscriptionsError",
    "compile_rule",
    "explain",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "InvalidName": "subscriptions.service",
        "NameTaken": "subscriptions.service",
        "NotFound": "subscriptions.service",
        "OutboxRelay": "subscriptions.outbox",
        "Plan": "subscriptions.compiler",
        "RelayBusy": "subscriptions.outbox",
        "SubscriptionService": "subscriptions.service",
        "SubscriptionView": "subscriptions.service",
        "compile_rule": "subscriptions.compiler",
        "explain": "subscriptions.compiler",
    },
)
