"""The engine's batch commit -- one ``engine_outputs`` row expanded behind it (the default, from
the columns in memory or read back), ``COPY`` straight into ``alerts`` (:func:`write_direct`) or
through a staging table (:func:`write_copy`) -- writes, row for row, what the array-bound
statements it replaced wrote; a re-commit of a batch id writes nothing (real PostgreSQL: the embedded server
of the ``restartable_pg`` fixture, one fresh database per path)."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from engine.messages import Alert, BatchOutput
from engine.sinks.alert_columns import AlertColumns, subscription_uuid
from engine.sinks.output_block import with_columns
from engine.sinks.store import Store, _write_unnest, write_copy, write_direct
from tidewatch.settings import Settings

pytestmark = pytest.mark.integration

T0 = 1_763_900_000_123  # ms: not a whole second, so the fractional part is checked too
METRICS = {"events_per_s": 1.0, "batch_ms": 2.0, "lag_ms": 3.0, "alerts": 0, "dead_letters": 0}
SUBS = [str(uuid.UUID(int=i + 1)) for i in range(5)] + ["not-a-uuid", "déjà vu"]
#: keys a CSV or text COPY could get wrong
KEYS = ["AAPL", "", "a,b", 'q"uote', "tab\there", "new\nline", "cr\rlf", "back\\slash", "\\N", "NULL", "ünï"]
VALUES: list[dict[str, Any]] = [
    {"COUNT(*) OVER LAST 10 SECONDS": 13},
    {"SUM(size) OVER LAST 20 SECONDS": 912.5, "AVG(price) OVER LAST 30 SECONDS": None},
    {},
    {"MAX(price) - MIN(price)": 1e-7, 'weird "key"\n\\': -3.25},
    {"é": 2**40},
]


def _batches() -> list[BatchOutput]:
    """Three batches: ENTER/EXIT churn of the same keys within a batch, equal as_of ties, every
    awkward key; then a deleted subscription; then a batch repeating alerts already logged."""
    out = []
    n = 0
    for b in range(2):
        alerts = []
        for i in range(400):
            sid = SUBS[(i + b) % len(SUBS)]
            key = KEYS[(i * 7 + b) % len(KEYS)]
            kind = "ENTER" if (i // 3 + b) % 2 == 0 else "EXIT"
            as_of = T0 + 1000 * ((i + 400 * b) // 5) + (i % 5) // 2  # in order, with runs of ties
            alerts.append(Alert(sid, f"rule {sid}", "trades", key, kind, as_of, VALUES[n % len(VALUES)]))
            n += 1
        out.append(BatchOutput(batch_id=b + 1, alerts=alerts, events={"trades": 10 * b}))
    out[1].removed = [SUBS[0], "not-a-uuid"]
    out[1].removed_keys = {SUBS[0]: ["AAPL", "a,b", "ünï"], "not-a-uuid": []}
    # batch 3 re-sends alerts of batch 2 (ids already in the log: kept as they are) plus new ones
    again = out[1].alerts[:50] + [
        Alert(SUBS[2], "r", "packets", "10.0.0.1", "ENTER", T0 + 999_999, {"SUM(length)": 7000})
    ]
    out.append(BatchOutput(batch_id=3, alerts=again))
    # batch 4: one alert twice in the batch (the first one is kept), out of as_of order
    twice = Alert(SUBS[3], "r", "trades", "TWICE", "ENTER", T0 + 2_000_000, {"n": 1})
    late = Alert(SUBS[4], "r", "trades", "EARLY", "EXIT", T0 + 1_500_000, {"n": 0.5})
    out.append(BatchOutput(batch_id=4, alerts=[twice, twice, late]))
    return out


def _tables(eng: Engine, inline: bool = True) -> dict[str, list[tuple[Any, ...]]]:
    """Every row the engine writes, minus the columns that differ by construction (identity
    numbers, commit times); alerts in ``seq`` order.  Checks created_at / updated_at = commit time
    (``inline``: written in the batch's transaction), else at or after it (expanded behind it)."""
    at = "=" if inline else ">="
    q = {
        "alerts": "SELECT a.alert_id, a.subscription_id, a.key, a.kind, a.as_of, a.values::text, a.batch_id, "
        f"a.created_at {at} b.committed_at FROM alerts a JOIN engine_batches b USING (batch_id) ORDER BY a.seq",
        "current_results": "SELECT subscription_id, key, since, values::text, "
        f"updated_at {at} ANY (SELECT committed_at FROM engine_batches) FROM current_results ORDER BY 1, 2",
        "engine_batches": "SELECT batch_id, watermark, events, alerts, removed::text FROM engine_batches ORDER BY 1",
        "engine_metrics": "SELECT batch_id, events_per_s, batch_ms, lag_ms, alerts, dead_letters "
        "FROM engine_metrics ORDER BY batch_id",
    }
    with eng.connect() as conn:
        return {t: [tuple(r) for r in conn.execute(text(sql))] for t, sql in q.items()}


def test_copy_writes_what_the_array_path_wrote_and_a_recommit_writes_nothing(
    restartable_pg: Settings,
) -> None:
    from tests.engine.test_engine_integration import fresh_database

    got: dict[str, dict[str, list[tuple[Any, ...]]]] = {}
    paths: list[tuple[str, Any]] = [("arrays", _write_unnest), ("copy", write_copy), ("direct", write_direct)]
    # the default: one engine_outputs row per batch, expanded behind the commit -- from the
    # columns in memory (the live path) or from the row read back (after a restart)
    paths += [("expanded live", None), ("expanded read back", None)]
    for name, write in paths:
        # a session time zone other than UTC: the timestamps must not depend on it
        eng = create_engine(
            fresh_database(restartable_pg.sqlalchemy_url),
            connect_args={"options": "-c TimeZone=Asia/Kolkata"},
        )
        store = Store(eng)
        try:
            for out in _batches():
                assert store.commit(out, watermark=T0 + out.batch_id, metrics=METRICS, write=write)
                if name == "expanded live":
                    assert store.project(out.batch_id, with_columns(out, AlertColumns.of(out.alerts)))
                    assert not store.project(out.batch_id)  # once
            if name == "expanded read back":
                assert store.unexpanded() == [1, 2, 3, 4]
                assert store.project_pending() == 4
            assert store.unexpanded() == []
            got[name] = _tables(eng, inline=write is not None)
            # the removed subscriptions' keys, for a re-publish of the batch's tombstones
            assert store.removed_of_batch(2) == _batches()[1].removed_keys
            assert store.removed_of_batch(1) == {} and store.removed_of_batch(99) == {}
            # the same batch ids again (a re-run after a crash): nothing is written
            for out in _batches():
                assert not store.commit(out, watermark=0, metrics=METRICS, write=write)
            assert store.unexpanded() == []
            assert _tables(eng, inline=write is not None) == got[name]
        finally:
            eng.dispose()
    arrays = got["arrays"]
    assert len(arrays["alerts"]) == 803  # 400 + 400 + 1 new one in batch 3 + 2 in batch 4
    assert all(r[-1] for r in arrays["alerts"]) and all(r[-1] for r in arrays["current_results"])
    assert {r[2] for r in arrays["alerts"]} == {*KEYS, "10.0.0.1", "TWICE", "EARLY"}
    assert arrays["current_results"] and len(arrays["engine_metrics"]) == 4
    assert [r[2] for r in arrays["alerts"][-2:]] == ["EARLY", "TWICE"]  # seq in as_of order
    for name in ("copy", "direct", "expanded live", "expanded read back"):
        for table in arrays:
            assert got[name][table] == arrays[table], (name, table)


@pytest.mark.parametrize("path", ["inline", "default"])
def test_a_refused_batch_rolls_back_whole(restartable_pg: Settings, path: str) -> None:
    """An alert the log refuses fails the batch and leaves nothing of it (not even its batch id),
    on the pool's next use too: inline (:func:`write_direct` in the commit) with the database's
    error; by default (one ``engine_outputs`` row) before anything is sent, so that no row the
    expansion would refuse is ever committed."""
    from sqlalchemy.exc import IntegrityError

    from tests.engine.test_engine_integration import fresh_database

    eng = create_engine(fresh_database(restartable_pg.sqlalchemy_url), pool_size=1)
    store = Store(eng)
    write = write_direct if path == "inline" else None
    try:
        bad = BatchOutput(batch_id=1, alerts=[Alert(SUBS[1], "r", "trades", "K", "MAYBE", T0, {})])
        # inline: CHECK (kind IN ('ENTER', 'EXIT', 'CAPPED')); default: the same check, in Arrow
        with pytest.raises(IntegrityError if write else ValueError, match=None if write else "MAYBE"):
            store.commit(bad, watermark=T0, metrics=METRICS, write=write)
        assert store.last_committed() == -1 and store.unexpanded() == []
        good = BatchOutput(batch_id=1, alerts=[Alert(SUBS[1], "r", "trades", "K", "ENTER", T0, {"x": 1})])
        assert store.commit(good, watermark=T0, metrics=METRICS, write=write)
        assert store.project_pending() == (0 if write else 1)
        assert [a["key"] for a in store.alerts_of_batch(1)] == ["K"]
        with eng.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM current_results")).scalar() == 1
            # the net changes' table is empty after the commit
            assert conn.execute(text("SELECT count(*) FROM tw_net")).scalar() == 0
    finally:
        eng.dispose()


def test_commit_records_the_top_subscriptions_alerts_and_lookups(restartable_pg: Settings) -> None:
    """``engine_metrics.top_alerts``: the batch's three subscriptions with the most alerts (ties by
    id) and their counts, as UUID text; ``lookups``: the batch's lookup times; a batch without
    alerts has ``{}``; the evaluation's metrics are kept beside them."""
    from tests.engine.test_engine_integration import fresh_database

    eng = create_engine(fresh_database(restartable_pg.sqlalchemy_url))
    store = Store(eng)
    counts = {SUBS[0]: 5, SUBS[1]: 2, "not-a-uuid": 7, SUBS[3]: 2, SUBS[4]: 1}
    alerts = [
        Alert(sid, "r", "trades", f"K{i}", "ENTER", T0 + i, {}) for sid, n in counts.items() for i in range(n)
    ]
    random.Random(3).shuffle(alerts)
    try:
        big = BatchOutput(batch_id=1, alerts=alerts, lookups=[T0, T0 + 1000, T0 + 2000])
        assert store.commit(big, watermark=T0, metrics=METRICS | {"alerts": len(alerts)})
        assert store.commit(BatchOutput(batch_id=2, lookups=[T0 + 3000]), watermark=T0, metrics=METRICS)
        assert not store.commit(big, watermark=T0, metrics=METRICS)  # once per batch id
        with eng.connect() as conn:
            rows = conn.execute(
                text("SELECT batch_id, top_alerts, lookups, alerts, batch_ms FROM engine_metrics ORDER BY 1")
            ).all()
    finally:
        eng.dispose()
    odd = str(subscription_uuid("not-a-uuid"))
    top = {odd: 7, SUBS[0]: 5, min(SUBS[1], SUBS[3]): 2}  # SUBS[1] and SUBS[3] tie: the smaller id
    assert [tuple(r) for r in rows] == [(1, top, 3, 17, 2.0), (2, {}, 1, 0, 2.0)]


def test_an_id_already_logged_in_a_sessions_first_batch(restartable_pg: Settings) -> None:
    """The fallback for an alert id already logged, in the first transaction of a database
    session (a restarted engine re-logging what another engine id logged): the temporary table
    of the net changes must outlive the savepoint the fallback rolls back to."""
    from tests.engine.test_engine_integration import fresh_database

    db = fresh_database(restartable_pg.sqlalchemy_url)
    first, second, third, fourth = _batches()
    for out in (first, second, third, fourth):
        eng = create_engine(db)  # a new session for every batch
        try:
            assert Store(eng).commit(out, watermark=T0 + out.batch_id, metrics=METRICS, write=write_direct)
        finally:
            eng.dispose()
    eng = create_engine(db)
    try:
        assert len(_tables(eng)["alerts"]) == 803
    finally:
        eng.dispose()
