"""The sharded engine's scenario, shared by the local test and the cluster job (issue #23).

The scenario of tests/engine/test_engine_integration.py with ``engine_shards`` = N and the rules
of ``SHARD_RULES`` (the scenario's, a ROWS, a historical, a FILTER and a dst_ip rule, every
RULES.md example and a random mix of 24): the alert log in PostgreSQL must equal
``tidewatch backtest`` on the same good events, the alerts in Kafka must
be the same, once each, every bad record dead-lettered once; then (``restart``), once every
shard's snapshot is named in Spark's state store, the engine is stopped and started again on its
checkpoint and a rule added (PSoup): every shard is rebuilt from Spark's state store (its snapshot
file and the batches after it) and the new rule is answered from the history the shards hold.
Before that start the last batch's Spark commit is deleted (a crash between the sinks' commit and
Spark's): Spark runs it again, the engine finds it committed in PostgreSQL and skips it.

``chaos``: called in a thread once the events are produced, with the running engine (e.g. to
SIGKILL executors); the scenario's checks must hold all the same.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from tests.engine.shards.support import SHARD_RULES
from tests.engine.support import (
    LATE_RULE,
    G,
    add_rule,
    backtest,
    make_scenario,
    produce,
    produce_rules,
    read_topic,
    result_at,
)
from tests.engine.test_engine_integration import engine_settings, fresh_database, topics_of, wait_for


def run_sharded_scenario(
    spark: Any,
    bootstrap: str,
    pg_url: str,
    tmp: Path,
    shards: int,
    *,
    restart: bool = True,
    chaos: Callable[[Any], None] | None = None,
    per_trigger: int = 2500,
    timeout_s: float = 300,
    cap: int = 0,
    overload: bool = False,
    charts: bool = False,
    first_conf: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the scenario (module docstring); raises on any difference.  Returns what the test
    may check further: the process ids the shards ran in, rebuilds, batches.  ``cap``: with the
    alert cap (``engine_alert_cap_per_lookup``) at ``cap``: the alert log is checked against the
    backtest capped (:func:`check_capped`).  ``overload``: a third of the rules with a staleness
    budget and the overload policy's marks so low that every batch is overloaded: the driver
    degrades them (strides recorded with the batches, the same in every shard), and the alert log
    is checked against the backtest at the lookup times used.  ``charts``: a key page's chart
    request answered by the shard owning the key (:func:`check_chart`).  ``first_conf``: Spark
    configuration entries the first run's query starts with (the session's own values back for
    the restart)."""
    from engine.shards.engine import ShardedEngine
    from engine.sinks.publish import ensure_topics

    run = uuid.uuid4().hex[:8]
    marks = {"engine_overload_high": 1e-9, "engine_overload_low": 1e-10} if overload else {}
    s = engine_settings(run, tmp / "ckpt", engine_shards=shards, engine_alert_cap_per_lookup=cap, **marks)
    db = fresh_database(pg_url)
    ensure_topics(bootstrap, s)
    sc = make_scenario()
    budgets = {name: 4 * G for name in list(SHARD_RULES)[::3]} if overload else None
    produce_rules(sc, bootstrap, s.topic_subscriptions, SHARD_RULES, budgets)
    final = (sc.max_ts - s.allowed_lateness_ms) // G * G
    info: dict[str, Any] = {
        "pids": set(), "batches": 0, "rebuilds": {}, "rebuilt_from": {}, "schedule": {}, "inputs": Counter(),
        "published": Counter(), "engine_id": run, "settings": s,
    }  # fmt: skip

    @contextmanager
    def running() -> Iterator[tuple[Any, Any]]:
        """The engine on its checkpoint, stopped and closed after; its pids and batches noted."""
        app = ShardedEngine(s, bootstrap=bootstrap, pg_url=db, engine_id=run)
        q = app.start(spark, trigger_seconds=0.5, max_offsets_per_trigger=per_trigger)
        try:
            yield app, q
        finally:
            q.stop()
            app.close()
            info["pids"] |= app.executor_pids
            info["batches"] += app.batches_done
            info["schedule"].update(app.schedule)
            info["inputs"].update(app.inputs)
            info["published"].update(app.published)

    # the first run's query with ``first_conf`` (Spark clones the session when the query's thread
    # starts: the values go back once the first run is over, before the restart)
    conf_back = {k: spark.conf.get(k) for k in first_conf or {}}
    for k, v in (first_conf or {}).items():
        spark.conf.set(k, v)
    try:
        with running() as (app, q):
            wait_for(lambda: app.rules == len(SHARD_RULES), 180, "every rule to be active in every shard")
            produce(sc, bootstrap, topics_of(s))
            chaos_thread = None
            if chaos is not None:
                chaos_thread = threading.Thread(target=chaos, args=(app,), daemon=True)
                chaos_thread.start()
            wait_for(
                lambda: app.applied_until == final or not q.isActive,
                timeout_s,
                f"every shard to look up at {final}",
            )
            assert q.isActive, q.exception()
            if chaos_thread is not None:
                chaos_thread.join(timeout_s)
            assert app.batches_done >= 3
            if charts:
                q.processAllAvailable()  # idle from here: the chart's batch is a tick's
                info["chart"] = check_chart(app, sc.sub_ids["count"], run)
            if restart:
                await_snapshots_named(app, q, bootstrap, s.topic_subscriptions, shards, timeout_s)
                q.processAllAvailable()  # stopped between batches: the last one planned is committed
    finally:
        for k, v in conf_back.items():
            spark.conf.set(k, v)
    info["rebuilds_first_run"] = dict(app.rebuilds)
    sid = None
    if restart:
        rerun = _forget_last_spark_commit(tmp / "ckpt" / "spark")
        with running() as (app, q):
            sid = add_rule(sc, bootstrap, s.topic_subscriptions, *LATE_RULE)
            wait_for(lambda: any(a[0] == sid for a in app.store.alert_log()), 180, "the new rule's alerts")
            # every shard rebuilt from Spark's state store at the restart's first batch (the live
            # cores of the run before are not reused: they may be ahead of what Spark committed)
            assert sorted(app.rebuilds) == list(range(shards)) and all(app.rebuilds.values()), app.rebuilds
            # from a snapshot the shards wrote during the first run (snapshot_every_batches = 3),
            # and the batches logged after it
            assert all(b >= 0 for b in app.rebuilt_from.values()), app.rebuilt_from
            # the batch whose Spark commit was forgotten ran again and was found in PostgreSQL
            # (nothing delivered twice: the checks below)
            assert rerun in app.skipped and app.skipped == sorted(app.skipped), (rerun, app.skipped)
        info["rebuilds"] = dict(app.rebuilds)
        info["rebuilt_from"] = dict(app.rebuilt_from)

    log = app.store.alert_log()
    original = {sc.sub_ids[n] for n in SHARD_RULES}
    got = [a for a in log if a[0] in original]
    skip = None
    if overload:
        from engine.overload import schedule

        runs = info["schedule"]
        strided = {b for b, (_, st) in runs.items() if st}
        assert len(strided) >= 2 and {sc.sub_ids[n] for n in budgets or {}} >= set().union(
            *(runs[b][1] for b in strided)
        ), runs
        skip = schedule([runs[b] for b in sorted(runs)], G)
        info["strided_batches"] = len(strided)
    expect = backtest(sc, SHARD_RULES, final, skip=skip)
    assert len(expect) > 100
    if cap:
        check_capped(app.store, got, expect, cap, final)
    else:
        check_exact(got, expect)

    if sid is not None:
        late = [a for a in log if a[0] == sid]
        ref = result_at(backtest(sc, dict([LATE_RULE]), final), final)
        assert ref and {a[1] for a in late} == ref
        assert all(a[2] == "ENTER" and a[3] == final for a in late)

    check_kafka(bootstrap, s, log, sc)
    # the driver's CPU since the batch before (0013): none at each run's first batch, then each
    with create_engine(db).connect() as conn:
        cpu = [c for (c,) in conn.execute(text("SELECT driver_cpu_ms FROM engine_metrics"))]
    assert sum(c is None for c in cpu) == (2 if restart else 1) and sum(c or 0.0 for c in cpu) > 0, cpu
    info["alerts"] = len(log)
    return info


def check_exact(got: list[tuple[str, str, str, int]], expect: list[tuple[str, str, str, int]]) -> None:
    """The alert log ``got`` is the backtest's ``expect``, every alert once."""
    missing, extra = sorted(set(expect) - set(got)), sorted(set(got) - set(expect))
    assert not missing and not extra, (
        f"missing {len(missing)}: {missing[:5]}; extra {len(extra)}: {extra[:5]}"
    )
    assert sorted(got) == expect  # once each


def check_kafka(bootstrap: str, s: Any, log: list[tuple[str, str, str, int]], sc: Any) -> None:
    """Kafka's ``alerts`` (read_committed) hold the alert log ``log``, each alert once; its
    ``dead_letter`` topic every bad record of the scenario, once."""
    kafka_alerts = read_topic(bootstrap, s.topic_alerts, "alerts")
    ids = [a["id"] for a in kafka_alerts]
    assert len(ids) == len(set(ids)) == len(log), (len(ids), len(set(ids)), len(log))
    assert set(ids) == {f"{a[0]}|{a[1]}|{a[2]}|{a[3]}" for a in log}

    dead = read_topic(bootstrap, s.topic_dead_letter, "dead_letter")
    assert sorted(d["reason"] for d in dead) == sorted(r for _, r in sc.bad_trades)
    assert sorted(d["value"] for d in dead) == sorted(v for v, _ in sc.bad_trades)


def check_chart(app: Any, sid: str, engine_id: str) -> dict[str, Any]:
    """A key page's chart request (a row of ``chart_requests``, as the dashboard inserts it) for
    a key of rule ``sid`` is answered by the sharded engine, idle now (its stream read to the
    end): the driver writes a tick and Spark runs one batch for it (engine.shards.ticks), in which
    the shard owning the key answers from its state (engine.shards.charts): the rule's aggregates
    with values."""
    from sqlalchemy import text

    key = next(a[1] for a in app.store.alert_log() if a[0] == sid)
    with app.store.engine.begin() as conn:
        rid = conn.execute(
            text(
                "INSERT INTO chart_requests (subscription_id, key) VALUES (CAST(:s AS uuid), :k) RETURNING id"
            ),
            {"s": sid, "k": key},
        ).scalar_one()
    ticks, batches = app.charts.ticks_written, app.batches_done
    deadline = time.monotonic() + 90
    row = None
    while time.monotonic() < deadline:
        with app.store.engine.connect() as conn:
            row = conn.execute(
                text("SELECT answered_by, answer, error FROM chart_requests WHERE id = :i"), {"i": rid}
            ).first()
        if row is not None and (row[1] is not None or row[2] is not None):
            break
        time.sleep(1.0)
    assert row is not None and row[0] == engine_id and row[2] is None, row
    # answered in a batch run for a tick: the stream had nothing new
    assert app.charts.ticks_written > ticks and app.batches_done > batches, (app.charts.ticks_written, ticks)
    assert app.inputs.get("tick", 0) >= 2, app.inputs  # both shards ran the tick's batch
    answer = row[1]
    values = [v for a in answer["aggregates"] for v in a.get("values", []) if v is not None]
    assert answer["times"] and values, answer
    return dict(answer)


def check_capped(
    store: Any,
    got: list[tuple[str, str, str, int]],
    expect: list[tuple[str, str, str, int]],
    cap: int,
    final: int,
) -> None:
    """The alert log ``got`` of a capped run against the backtest's ``expect`` (uncapped): per
    (subscription, lookup time) at most ``cap`` alerts, all of them the backtest's, once each, and
    when the backtest has more, one CAPPED record counting the rest (by kind); ``current_results``
    every rule's exact result at ``final`` (the withheld changes applied too)."""
    from collections import Counter

    from sqlalchemy import text

    from engine.sinks.store import dt_to_ms

    kept = [a for a in got if a[2] != "CAPPED"]
    assert len(kept) == len(set(kept)) and set(kept) <= set(expect)
    want = Counter((a[0], a[3]) for a in expect)
    have = Counter((a[0], a[3]) for a in kept)
    with store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT subscription_id::text, as_of, values FROM alerts WHERE kind = 'CAPPED'")
        ).all()
        current = conn.execute(text("SELECT subscription_id::text, key FROM current_results")).all()
    capped = {(sid, dt_to_ms(t)): v for sid, t, v in rows}
    assert len(capped) == len(rows) and len(capped) > 5, len(capped)  # one record per lookup
    for g, n in want.items():
        assert have[g] == min(n, cap), (g, n, have[g])
        if n > cap:
            v = capped[g]
            enters = sum(1 for a in expect if (a[0], a[3]) == g and a[2] == "ENTER") - sum(
                1 for a in kept if (a[0], a[3]) == g and a[2] == "ENTER"
            )
            assert (v["withheld"], v["withheld_enter"], v["cap"]) == (n - cap, enters, cap), (g, v)
    assert set(capped) <= {g for g, n in want.items() if n > cap}
    for sid in {a[0] for a in expect}:
        exact = result_at([a for a in expect if a[0] == sid], final)
        assert {k for s, k in current if s == sid} == exact, sid


def _forget_last_spark_commit(spark_dir: Path) -> int:
    """Delete the last batch's file in Spark's commit log (and its checksum), as a crash between
    the sinks' commit and Spark's leaves it: Spark runs that batch again at the next start, from
    the state before it.  Returns its batch id."""
    commits = spark_dir / "commits"
    last = max(int(f.name) for f in commits.iterdir() if f.name.isdigit())
    planned = max(int(f.name) for f in (spark_dir / "offsets").iterdir() if f.name.isdigit())
    # (a batch planned and not committed would be the one run again, delivered or not)
    assert planned == last, (
        f"batch {planned} planned, {last} committed: the query was not stopped between batches"
    )
    for f in (commits / str(last), commits / f".{last}.crc"):
        f.unlink(missing_ok=True)
    return last


def await_snapshots_named(
    app: Any, q: Any, bootstrap: str, topic: str, shards: int, timeout_s: float, since: int = 0
) -> None:
    """Until every shard's snapshot of batch ``since`` or later is named in Spark's state store by
    a batch Spark committed.

    A snapshot is named by the shard's next batch after its file is whole
    (:meth:`engine.shards.processor.ShardProcessor._snapshot`), which can take more batches than
    the scenario's events make.  Batches are made here by pausing a subscription that does not
    exist (every shard reads it, nothing changes); once every shard names one, one more batch is
    delivered, so Spark has committed the batch that named them."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    named_at = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert q.isActive, q.exception()
        metas = dict(app.metas)
        if named_at is None and len(metas) == shards and all(m.snapshot_of >= since for m in metas.values()):
            named_at = app.batches_done
        if named_at is not None and app.batches_done > named_at:
            return
        nobody = str(uuid.uuid4())
        p.produce(topic, key=nobody.encode(), value=json.dumps({"id": nobody, "op": "pause"}).encode())
        p.flush()
        time.sleep(1.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for every shard's snapshot to be named")
