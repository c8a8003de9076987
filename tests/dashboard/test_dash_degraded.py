"""Staleness budgets on the dashboard: the Subscribe page's "Staleness budget" field and the Health
view's "Degraded subscriptions" (from ``engine_metrics.degraded``), named only for their owner."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from dashboard import degraded
from dashboard.timefmt import utc_text
from subscriptions.service import SubscriptionService
from tests.dashboard.support import RULE, subscribe
from tests.dashboard.test_dash_apptest import frame_with, logged_in, shown
from tidewatch.db.models import EngineMetric
from tidewatch.settings import get_settings

T0 = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)
A, B, C = (str(uuid.UUID(int=i)) for i in (1, 2, 3))


def _at(i: int) -> datetime:
    return T0 + timedelta(seconds=5 * i)


def _spaced(every: int, budget: int) -> dict[str, int]:
    return {"every_ms": every, "budget_ms": budget}


# --- the rule, no services ---------------------------------------------------------------------


def test_since_is_the_first_batch_of_the_unbroken_run_up_to_the_newest() -> None:
    # oldest first: A in batches 0-1, gone at 2, back from 3; B from 1 on; C only at 0-1
    batches = [
        (_at(0), {A: _spaced(2000, 30_000), C: _spaced(4000, 8000)}),
        (_at(1), {A: _spaced(4000, 30_000), B: _spaced(2000, 10_000), C: _spaced(8000, 8000)}),
        (_at(2), {B: _spaced(4000, 10_000)}),
        (_at(3), {A: _spaced(4000, 30_000), B: _spaced(8000, 10_000)}),
        (_at(4), {A: _spaced(8000, 30_000), B: _spaced(8000, 10_000)}),
    ]
    items, still_open = degraded.runs(reversed(batches))
    got = {d.subscription_id: (d.every_ms, d.budget_ms, d.since, d.since_earlier) for d in items}
    assert got == {A: (8000, 30_000, _at(3), False), B: (8000, 10_000, _at(1), False)}
    assert not still_open and C not in got  # C: degraded before, not now
    # without batch 0, B's run reaches the oldest batch read: it may have started earlier
    items, still_open = degraded.runs(reversed(batches[1:]))
    assert still_open and {(d.subscription_id, d.since, d.since_earlier) for d in items} == {
        (A, _at(3), False),
        (B, _at(1), True),
    }


def test_nothing_when_the_newest_batch_degrades_nothing() -> None:
    assert degraded.runs([(_at(2), {}), (_at(1), {A: _spaced(2000, 5000)})]) == ([], False)
    assert degraded.runs([]) == ([], False)
    assert degraded.runs([(_at(1), None)]) == ([], False)


def test_the_walk_stops_once_no_run_is_open() -> None:
    read: list[int] = []

    def rows() -> Any:
        for i in range(10, -1, -1):
            read.append(i)
            yield _at(i), ({A: _spaced(2000, 5000)} if i >= 8 else {})

    (item,), still_open = degraded.runs(rows())
    assert item.since == _at(8) and not still_open and read == [10, 9, 8, 7]


def test_a_line_reads_spacing_against_budget_and_since() -> None:
    d = degraded.Degraded(A, 8000.0, 30_000.0, T0)
    assert d.text("volume") == (
        f"'volume' ({A[:8]}): looked up every 8 s of its 30 s budget, since 2026-11-27 12:00:00 UTC"
    )
    assert d.text(None).startswith(f"another user's subscription ({A[:8]}): looked up every 8 s")
    later = degraded.Degraded(A, None, 120_000.0, T0, since_earlier=True)
    assert later.text(None).endswith(
        "looked up less often, within its 2 min budget, since 2026-11-27 12:00:00 UTC or earlier"
    )
    # malformed entries: no numbers, but still listed
    odd, _ = degraded.runs([(T0, {A: "?", B: {"every_ms": True, "budget_ms": -1}})])
    assert [(d.subscription_id, d.every_ms, d.budget_ms) for d in odd] == [(A, None, None), (B, None, None)]
    assert odd[1].text(None).endswith(": looked up less often, since 2026-11-27 12:00:00 UTC or earlier")


# --- against PostgreSQL ------------------------------------------------------------------------


def _metrics(sm: sessionmaker[Session], rows: list[tuple[datetime, dict[str, Any]]]) -> None:
    """engine_metrics replaced by one row per (commit time, degraded), in time order."""
    with sm.begin() as s:
        s.execute(sa.delete(EngineMetric))
        s.add_all(
            EngineMetric(ts=ts, batch_id=i + 1, batch_ms=50.0, lag_ms=500.0, alerts=0, degraded=d)
            for i, (ts, d) in enumerate(sorted(rows, key=lambda r: r[0]))
        )


@pytest.fixture
def clean_metrics(sm: sessionmaker[Session]) -> Any:
    yield
    with sm.begin() as s:
        s.execute(sa.delete(EngineMetric))


@pytest.mark.integration
def test_read_names_only_the_users_own_and_finds_since(
    sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any, clean_metrics: Any
) -> None:
    owner, other = new_user("deg"), new_user("peer")
    mine = subscribe(svc, owner, "volume *x*")
    theirs = subscribe(svc, other, "scan")
    m, t = str(mine.id), str(theirs.id)
    end = datetime.now(UTC).replace(microsecond=0)
    at = [end - timedelta(seconds=5 * i) for i in range(6)]  # at[0] the newest
    _metrics(
        sm,
        [
            (at[5], {t: _spaced(2000, 60_000)}),
            (at[4], {}),
            (at[3], {m: _spaced(2000, 30_000), t: _spaced(2000, 60_000)}),
            (at[2], {m: _spaced(4000, 30_000), t: _spaced(4000, 60_000)}),
            (at[1], {m: _spaced(8000, 30_000), t: _spaced(8000, 60_000)}),
            (at[0], {m: _spaced(8000, 30_000), t: _spaced(16_000, 60_000)}),
        ],
    )
    with sm() as s:
        seen = degraded.read(s, owner)
    assert seen.as_of == at[0]
    assert [(d.subscription_id, d.name, d.since, d.since_earlier) for d in seen.items] == [
        (m, "volume *x*", at[3], False),  # the user's own first
        (t, None, at[3], False),
    ]
    assert seen.items[0].text("volume *x*").endswith(f"every 8 s of its 30 s budget, since {utc_text(at[3])}")
    with sm() as s:
        theirs_view = degraded.read(s, other)
    assert [(d.subscription_id, d.name) for d in theirs_view.items] == [(t, "scan"), (m, None)]
    # a run longer than the lookback: its start is "or earlier"
    with sm() as s:
        short = degraded.read(s, owner, lookback_s=7)
    assert [(d.since, d.since_earlier) for d in short.items] == [(at[1], True), (at[1], True)]
    # the newest batch degrades nothing: nothing at all
    _metrics(sm, [(at[1], {m: _spaced(8000, 30_000)}), (at[0], {})])
    with sm() as s:
        assert degraded.read(s, owner).items == ()


@pytest.mark.integration
def test_health_page_lists_degraded_subscriptions_for_their_owner_only(
    app_env: str,
    sm: sessionmaker[Session],
    svc: SubscriptionService,
    new_user: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    clean_metrics: Any,
) -> None:
    monkeypatch.setenv("TIDEWATCH_RUN_DIR", str(tmp_path))  # the engine's run record: none
    get_settings.cache_clear()
    owner, other = new_user("degview"), new_user("onlooker")
    sub = svc.create(owner, RULE, name="volume *x*", staleness_budget_ms=30_000)
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    first = end - timedelta(seconds=10)
    rows: list[tuple[datetime, dict[str, Any]]] = [(first - timedelta(seconds=5), {})]
    rows += [(first + timedelta(seconds=5 * i), {str(sub.id): _spaced(8000, 30_000)}) for i in range(3)]
    _metrics(sm, rows)

    def degraded_lines(at: Any) -> list[str]:
        return [shown(x.value) for x in at.markdown if "looked up every" in x.value]

    at = logged_in(sm, owner, "Health")
    assert not at.exception
    assert "Degraded subscriptions" in [h.value for h in at.subheader]
    assert degraded_lines(at) == [
        f"- 'volume *x*' ({str(sub.id)[:8]}): looked up every 8 s of its 30 s budget, since {utc_text(first)}"
    ]
    assert any("Subscriptions without a budget are never degraded" in c.value for c in at.caption)
    at = logged_in(sm, other, "Health")
    (line,) = degraded_lines(at)
    assert line.startswith(f"- another user's subscription ({str(sub.id)[:8]}): looked up every 8 s")
    assert "volume" not in line
    # the subscription's page in Subscribe says so too
    at = logged_in(sm, owner, "Subscribe")
    at.selectbox(key="sub_edit").select(str(sub.id)).run()
    assert [shown(w.value) for w in at.warning] == [
        "Degraded now (the engine is overloaded): 'volume *x*' "
        f"({str(sub.id)[:8]}): looked up every 8 s of its 30 s budget, since {utc_text(first)}."
    ]
    # the newest batch degrades nothing: no section at all
    _metrics(sm, [*rows, (end + timedelta(seconds=0.5), {})])
    at = logged_in(sm, owner, "Health")
    assert not at.exception and degraded_lines(at) == []
    assert "Degraded subscriptions" not in [h.value for h in at.subheader]


# --- the Subscribe page's field ----------------------------------------------------------------


@pytest.mark.integration
def test_subscribe_page_sets_changes_and_clears_a_budget(
    app_env: str, sm: sessionmaker[Session], svc: SubscriptionService, new_user: Any
) -> None:
    name = new_user("budget")
    at = logged_in(sm, name, "Subscribe")
    assert at.text_input(key="sub_budget").label == "Staleness budget (optional)"
    assert any("Staleness budget: when the engine is overloaded" in c.value for c in at.caption)
    at.text_area(key="sub_rule").input(RULE)
    at.text_input(key="sub_name").input("vol")
    # below the lookup period: refused next to the field, nothing can be saved
    at.text_input(key="sub_budget").input("100ms").run()
    assert [shown(e.value) for e in at.error] == [
        "a staleness budget of 100 ms is shorter than the engine's lookup period (1 s), so it would "
        "change nothing: enter at least 1 s, or 'none' for no budget"
    ]
    assert at.button(key="sub_save").disabled
    at.text_input(key="sub_budget").input("soon").run()
    assert "is not a duration" in shown(at.error[0].value) and at.button(key="sub_save").disabled
    at.text_input(key="sub_budget").input("<img src=x onerror=alert(1)>").run()  # shown as text
    assert shown(at.error[0].value).startswith(
        "the staleness budget '<img src=x onerror=alert(1)>' is not a duration: write e.g. 30s"
    )
    assert "\\<img" in at.error[0].value  # escaped for Markdown
    at.text_input(key="sub_budget").input("30s").run()
    assert not at.error and not at.button(key="sub_save").disabled
    at.button(key="sub_save").click().run()
    assert not at.exception
    (sub,) = svc.list(name)
    assert (sub.name, sub.staleness_budget_ms, sub.version) == ("vol", 30_000, 1)
    assert frame_with(at, "name", "staleness budget")["staleness budget"].tolist() == ["30 s"]
    # editing shows it; a change of budget alone is a new version
    at = logged_in(sm, name, "Subscribe")
    at.selectbox(key="sub_edit").select(str(sub.id)).run()
    assert at.text_input(key="sub_budget").value == "30s"
    at.text_input(key="sub_budget").input("2m")
    at.button(key="sub_save").click().run()
    assert (svc.get(name, sub.id).staleness_budget_ms, svc.get(name, sub.id).version) == (120_000, 2)
    assert frame_with(at, "name", "staleness budget")["staleness budget"].tolist() == ["2 min"]
    at.text_input(key="sub_budget").input("")
    at.button(key="sub_save").click().run()
    assert (svc.get(name, sub.id).staleness_budget_ms, svc.get(name, sub.id).version) == (None, 3)
    assert frame_with(at, "name", "staleness budget")["staleness budget"].tolist() == ["none"]
