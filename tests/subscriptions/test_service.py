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
