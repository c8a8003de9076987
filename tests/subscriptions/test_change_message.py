"""The outbox's ``subscriptions`` message is what the engine's parser expects (no services)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from engine.messages import parse_subscription_change
from subscriptions.service import change_message
from tidewatch.db.models import Subscription

RULE = "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDS > 1000"


@pytest.mark.parametrize(("state", "op"), [("active", "upsert"), ("paused", "pause"), ("deleted", "delete")])
def test_engine_parses_every_state(state, op):
    sub = Subscription(
        id=uuid.uuid4(),
        owner="u",
        name="n",
        rule_text=RULE,
        plan={"stream": "trades"},
        state=state,
        version=3,
    )
    msg = change_message(sub, "update", datetime(2026, 1, 1, tzinfo=UTC))
    assert msg["version"] == 3 and msg["subscription_id"] == str(sub.id)
    change = parse_subscription_change(str(sub.id).encode(), json.dumps(msg).encode())
    assert change.subscription_id == str(sub.id)
    assert change.op == op
    assert change.text == RULE and change.plan == {"stream": "trades"} and change.name == "n"
