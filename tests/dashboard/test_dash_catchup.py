"""'While you were away' (PSoup) against a real PostgreSQL: nothing missed, nothing twice, own data only."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from dashboard import catchup
from subscriptions.service import SubscriptionService
from tests.dashboard.support import add_alerts, subscribe
from tidewatch.db.models import ClientCursor

pytestmark = pytest.mark.integration


def test_catch_up_groups_counts_and_current_results(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    alice = new_user("alice")
    vol = subscribe(svc, alice, "volume")
    syn = subscribe(
        svc,
        alice,
        "syn",
        "SELECT dst_ip FROM packets WHERE protocol = 'TCP' AND tcp_flags = 'S' "
        "GROUP BY dst_ip HAVING COUNT(*) OVER LAST 10 SECONDS > 500",
    )
    add_alerts(sm, vol.id, [("AAPL", "ENTER"), ("MSFT", "ENTER")])
    add_alerts(sm, vol.id, [("AAPL", "EXIT")])
    add_alerts(sm, syn.id, [("10.0.0.9", "ENTER")])
    snap = catchup.catch_up(sm, alice, "web")
    assert snap.cursor == 0 and snap.has_news and snap.total == 4
    groups = {g.name: g for g in snap.groups}
    assert (groups["volume"].enters, groups["volume"].exits) == (2, 1)
    assert (groups["syn"].enters, groups["syn"].exits) == (1, 0)
    assert [a.key for a in groups["volume"].alerts] == ["AAPL", "MSFT", "AAPL"]  # newest first
    current = {c.name: [r.key for r in c.rows] for c in snap.current}
    assert current == {"volume": ["MSFT"], "syn": ["10.0.0.9"]}
    assert snap.engine_as_of is not None


def test_nothing_missed_nothing_twice(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    bob = new_user("bob")
    sub = subscribe(svc, bob)
    first = add_alerts(sm, sub.id, [("A", "ENTER"), ("B", "ENTER")])
    snap = catchup.catch_up(sm, bob, "laptop")
    assert snap.upto == max(first)
    # an alert lands between the snapshot and its acknowledgement (while the panel renders)
    late = add_alerts(sm, sub.id, [("C", "ENTER")])
    assert catchup.acknowledge(sm, bob, "laptop", snap.upto) == snap.upto
    again = catchup.catch_up(sm, bob, "laptop")
    shown_twice = {a.seq for g in again.groups for a in g.alerts} & {
        a.seq for g in snap.groups for a in g.alerts
    }
    assert not shown_twice
    assert [a.seq for g in again.groups for a in g.alerts] == late  # ...and the late one is not missed
    catchup.acknowledge(sm, bob, "laptop", again.upto)
    quiet = catchup.catch_up(sm, bob, "laptop")
    assert not quiet.has_news and quiet.total == 0 and quiet.groups == []
    assert sorted(r.key for r in quiet.current[0].rows) == ["A", "B", "C"]


def test_cursor_only_moves_forward_and_is_per_client(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    carol = new_user("carol")
    sub = subscribe(svc, carol)
    seqs = add_alerts(sm, sub.id, [("X", "ENTER"), ("Y", "ENTER")])
    assert catchup.acknowledge(sm, carol, "phone", seqs[1]) == seqs[1]
    assert catchup.acknowledge(sm, carol, "phone", seqs[0]) == seqs[1]  # a stale tab cannot move it back
    # a client seen for the first time starts where the user's other clients got to
    assert catchup.catch_up(sm, carol, "tablet").cursor == seqs[1]
    more = add_alerts(sm, sub.id, [("Z", "ENTER")])
    assert [a.seq for g in catchup.catch_up(sm, carol, "tablet").groups for a in g.alerts] == more
    catchup.acknowledge(sm, carol, "tablet", more[0])
    with sm() as s:
        cursors = dict(
            s.execute(
                sa.select(ClientCursor.client_id, ClientCursor.last_alert_seq).where(
                    ClientCursor.username == carol
                )
            ).all()
        )
    assert cursors == {"phone": seqs[1], "tablet": more[0]}
    # phone has not seen Z yet
    assert [a.key for g in catchup.catch_up(sm, carol, "phone").groups for a in g.alerts] == ["Z"]


def test_user_b_never_sees_user_a(sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any) -> None:
    a, b = new_user("a"), new_user("b")
    sub_a = subscribe(svc, a, "secret-of-a")
    add_alerts(sm, sub_a.id, [("AAPL", "ENTER")])
    snap_b = catchup.catch_up(sm, b, "web")
    assert not snap_b.has_news and snap_b.groups == [] and snap_b.current == []
    snap_a = catchup.catch_up(sm, a, "web")
    assert snap_a.total == 1


def test_counts_are_complete_when_the_list_is_capped(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    dave = new_user("dave")
    sub = subscribe(svc, dave)
    add_alerts(sm, sub.id, [(f"K{i:03d}", "ENTER") for i in range(30)])
    snap = catchup.catch_up(sm, dave, "web", per_group=10)
    (g,) = snap.groups
    assert g.total == 30 and len(g.alerts) == 10
    assert [a.key for a in g.alerts] == [f"K{i:03d}" for i in range(29, 19, -1)]


def test_deleted_subscription_alerts_are_still_reported(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    eve = new_user("eve")
    sub = subscribe(svc, eve)
    add_alerts(sm, sub.id, [("Q", "ENTER")])
    svc.delete(eve, sub.id)
    snap = catchup.catch_up(sm, eve, "web")
    assert [(g.name, g.state, g.total) for g in snap.groups] == [("volume", "deleted", 1)]
    assert snap.current == []  # a deleted subscription has no current result set
