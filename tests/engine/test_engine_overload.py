"""The overload policy on the real engine (Spark local[2], embedded Kafka and PostgreSQL).

A lookup-heavy workload -- many rules evaluated one by one (``MAX - MIN`` over a window: no
collective index, no group), a 250 ms lookup period -- with a backlog produced at once, so every
micro-batch carries more lookups than the engine does within half its trigger interval (the
policy's marks are set below their defaults, :data:`MARKS`).  Run twice:
half the subscriptions with a staleness budget, then the same with no budget anywhere.  With the
budgets the budgeted subscriptions are degraded (strides recorded with their batches), every gap
between a degraded subscription's lookups is within its budget, the others are looked up at every
lookup time, the evaluation costs less CPU than in the run without budgets, and each run's alert log
equals the backtest at the lookup times it actually used; a restart replays the committed batches
with their recorded strides and gets the alerts committed.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Producer
from sqlalchemy import create_engine, text

from bench.overload_bench import budget_of, rule_text  # the bench's workload: half with budgets, 4 s or 2 s
from tests.engine.support import Scenario, make_scenario, produce
from tests.engine.test_engine_integration import engine_settings, fresh_database, topics_of, wait_for
from tidewatch.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

P = 250  #: the pane width and lookup period (ms)
N_RULES = 240
#: the policy's marks at 0.3 / 0.15, below the defaults (0.9 / 0.5).  Measured here (Nov 28), the backlog's
#: batches without strides took 0.7-1.3 of the 0.5-s trigger interval: at the default high mark a
#: quiet machine can run every batch below it, and the policy then rightly degrades nothing (a
#: clean-clone run failed so).  At 0.45 / 0.25, half the defaults, Dec 1's runs (the lookups' CPU
#: 4.2-4.7 s without budgets, against 11-12.5 s on Nov 30: that day's code and machine) were
#: overloaded less often: 20.5-20.7 % of the lookups saved, their CPU 8-11 % lower, and a
#: clean-clone run missed the 0.9 bound below (3.9 s against 4.2); at 0.3 / 0.15 two runs saved
#: 34.5 / 36.6 %, the lookups' CPU 2.8 / 2.7 s against 4.2 / 4.3
MARKS = {"engine_overload_high": 0.3, "engine_overload_low": 0.15}


@dataclass
class Run:
    sids: dict[int, str]  # rule number -> subscription id
    batches: dict[int, tuple[list[int], dict[str, int]]]  # batch -> (lookup times, strides), as run
    recorded: dict[int, dict[str, int]]  # batch -> engine_batches.strides
    degraded: dict[int, dict[str, Any]]  # batch -> engine_metrics.degraded
    log: list[tuple[str, str, str, int]]  # (subscription, key, kind, as_of)
    latency: dict[str, list[float]]  # subscription -> seconds from the feed's start to each alert's commit
    final: int
    eval_s: float  # the batches' evaluation time (engine_metrics.batch_ms)
    cpu_s: float  # the evaluation thread's CPU time in the batches' evaluation (not other processes')
    lookup_cpu_s: float = 0.0  # the same thread's CPU time in the lookups alone (EngineCore._lookup_at)


def _subscribe(bootstrap: str, topic: str, budgets: bool, n_rules: int) -> dict[int, str]:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sids = {}
    for i in range(n_rules):
        sid = sids[i] = str(uuid.uuid4())
        doc: dict[str, Any] = {"id": sid, "name": f"r{i}", "rule": rule_text(i), "status": "active"}
        if budgets:
            doc["staleness_budget_ms"] = budget_of(i)
        p.produce(topic, key=sid.encode(), value=json.dumps(doc).encode())
    p.flush()
    return sids


def _run(
    spark: Any, kafka: Settings, pg: Settings, tmp: Path, sc: Scenario, budgets: bool, n_rules: int = N_RULES
) -> Run:
    from engine.app import EngineApp
    from engine.sinks.publish import ensure_topics

    run = uuid.uuid4().hex[:8]
    bootstrap = kafka.kafka_bootstrap
    s = engine_settings(run, tmp / f"ckpt-{run}", pane_ms=P, snapshot_every_batches=50, **MARKS)
    db = fresh_database(pg.sqlalchemy_url)
    ensure_topics(bootstrap, s)
    sids = _subscribe(bootstrap, s.topic_subscriptions, budgets, n_rules)
    final = (sc.max_ts - s.allowed_lateness_ms) // P * P
    app = EngineApp(s, bootstrap=bootstrap, pg_url=db, engine_id=run)
    batches: dict[int, tuple[list[int], dict[str, int]]] = {}
    process = app._process
    cpu = [0.0]

    def spy(batch_id: int, batch: Any, strides: dict[str, int] | None = None) -> Any:
        c = time.thread_time()
        out = process(batch_id, batch, strides)
        cpu[0] += time.thread_time() - c
        batches[batch_id] = (list(out.lookups), dict(out.strides))
        return out

    app._process = spy  # type: ignore[method-assign]
    from engine.core import EngineCore

    lookup = EngineCore._lookup_at
    looked = [0.0]

    def timed_lookup(core: Any, tau: int, out: Any) -> None:
        if core is not app.core:  # the driver's warm-up core, on a thread of its own
            return lookup(core, tau, out)
        c = time.thread_time()
        try:
            return lookup(core, tau, out)
        finally:
            looked[0] += time.thread_time() - c

    EngineCore._lookup_at = timed_lookup  # type: ignore[method-assign,assignment]
    q = app.start(spark, trigger_seconds=0.5, max_offsets_per_trigger=400)
    try:
        wait_for(lambda: len(app.core.rules) == n_rules, 120, "every rule to be active")
        t_feed = time.time()
        produce(sc, bootstrap, topics_of(s))
        wait_for(lambda: app.core.applied_until == final, 420, f"the engine to look up at {final}")
        app.drain(output=True)
        assert q.exception() is None
    finally:
        EngineCore._lookup_at = lookup  # type: ignore[method-assign]
        q.stop()
        app.close()
    replayed: list[tuple[str, str, str, int]] = []
    if budgets:  # a restart replays every committed batch (no snapshot yet) with its recorded strides
        again = EngineApp(s, bootstrap=bootstrap, pg_url=db, engine_id=run)
        replay = again._process

        def spy_replay(batch_id: int, batch: Any, strides: dict[str, int] | None = None) -> Any:
            if strides is not None:  # None: a batch read but not committed, decided anew
                assert strides == batches[batch_id][1]
            out = replay(batch_id, batch, strides)
            replayed.extend((a.subscription_id, a.key, a.kind, a.as_of) for a in out.alerts)
            return out

        again._process = spy_replay  # type: ignore[method-assign]
        try:
            again.recover()
            assert again.core.last_batch == app.core.last_batch
            # the degraded subscriptions' results are those of their last lookups, as live
            assert again.core.current == app.core.current
            assert again.core.applied_until == final
        finally:
            again.close()
    eng = create_engine(db)
    try:
        with eng.connect() as conn:
            recorded = {
                int(b): dict(st)
                for b, st in conn.execute(text("SELECT batch_id, strides FROM engine_batches"))
            }
            degraded = {
                int(b): dict(d)
                for b, d in conn.execute(text("SELECT batch_id, degraded FROM engine_metrics"))
            }
            eval_ms = conn.execute(text("SELECT sum(batch_ms) FROM engine_metrics")).scalar()
            rows = conn.execute(
                text(
                    "SELECT a.subscription_id::text, a.key, a.kind, a.as_of, b.committed_at FROM alerts a "
                    "JOIN engine_batches b USING (batch_id)"
                )
            ).all()
    finally:
        eng.dispose()
    latency: dict[str, list[float]] = {}
    log = []
    for sid, key, kind, as_of, committed in rows:
        log.append((sid, key, kind, round(as_of.timestamp() * 1000)))
        latency.setdefault(sid, []).append(committed.timestamp() - t_feed)
    if budgets:  # the replay's alerts, which it does not output, are the ones committed
        assert sorted(replayed) == sorted(log)
    return Run(
        sids,
        batches,
        recorded,
        degraded,
        sorted(log),
        latency,
        final,
        float(eval_ms or 0) / 1000,
        cpu[0],
        looked[0],
    )


def _backtest(sc: Scenario, r: Run) -> list[tuple[str, str, str, int]]:
    """The backtest at the lookup times the run used (its batches' lookup times and strides)."""
    from engine.evaluation.backtest import EventFile, iter_alerts
    from engine.overload import schedule
    from subscriptions.compiler import compile_rule
    from tidewatch.settings import get_settings

    plans = [(sid, rule_text(i), compile_rule(rule_text(i), get_settings())) for i, sid in r.sids.items()]
    skip = schedule([r.batches[b] for b in sorted(r.batches)], P)
    files = [EventFile("trades", dict(sc.trades))]
    return sorted(
        (rule, key, kind, int(as_of))
        for as_of, rule, key, kind in iter_alerts(plans, files, P, ci_p=2, skip=skip)
        if as_of <= r.final
    )


def test_overload_degrades_budgeted_subscriptions_within_budget_and_keeps_the_others_latency(
    spark: Any, restartable_kafka: Settings, restartable_pg: Settings, tmp_path: Path
) -> None:
    from engine.overload import schedule

    sc = make_scenario(n_trades=9000, n_packets=0, seconds=150, seed=11)
    sc.bad_trades = []
    # a short run first, so that neither side pays the session's first streaming query (JVM
    # warm-up, Spark's Python workers): measured, that made the first run's alerts ~10 s later
    warm = make_scenario(n_trades=1500, n_packets=0, seconds=40, seed=12)
    warm.bad_trades = []
    _run(spark, restartable_kafka, restartable_pg, tmp_path, warm, budgets=False, n_rules=8)
    policed = _run(spark, restartable_kafka, restartable_pg, tmp_path, sc, budgets=True)
    plain = _run(spark, restartable_kafka, restartable_pg, tmp_path, sc, budgets=False)

    budget = {sid: budget_of(i) for i, sid in policed.sids.items()}
    loose = {sid for sid, b in budget.items() if b is None}
    # the strides the batches ran with are the ones committed with them, within the budgets
    assert {b: st for b, (_, st) in policed.batches.items()} == {
        b: policed.recorded[b] for b in policed.batches
    }
    strided = {sid for st in policed.recorded.values() for sid in st}
    assert strided and not strided & loose, "the budgeted subscriptions, and only they, were degraded"
    for b, st in policed.recorded.items():
        assert policed.degraded[b] == {
            sid: {"every_ms": k * P, "budget_ms": budget[sid]} for sid, k in st.items()
        }
        assert all(k * P <= (budget[sid] or 0) for sid, k in st.items())
    assert all(not st for st in plain.recorded.values()) and all(not d for d in plain.degraded.values())

    # lookup times: every multiple of P from the first to the last, once; per subscription the
    # ones its strides left it -- every gap within its budget, the unbudgeted ones at every time
    taus = [t for b in sorted(policed.batches) for t in policed.batches[b][0]]
    assert taus == list(range(taus[0], policed.final + 1, P))
    skip = schedule([policed.batches[b] for b in sorted(policed.batches)], P)
    offs = {t: skip(t) for t in taus}
    assert not any(off & loose for off in offs.values())
    saved = sum(len(off) for off in offs.values())
    assert saved > len(taus) * N_RULES // 10, f"only {saved} lookups saved"
    for sid in strided:
        looked = [t for t in taus if sid not in offs[t]]
        gaps = np.diff(looked)
        assert gaps.max() <= budget[sid], (sid, budget[sid], int(gaps.max()))

    # exact: each alert log is the backtest at the lookup times the run used
    expect = _backtest(sc, policed)
    assert len(expect) > 300
    assert policed.log == expect
    assert plain.log == _backtest(sc, plain)

    # the undegraded subscriptions' alerts, from the feed's start to their commit (same events, rules)
    def stats(r: Run) -> tuple[float, float]:
        mine = {r.sids[i] for i in range(N_RULES) if budget_of(i) is None}
        lat = np.concatenate([r.latency[s] for s in mine if s in r.latency])
        return float(np.percentile(lat, 50)), float(lat.max())

    (p50, top), (p50_plain, top_plain) = stats(policed), stats(plain)
    print(  # the figures, with -s
        f"undegraded alerts, s from the feed's start: p50 {p50:.1f} max {top:.1f} with budgets, "
        f"p50 {p50_plain:.1f} max {top_plain:.1f} without; lookups saved {saved} of {len(taus) * N_RULES}; "
        f"evaluation {policed.eval_s:.1f} s with budgets, {plain.eval_s:.1f} s without; "
        f"its CPU {policed.cpu_s:.1f} s with budgets, {plain.cpu_s:.1f} s without; "
        f"the lookups' CPU {policed.lookup_cpu_s:.1f} s with budgets, {plain.lookup_cpu_s:.1f} s without"
    )
    # asserted: the engine's capacity, the CPU time of the lookups the policy spaces -- what bounds
    # its lag under a feed faster than it (a run with no policy has the same: this fails without
    # it).  Not the whole evaluation's CPU, and with a margin: the events' application is the same
    # on both sides, and a CI run (Nov 30) gave 9.5 s against 11.0 (0.86) for the same 37 % of the
    # lookups saved that gave 7.7 s against 12.5 for the lookups (0.62) in another run: the CPU
    # time of the same work varies by ±15 % here between runs.  The wall-clock figures above are reported, not asserted: the
    # machine is shared, and in one run of four another process's load gave the policy's run the
    # later alerts (max 23.4 s against 18.8 s, its evaluation 20.6 s of wall time against 18.1 s);
    # the others had 13.1-16.9 s against 18.2-22.7 s (docs/measurements/engine.md, "Overload by
    # policy")
    assert policed.lookup_cpu_s < 0.9 * plain.lookup_cpu_s, (policed.lookup_cpu_s, plain.lookup_cpu_s)
