"""Alert queries and health against a real PostgreSQL: filters, ownership, metacharacters."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from dashboard import queries
from engine import liveness
from subscriptions.service import NotFound, SubscriptionService
from tests.dashboard.support import add_alerts, add_storm_metrics, subscribe, two_batches
from tidewatch.db.models import EngineBatch, EngineMetric
from tidewatch.settings import Settings

pytestmark = pytest.mark.integration

NASTY_NAME = "<script>alert('x')</script> '; DROP TABLE alerts; -- 100%_"
NASTY_KEY = "a'b\"c;--%_\\<img src=x onerror=alert(1)>"


def test_filters_by_subscription_key_and_kind(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    u = new_user()
    s1, s2 = subscribe(svc, u, "one"), subscribe(svc, u, "two")
    add_alerts(sm, s1.id, [("AAPL", "ENTER"), ("MSFT", "ENTER")])
    add_alerts(sm, s2.id, [("AAPL", "ENTER")])
    add_alerts(sm, s1.id, [("AAPL", "EXIT")])
    rows = queries.alerts(sm, u)
    assert [(r.subscription, r.key, r.kind) for r in rows] == [
        ("one", "AAPL", "EXIT"),
        ("two", "AAPL", "ENTER"),
        ("one", "MSFT", "ENTER"),
        ("one", "AAPL", "ENTER"),
    ]
    assert {r.subscription for r in queries.alerts(sm, u, subscription_ids=[s2.id])} == {"two"}
    assert {r.key for r in queries.alerts(sm, u, key="ms")} == {"MSFT"}  # substring, case-insensitive
    assert [r.kind for r in queries.alerts(sm, u, kinds=["EXIT"])] == ["EXIT"]
    assert len(queries.alerts(sm, u, limit=2)) == 2
    assert queries.newest_seq(sm, u) == rows[0].seq
    assert queries.count_after(sm, u, rows[2].seq) == 2


def test_user_b_cannot_read_or_change_user_a(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    a, b = new_user("a"), new_user("b")
    sub_a = subscribe(svc, a, "mine")
    add_alerts(sm, sub_a.id, [("AAPL", "ENTER")])
    # B passing A's subscription id as a filter gets nothing
    assert queries.alerts(sm, b, subscription_ids=[sub_a.id]) == []
    assert queries.alerts(sm, b, key="AAPL") == []
    assert queries.known_keys(sm, b) == []
    assert queries.key_results(sm, b, "AAPL") == []
    assert queries.newest_seq(sm, b) == 0
    # ...and cannot change it through the service the pages use
    for action in (svc.pause, svc.resume, svc.delete):
        with pytest.raises(NotFound):
            action(b, sub_a.id)
    with pytest.raises(NotFound):
        svc.update(b, sub_a.id, name="stolen")
    assert svc.get(a, sub_a.id).state == "active" and svc.get(a, sub_a.id).name == "mine"
    assert [r.key for r in queries.alerts(sm, a)] == ["AAPL"]


def test_metacharacters_are_stored_and_matched_verbatim(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    u = new_user()
    sub = subscribe(svc, u, NASTY_NAME)
    add_alerts(sm, sub.id, [(NASTY_KEY, "ENTER"), ("plain", "ENTER")])
    assert svc.get(u, sub.id).name == NASTY_NAME
    rows = queries.alerts(sm, u)
    assert {r.key for r in rows} == {NASTY_KEY, "plain"} and {r.subscription for r in rows} == {NASTY_NAME}
    # LIKE wildcards in the filter match themselves only
    assert [r.key for r in queries.alerts(sm, u, key="%")] == [NASTY_KEY]
    assert [r.key for r in queries.alerts(sm, u, key="_")] == [NASTY_KEY]
    assert [r.key for r in queries.alerts(sm, u, key="' OR '1'='1")] == []
    assert [r.key for r in queries.alerts(sm, u, key=NASTY_KEY, exact_key=True)] == [NASTY_KEY]
    assert queries.known_keys(sm, u) == sorted([NASTY_KEY, "plain"])
    (kr,) = queries.key_results(sm, u, NASTY_KEY)
    assert kr.in_result and kr.subscription == NASTY_NAME


def test_key_results_show_membership_per_subscription(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    u = new_user()
    s1, s2 = subscribe(svc, u, "one"), subscribe(svc, u, "two")
    add_alerts(sm, s1.id, [("AAPL", "ENTER")])
    add_alerts(sm, s2.id, [("AAPL", "ENTER")])
    add_alerts(sm, s2.id, [("AAPL", "EXIT")])
    got = {r.subscription: r.in_result for r in queries.key_results(sm, u, "AAPL")}
    assert got == {"one": True, "two": False}


def test_health_from_engine_metrics(sm: sessionmaker[Session], tmp_path: Path) -> None:
    s = Settings(engine_behind_lag_ms=10_000, engine_down_after_s=60, run_dir=tmp_path)
    now = datetime.now(UTC)
    with sm.begin() as db:
        db.execute(delete(EngineMetric))  # the lag series of other tests (hysteresis reads it)
        db.add_all(
            two_batches(
                now,
                older={"lag_ms": 800.0, "alerts": 2, "dead_letters": 4},
                newer={
                    "lag_ms": 1500.0,
                    "alerts": 0,
                    "dead_letters": 1,
                    "delivery_ms": 85.0,
                    "expansion_ms": 120.0,
                    "driver_cpu_ms": 400.0,
                },
            )
        )
    h = queries.health(sm, s, now=now)
    # the driver's CPU since the row before: 0.4 s in 2 s, over 1200/s x 0.42 s = 504 events (0013)
    assert list(h.drivers) == ["default"]
    d = h.drivers["default"]
    assert d.seconds == pytest.approx(2.0, abs=0.01) and d.share == pytest.approx(0.2, rel=0.01)
    assert d.us_per_event == pytest.approx(400_000 / 504)
    assert h.status == "ok" and h.capacity_per_s == 1200.0 and h.batch_ms == 420.0 and h.lag_ms == 1500.0
    assert (h.delivery_ms, h.expansion_ms) == (85.0, 120.0)  # the newest row's (0012)
    assert h.engines == ()  # one engine: its figures as they are, no list
    assert h.dead_letters_total >= 5 and h.series[-1]["batch_id"] == 2
    assert queries.health(sm, s, now=now + timedelta(minutes=10)).status == "down"
    with sm.begin() as db:
        for i in range(3):  # three batches over the threshold: "behind" (hysteresis)
            db.add(EngineMetric(ts=now, batch_id=3 + i, events_per_s=10.0, batch_ms=9000.0, lag_ms=45_000.0))
    behind = queries.health(sm, s, now=now)
    assert behind.status == "behind" and "45.0 s" in behind.banner
    assert behind.lost_ranges == 0 and behind.lost_banner is None


def test_health_measures_engines_sharing_the_database_apart(
    sm: sessionmaker[Session], tmp_path: Path
) -> None:
    """Two engines (``--engine-id`` a and b) commit batches in turn: each one's driver load, its
    alerts per second since its own batch before, and the sum of their capacities."""
    now = datetime.now(UTC)
    rows = [  # (engine, seconds before now, events/s, alerts, driver CPU ms)
        ("a", 4.0, 1000.0, 10, None),
        ("b", 3.0, 3000.0, 30, None),
        ("a", 2.0, 1000.0, 20, 200.0),
        ("b", 1.0, 3000.0, 60, 1000.0),
    ]
    with sm.begin() as db:
        db.execute(delete(EngineMetric))
        db.add_all(
            EngineMetric(
                engine_id=e,
                ts=now - timedelta(seconds=ago),
                batch_id=i,
                events_per_s=eps,
                batch_ms=100.0,
                alerts=alerts,
                driver_cpu_ms=cpu,
            )  # fmt: skip
            for i, (e, ago, eps, alerts, cpu) in enumerate(rows)
        )
    try:
        h = queries.health(sm, Settings(run_dir=tmp_path), now=now)
    finally:
        with sm.begin() as db:
            db.execute(delete(EngineMetric))
    # b: 1 s of CPU in 2 s for 300 events; a: 0.2 s in 2 s for 100 events -- not one driver at 0.6
    assert list(h.drivers) == ["b", "a"]
    assert h.drivers["b"].share == pytest.approx(0.5, rel=0.01)
    assert h.drivers["a"].share == pytest.approx(0.1, rel=0.01)
    assert h.drivers["b"].us_per_event == pytest.approx(1e6 / 300)
    assert h.drivers["a"].us_per_event == pytest.approx(2e5 / 100)
    assert h.capacity_per_s == 4000.0  # each engine's newest batch, summed
    assert [(e.engine, e.events_per_s) for e in h.engines] == [("a", 1000.0), ("b", 3000.0)]
    assert h.last_batch_at == now - timedelta(seconds=2)  # a's: the engine that committed least recently
    per_s = [(r["engine"], r["alerts_per_s"]) for r in h.series]
    assert per_s[0] == ("a", None) and per_s[1] == ("b", None)  # each engine's first row
    assert per_s[2][0] == "a" and per_s[2][1] == pytest.approx(10.0, rel=0.01)  # 20 in 2 s, not 20 in 1 s
    assert per_s[3][0] == "b" and per_s[3][1] == pytest.approx(30.0, rel=0.01)


def test_health_names_an_engine_that_stopped_beside_one_that_runs(
    sm: sessionmaker[Session], tmp_path: Path
) -> None:
    """Engine b committed its last batch 5 minutes ago, engine a a second ago: Health is "down"
    and names b (each engine's own batches, :func:`engine.liveness.observe_engines`); an engine
    whose batches are over an hour older than the newest is not judged."""
    now = datetime.now(UTC)
    rows = [("gone", 2 * 3600.0), ("b", 302.0), ("b", 300.0), ("a", 2.0), ("a", 1.0)]
    with sm.begin() as db:
        db.execute(delete(EngineMetric))
        db.add_all(
            EngineMetric(engine_id=e, ts=now - timedelta(seconds=ago), batch_id=i, lag_ms=200.0)
            for i, (e, ago) in enumerate(rows)
        )
    try:
        s = Settings(run_dir=tmp_path, engine_down_after_s=60)
        h = queries.health(sm, s, now=now)
        with sm() as db:
            seen = liveness.observe_engines(db)
    finally:
        with sm.begin() as db:
            db.execute(delete(EngineMetric))
    assert sorted(seen) == ["a", "b"] and len(seen["b"].lags_ms) == 2
    assert h.status == "down" and h.banner.startswith("Engine 'b' (of 2): The engine looks down")
    assert [e.engine for e in h.engines] == ["a", "b"]  # "gone" is not among the engines shown
    assert h.last_batch_at == now - timedelta(seconds=300)  # b's, not a's second-old batch


def test_health_charts_break_at_a_stop_and_leave_out_older_runs(
    sm: sessionmaker[Session], tmp_path: Path
) -> None:
    """The series behind the Health charts: an engine's batches before a stop longer than
    ``engine_down_after_s`` are another run (no chart line joins them to the ones after), and
    batches more than :data:`queries.SERIES_WINDOW_S` before the newest are not charted."""
    now = datetime.now(UTC)
    ago = [
        queries.SERIES_WINDOW_S + 60.0,
        300.0,
        299.0,
        3.0,
        2.0,
        1.0,
    ]  # a run, a stop, a run, a stop (> 60 s)
    with sm.begin() as db:
        db.execute(delete(EngineMetric))
        db.add_all(
            EngineMetric(ts=now - timedelta(seconds=a), batch_id=i, lag_ms=100.0) for i, a in enumerate(ago)
        )
    try:
        h = queries.health(sm, Settings(run_dir=tmp_path, engine_down_after_s=60), now=now)
    finally:
        with sm.begin() as db:
            db.execute(delete(EngineMetric))
    assert [r["batch_id"] for r in h.series] == [1, 2, 3, 4, 5]  # batch 0: before the charts' span
    assert [r["run"] for r in h.series] == ["default 1", "default 1", "default 2", "default 2", "default 2"]


def test_health_reports_offsets_lost_to_retention(sm: sessionmaker[Session]) -> None:
    now = datetime.now(UTC)
    before = queries.health(sm, Settings(), now=now).lost_ranges
    with sm.begin() as db:
        db.add(EngineMetric(ts=now, batch_id=7, dead_letters=3, dead_letter_reasons={"late": 1, "lost": 2}))
    h = queries.health(sm, Settings(), now=now)
    assert h.lost_ranges == before + 2
    assert h.lost_banner is not None and "retention" in h.lost_banner


def test_health_events_per_s_is_the_input_rate(sm: sessionmaker[Session], tmp_path: Path) -> None:
    """events/s from ``engine_batches`` per wall-clock second (the feed's rate), not a batch's
    events over its evaluation time (``capacity_per_s``)."""
    s = Settings(run_dir=tmp_path)
    t0 = datetime.now(UTC) + timedelta(days=1)  # the newest batches of the database
    engine_id = f"rate-{uuid.uuid4().hex[:8]}"
    with sm.begin() as db:
        for i, events in enumerate([5_000, 8_000, 8_000, 8_000]):
            db.add(
                EngineBatch(
                    engine_id=engine_id,
                    batch_id=i,
                    committed_at=t0 + timedelta(seconds=10 * i),
                    events=events,
                )
            )
        db.add(EngineMetric(ts=t0, batch_id=3, events_per_s=300_000.0, batch_ms=27.0, lag_ms=900.0))
    h = queries.health(sm, s, now=t0 + timedelta(seconds=31))
    with sm.begin() as db:  # batches from the future would stay the newest for other tests
        db.execute(delete(EngineBatch).where(EngineBatch.engine_id == engine_id))
    assert h.events_per_s == 800.0  # 24,000 events after the first batch, over 30 s
    assert h.capacity_per_s == 300_000.0


def test_health_reports_an_alert_storm_and_names_only_the_users_subscription(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any, tmp_path: Path
) -> None:
    """A quarter hour at 5 alerts/s, then a minute at 200/s, 90% from A's subscription: a storm by
    the rule (≥ 10× the usual minute and ≥ 100/s); A sees its name, B only that it is another
    user's; with a factor of 50 it is no storm, and a calm engine has none."""
    s = Settings(run_dir=tmp_path)
    a, b = new_user("a"), new_user("b")
    sub = subscribe(svc, a, NASTY_NAME)
    now = datetime.now(UTC)
    add_storm_metrics(sm, now - timedelta(seconds=1), sub.id)
    try:
        h = queries.health(sm, s, now=now, username=a)
        assert h.storm is not None and h.alerts_per_s == pytest.approx(200.0)
        assert h.storm.alerts_per_s == pytest.approx(200.0) and h.storm.usual_per_s == pytest.approx(5.0)
        assert h.storm.threshold_per_s == 100.0 and h.storm.share == pytest.approx(0.9)
        assert h.storm.subscription_id == str(sub.id) and h.storm.subscription_name == NASTY_NAME
        assert "10× the median minute of the previous 15 min (5.0/s)" in h.storm.rule
        assert h.storm_rule == (
            "alerts/s over the last 60 s ≥ 10× the median minute of the previous 15 min and ≥ 100 "
            "(only the latter without an earlier minute)"
        )
        theirs = queries.health(sm, s, now=now, username=b)
        assert theirs.storm is not None and theirs.storm.subscription_id == str(sub.id)
        assert theirs.storm.subscription_name is None
        assert (
            queries.health(sm, s.model_copy(update={"storm_factor": 50.0}), now=now, username=a).storm is None
        )
        add_storm_metrics(sm, now - timedelta(seconds=1), sub.id, storm_per_batch=25)
        calm = queries.health(sm, s, now=now, username=a)
        assert calm.storm is None and calm.alerts_per_s == pytest.approx(5.0)
    finally:
        with sm.begin() as db:
            db.execute(delete(EngineMetric))
