"""The subscription service against a real PostgreSQL: scoping, history, outbox, refusals."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, func, pool, select

from subscriptions.errors import RuleError
from subscriptions.service import InvalidName, NameTaken, NotFound, SubscriptionService
from tidewatch.db import migrate
from tidewatch.db.models import Outbox, Subscription, SubscriptionVersion
from tidewatch.settings import get_settings

pytestmark = pytest.mark.integration

RULE = "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDS > 1000"
RULE2 = (
    "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST 60 SECONDS > 100"
)


@pytest.fixture(scope="module")
def db_url(pg_url):
    migrate.upgrade(pg_url)
    return pg_url


@pytest.fixture()
def svc(db_url):
    return SubscriptionService(settings=get_settings(), url=db_url, topic=f"test-subs-{uuid.uuid4().hex[:8]}")


@pytest.fixture()
def users(svc):
    """Two fresh users per test."""
    a, b = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    svc.ensure_user(a)
    svc.ensure_user(b)
    return a, b


def _outbox(db_url: str, topic: str) -> list[Outbox]:
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        from sqlalchemy.orm import Session

        with Session(engine) as s:
            return list(s.scalars(select(Outbox).where(Outbox.topic == topic).order_by(Outbox.id)))
    finally:
        engine.dispose()


def test_lifecycle_writes_history_and_one_outbox_row_per_change(svc, users, db_url):
    alice, _ = users
    v = svc.create(alice, RULE, name="volume")
    assert (v.state, v.version, v.owner, v.name) == ("active", 1, alice, "volume")
    assert v.plan["stream"] == "trades" and v.plan["key"] == "symbol"
    assert svc.pause(alice, "volume").state == "paused"
    assert svc.pause(alice, v.id).version == 2  # pausing a paused one changes nothing
    assert svc.update(alice, v.id, rule_text=RULE2).plan["stream"] == "packets"
    assert svc.resume(alice, v.id).state == "active"
    deleted = svc.delete(alice, v.id)
    assert deleted.state == "deleted" and deleted.version == 5

    hist = svc.history(alice, v.id)
    assert [(h["version"], h["change"], h["state"]) for h in hist] == [
        (1, "create", "active"),
        (2, "pause", "paused"),
        (3, "update", "paused"),
        (4, "resume", "active"),
        (5, "delete", "deleted"),
    ]
    rows = _outbox(db_url, svc.topic)
    assert [r.payload["version"] for r in rows] == [1, 2, 3, 4, 5]
    assert {r.key for r in rows} == {str(v.id)}
    assert [r.payload["state"] for r in rows] == ["active", "paused", "paused", "active", "deleted"]
    assert rows[2].payload["rule_text"] == RULE2 and all(r.published_at is None for r in rows)
    # deleted: gone from the list and from every operation, name free again
    assert svc.list(alice) == []
    assert [x.id for x in svc.list(alice, include_deleted=True)] == [v.id]
    with pytest.raises(NotFound):
        svc.get(alice, v.id)
    assert svc.create(alice, RULE, name="volume").id != v.id


def test_a_user_can_never_read_or_change_another_users_subscription(svc, users, db_url):
    alice, bob = users
    v = svc.create(alice, RULE, name="mine")
    before = _outbox(db_url, svc.topic)
    for ref in (v.id, str(v.id), "mine"):
        with pytest.raises(NotFound):
            svc.get(bob, ref)
        with pytest.raises(NotFound):
            svc.history(bob, ref)
        with pytest.raises(NotFound):
            svc.update(bob, ref, rule_text=RULE2)
        with pytest.raises(NotFound):
            svc.update(bob, ref, name="stolen")
        for op in (svc.pause, svc.resume, svc.delete):
            with pytest.raises(NotFound):
                op(bob, ref)
    assert svc.list(bob) == [] and svc.list(bob, include_deleted=True) == []
    # nothing changed, nothing was written for the refused attempts
    after = svc.get(alice, v.id)
    assert (after.state, after.version, after.rule_text, after.name) == ("active", 1, RULE, "mine")
    assert len(_outbox(db_url, svc.topic)) == len(before)
    # bob may use the same name for his own
    assert svc.create(bob, RULE2, name="mine").owner == bob
    assert [x.owner for x in svc.list(alice)] == [alice]


def test_bad_rules_are_refused_with_a_position_and_nothing_is_stored(svc, users, db_url):
    alice, _ = users
    with pytest.raises(RuleError) as err:
        svc.create(
            alice, "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(prize) OVER LAST 5 MINUTES > 1"
        )
    assert (err.value.line, err.value.column) == (1, 54) and "price" in err.value.message
    with pytest.raises(RuleError):
        svc.create(alice, "   ")
    with pytest.raises(RuleError, match="limit"):
        svc.create(alice, RULE + " " * svc.settings.max_rule_chars)
    v = svc.create(alice, RULE)
    with pytest.raises(RuleError):
        svc.update(alice, v.id, rule_text="DROP TABLE subscriptions")
    assert svc.get(alice, v.id).rule_text == RULE
    assert len(_outbox(db_url, svc.topic)) == 1


def test_rule_text_is_data_never_sql(svc, users, db_url):
    """Quotes and SQL in names and rule literals are stored verbatim."""
    alice, _ = users
    rule = "SELECT symbol FROM trades WHERE exchange = 'X''); DROP TABLE users; --' GROUP BY symbol HAVING COUNT(*) OVER LAST 1 MINUTE > 1"
    v = svc.create(alice, rule, name="x'); DELETE FROM subscriptions; --")
    got = svc.get(alice, v.id)
    assert got.rule_text == rule and got.name == "x'); DELETE FROM subscriptions; --"
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(Subscription)) >= 1
    finally:
        engine.dispose()


def test_names_are_unique_per_user_among_live_subscriptions(svc, users):
    alice, _ = users
    a = svc.create(alice, RULE, name="dup")
    with pytest.raises(NameTaken):
        svc.create(alice, RULE2, name="dup")
    b = svc.create(alice, RULE2, name="other")
    with pytest.raises(NameTaken):
        svc.update(alice, b.id, name="dup")
    svc.delete(alice, a.id)
    assert svc.update(alice, b.id, name="dup").name == "dup"
    with pytest.raises(InvalidName):
        svc.create(alice, RULE, name="   ")


def test_unknown_and_invalid_users(svc):
    with pytest.raises(NotFound):
        svc.create(f"nobody-{uuid.uuid4().hex[:6]}", RULE)
    with pytest.raises(InvalidName):
        svc.list("robert'); DROP TABLE users;--")
    with pytest.raises(InvalidName):
        svc.ensure_user("")


def test_versions_table_matches_subscription_version(svc, users, db_url):
    alice, _ = users
    v = svc.create(alice, RULE)
    svc.pause(alice, v.id)
    svc.resume(alice, v.id)
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            n = conn.scalar(
                select(func.max(SubscriptionVersion.version)).where(
                    SubscriptionVersion.subscription_id == v.id
                )
            )
    finally:
        engine.dispose()
    assert n == svc.get(alice, v.id).version == 3


def test_a_staleness_budget_is_stored_versioned_and_published(svc, users, db_url):
    alice, bob = users
    v = svc.create(alice, RULE, name="budgeted", staleness_budget_ms=30_000)
    assert v.staleness_budget_ms == 30_000 and svc.get(alice, v.id).staleness_budget_ms == 30_000
    assert svc.create(bob, RULE, name="plain").staleness_budget_ms is None  # none by default
    # a change of budget alone is a new version; the rule and name stay
    changed = svc.update(alice, v.id, staleness_budget_ms=120_000)
    assert (changed.version, changed.staleness_budget_ms, changed.rule_text) == (2, 120_000, RULE)
    # the same budget again, or no budget argument at all: nothing written
    assert svc.update(alice, v.id, staleness_budget_ms=120_000).version == 2
    assert svc.update(alice, v.id, name="budgeted").version == 2
    # a rule change keeps the budget; None clears it
    assert svc.update(alice, v.id, rule_text=RULE2).staleness_budget_ms == 120_000
    cleared = svc.update(alice, v.id, staleness_budget_ms=None)
    assert (cleared.version, cleared.staleness_budget_ms) == (4, None)

    hist = svc.history(alice, v.id)
    assert [(h["version"], h["change"], h["staleness_budget_ms"]) for h in hist] == [
        (1, "create", 30_000),
        (2, "update", 120_000),
        (3, "update", 120_000),
        (4, "update", None),
    ]
    rows = [r for r in _outbox(db_url, svc.topic) if r.key == str(v.id)]
    assert [r.payload["staleness_budget_ms"] for r in rows] == [30_000, 120_000, 120_000, None]
    assert [r.payload["version"] for r in rows] == [1, 2, 3, 4]
    # what the engine reads from the topic
    import json

    from engine.messages import parse_subscription_change

    change = parse_subscription_change(str(v.id).encode(), json.dumps(rows[1].payload).encode())
    assert (change.op, change.staleness_budget_ms, change.version) == ("upsert", 120_000, 2)
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            stored = conn.execute(
                select(SubscriptionVersion.version, SubscriptionVersion.staleness_budget_ms)
                .where(SubscriptionVersion.subscription_id == v.id)
                .order_by(SubscriptionVersion.version)
            ).all()
            now = conn.scalar(select(Subscription.staleness_budget_ms).where(Subscription.id == v.id))
    finally:
        engine.dispose()
    assert [tuple(r) for r in stored] == [(1, 30_000), (2, 120_000), (3, 120_000), (4, None)]
    assert now is None


def test_a_budget_out_of_range_is_refused_and_nothing_is_written(svc, users, db_url):
    from subscriptions.errors import InvalidBudget

    alice, _ = users
    period = int(svc.settings.engine_lookup_every_ms or svc.settings.pane_ms)
    before = len(_outbox(db_url, svc.topic))
    for bad, code in [
        (period - 1, InvalidBudget.BELOW_LOOKUP),
        (0, InvalidBudget.NOT_POSITIVE),
        (25 * 3_600_000, InvalidBudget.ABOVE_MAX),
    ]:
        with pytest.raises(InvalidBudget) as err:
            svc.create(alice, RULE, name="refused", staleness_budget_ms=bad)
        assert err.value.code == code and "enter" in str(err.value)
    assert svc.list(alice) == []
    v = svc.create(alice, RULE, name="ok", staleness_budget_ms=period)
    with pytest.raises(InvalidBudget) as err:
        svc.update(alice, v.id, rule_text=RULE2, staleness_budget_ms=period // 2)
    assert err.value.code == InvalidBudget.BELOW_LOOKUP
    after = svc.get(alice, v.id)  # the refused update changed nothing, not even the rule
    assert (after.version, after.rule_text, after.staleness_budget_ms) == (1, RULE, period)
    assert len(_outbox(db_url, svc.topic)) == before + 1
