"""The real ``tidewatch up``: SIGKILL the engine process; supervisord has it back within seconds,
``tidewatch status`` shows one restart, and the alert log in PostgreSQL equals ``tidewatch
backtest`` on the same trades (issue #20, "Hardening").

The run: ``tidewatch up --skip dashboard`` on a temporary run dir and free ports, so the relay
publishes the demo account's subscriptions (seeded by ``up``) and the demo feed sends trades
(a short backfill, then live).  Once the engine has committed a few batches, its Python process
(the pid supervisord reports) gets SIGKILL; supervisord starts a new one, which resumes from its
Spark checkpoint, offset logs and snapshots.  After it has committed more batches the feed is
stopped, and once the engine's batches stop coming its last lookup ``final`` is read from
``engine_batches`` (``floor(watermark / lookup period) * lookup period``).

The reference: every committed trade of the ``trades`` topic (``read_committed``) except exactly
the ones the engine dead-lettered (read from the dead-letter topic, by source partition and
offset), through :func:`engine.evaluation.backtest.iter_alerts` with the demo subscriptions of
the ``subscriptions`` table, the engine's lookup period (``engine_lookup_every_ms`` or
``pane_ms``), pane width and ``ci_p``; compared as sets of (subscription id, key, kind, as_of)
for as_of <= ``final``.  No dead letter may be ``late``: the engine replays from its
checkpoint, so a restart must not make any event late.

Subscriptions and the backtest: the backtest has every rule from the first event on.  The
engine has a rule from the batch that brought its subscription record; had that batch come
after events, the rule's first alerts would be a PSoup catch-up at that batch's time and the
comparison would have to start later for it.  It does not happen here, and the test checks it
rather than assuming it: ``up`` seeds the subscriptions before it starts the relay, and starts
the feed only after the relay and the engine run, so every subscription's outbox row must have
been published (``outbox.published_at``) before the Kafka timestamp of the first trade --
asserted.  The engine reads the subscription changes of a batch before its events
(:meth:`engine.core.EngineCore.process`), so each rule is active from the first event on.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition
from sqlalchemy.pool import NullPool

from tests.engine.support import end_offsets, read_topic, restarts_logged
from tests.services import free_port
from tests.tidewatch.stack.test_supervised_stack import (
    _alive,
    _kill_until_back,
    _status_row,
    _tidewatch,
    _tree_pids,
)
from tidewatch.settings import Settings, get_settings
from tidewatch.stack import postgres_server as postgres
from tidewatch.stack import processes as process
from tidewatch.stack import supervision
from tidewatch.wire.avro import decode

pytestmark = pytest.mark.integration

#: how long supervisord may take to have a SIGKILLed engine RUNNING again (startsecs 10 + Python start)
#: batches the engine must commit before the kill, and after its restart
BATCHES = 3
#: the engine is taken as done when no batch came for this long after the feed stopped
QUIET_S = 15.0


def _wait(what: str, cond: Any, timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _batches(db: sa.Engine) -> tuple[int, int, int | None]:
    """(committed batches, newest batch id, newest watermark in ms) of ``engine_batches``."""
    with db.connect() as conn:
        n, last, wm = conn.execute(
            sa.text("SELECT count(*), coalesce(max(batch_id), -1), max(watermark) FROM engine_batches")
        ).one()
    return int(n), int(last), None if wm is None else round(wm.timestamp() * 1000)


def _read_raw(bootstrap: str, topic: str, timeout: float = 120.0) -> list[tuple[int, int, int, bytes]]:
    """Every committed record of ``topic`` as (partition, offset, Kafka timestamp ms, value),
    ``read_committed``, up to the end offsets of now (as :func:`tests.engine.support.read_topic`)."""
    ends = end_offsets(bootstrap, topic)  # high watermarks, not the last stable offsets
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    out: list[tuple[int, int, int, bytes]] = []
    done = {p for p, hi in ends.items() if hi == 0}
    deadline = time.monotonic() + timeout
    while len(done) < len(ends):
        assert time.monotonic() < deadline, f"reading {topic} took over {timeout}s"
        for m in c.consume(5000, 0.5):
            if m.error() or m.value() is None:
                continue
            out.append((m.partition(), m.offset(), m.timestamp()[1], m.value()))
        for p, hi in ends.items():
            if c.position([TopicPartition(topic, p)])[0].offset >= hi:
                done.add(p)
    c.close()
    return out


def _backtest(
    s: Settings, rules: dict[str, str], trades: list[dict[str, Any]], every: int, until: int
) -> set[tuple[str, str, str, int]]:
    """(subscription id, key, kind, as_of) of ``tidewatch backtest`` on ``trades``, as_of <= until."""
    from engine.evaluation.backtest import EventFile, iter_alerts, make_evaluator
    from subscriptions.compiler import compile_rule

    plans = [(sid, text, compile_rule(text, s)) for sid, text in rules.items()]
    order = np.argsort(np.array([t["ts"] for t in trades], dtype=np.int64), kind="stable")
    cols: dict[str, np.ndarray] = {}
    for f in trades[0]:
        col = np.array([trades[i][f] for i in order])
        cols[f] = col.astype(object) if col.dtype.kind in "US" else col
    ev = make_evaluator("shared", s.ci_p, pane_ms=s.pane_ms)
    return {
        (rule, key, kind, int(as_of))
        for as_of, rule, key, kind in iter_alerts(plans, [EventFile("trades", cols)], every, evaluator=ev)
        if as_of <= until
    }


def test_sigkilled_engine_is_back_and_its_alert_log_equals_the_backtest(run_root: Path) -> None:
    base = get_settings()
    kp = free_port()
    env = {
        **os.environ,
        "TIDEWATCH_RUN_DIR": str(run_root / "run"),
        "TIDEWATCH_KAFKA_PORT": str(kp),
        "TIDEWATCH_KAFKA_BOOTSTRAP": f"127.0.0.1:{kp}",
        "TIDEWATCH_KAFKA_CONTROLLER_PORT": str(free_port()),
        "TIDEWATCH_PG_PORT": str(free_port()),
        "TIDEWATCH_DASHBOARD_PORT": str(free_port()),
        # a lighter demo feed than the default (31 min of history at 1000 trades/s): 2 cores
        "TIDEWATCH_DEMO_HISTORY_MINUTES": "2",
        "TIDEWATCH_DEMO_TRADE_RATE": "300",
        "COLUMNS": "220",  # rich's tables unfolded
    }
    s = Settings(
        run_dir=run_root / "run",
        cache_dir=base.cache_dir,
        kafka_port=kp,
        kafka_bootstrap=f"127.0.0.1:{kp}",
        kafka_controller_port=int(env["TIDEWATCH_KAFKA_CONTROLLER_PORT"]),
        pg_port=int(env["TIDEWATCH_PG_PORT"]),
        dashboard_port=int(env["TIDEWATCH_DASHBOARD_PORT"]),
    )
    if postgres.find_bin_dir(s) is None:
        pytest.fail("PostgreSQL binaries missing: run scripts/setup.sh")
    every = s.engine_lookup_every_ms or s.pane_ms
    t_start = time.monotonic()
    seen: set[int] = set()
    db = sa.create_engine(s.sqlalchemy_url, poolclass=NullPool)
    try:
        res = _tidewatch(env, "up", "--skip", "dashboard")
        assert res.returncode == 0, res.stdout + res.stderr
        infos = supervision.program_infos(s)
        assert {n: i["statename"] for n, i in infos.items()} == {
            "relay": "RUNNING",
            "engine": "RUNNING",
            "dashboard": "STOPPED",
            "feed": "RUNNING",
        }
        seen |= _tree_pids(s)

        # the engine at work: a few committed batches with events
        _wait(f"{BATCHES} committed engine batches", lambda: _batches(db)[0] >= BATCHES, 300)
        seen |= _tree_pids(s)

        # SIGKILL the engine's process (supervisord's pid): RUNNING again, as a new process
        last_before = _batches(db)[1]
        kill_ms = int(time.time() * 1000)
        t0 = time.monotonic()
        old, new, back_s = _kill_until_back(s, "engine")
        res = _tidewatch(env, "status")
        assert res.returncode == 0, res.stdout + res.stderr
        row = _status_row(res.stdout, "engine")
        assert row[1:3] == ["RUNNING", str(new)] and row[4] == "1", row  # state, pid, restarts

        # more committed batches by the new process, then the feed stops and the engine drains
        _wait("a batch after the restart", lambda: _batches(db)[1] > last_before, 300, every=0.2)
        t_first = time.monotonic() - t0
        _wait(
            f"{BATCHES} batches after the restart",
            lambda: _batches(db)[1] >= last_before + BATCHES,
            300,
        )
        t_resumed = time.monotonic() - t0
        seen |= _tree_pids(s)
        assert supervision.stop_program(s, "feed")
        quiet = {"state": _batches(db), "since": time.monotonic()}

        def drained() -> bool:
            now = _batches(db)
            if now != quiet["state"]:
                quiet.update(state=now, since=time.monotonic())
            return time.monotonic() - quiet["since"] >= QUIET_S

        _wait("the engine's batches to stop", drained, 300)
        _, last_batch, wm = quiet["state"]
        assert wm is not None
        final = wm // every * every
        assert supervision.program_infos(s)["engine"]["pid"] == new  # no second restart

        # the events, the dead letters, the subscriptions and the alert log
        raw = _read_raw(s.kafka_bootstrap, s.topic_trades)
        letters = read_topic(s.kafka_bootstrap, s.topic_dead_letter, "dead_letter", timeout=60)
        reasons = [d["reason"] for d in letters]
        assert "late" not in reasons, f"late dead letters across the restart: {len(reasons)}"
        dead = {
            (d["source_partition"], d["source_offset"])
            for d in letters
            if d["source_topic"] == s.topic_trades
        }
        trades = [decode(v, "trades") for p, o, _, v in raw if (p, o) not in dead]
        assert len(trades) == len(raw) - len(dead) and len(trades) > 1000
        with db.connect() as conn:
            rules = {
                str(sid): text
                for sid, text in conn.execute(
                    sa.text("SELECT id, rule_text FROM subscriptions WHERE state = 'active'")
                )
            }
            published = conn.execute(
                sa.text(
                    "SELECT count(*), max(published_at), count(published_at) FROM outbox WHERE topic = :t"
                ),
                {"t": s.topic_subscriptions},
            ).one()
            got = {
                (str(sid), key, kind, round(as_of.timestamp() * 1000))
                for sid, key, kind, as_of in conn.execute(
                    sa.text("SELECT subscription_id, key, kind, as_of FROM alerts")
                )
            }
        assert rules, "the demo subscriptions were not seeded"
        # every subscription published before the first trade: the engine has each rule from the
        # first event on, as the backtest does (module docstring)
        assert published[0] == published[2] >= len(rules)
        first_trade_ms = min(t for _, _, t, _ in raw)
        assert round(published[1].timestamp() * 1000) < first_trade_ms
        assert all(a[3] <= final for a in got), "an alert after the engine's last lookup"
        expect = _backtest(s, rules, trades, every, final)
        missing, extra = sorted(expect - got), sorted(got - expect)
        diff = {
            "missing": [(*a[:3], a[3], a[3] - kill_ms) for a in missing[:10]],
            "extra": [(*a[:3], a[3], a[3] - kill_ms) for a in extra[:10]],
        }
        assert not missing and not extra, (
            f"alert log != backtest up to {final} (kill at {kill_ms}; as_of - kill in ms): "
            f"{len(missing)} missing, {len(extra)} extra: {diff}"
        )
        # the comparison covers the new process's work: lookups after the kill need a watermark
        # past it, which only events sent after the kill give; it rebuilt the state it resumed from
        after = sum(1 for a in got if a[3] > kill_ms)
        assert after > 0 and len(got) > after, f"{len(got)} alerts, {after} after the kill"
        text_log = (s.run_dir / "logs" / "engine.log").read_text(errors="replace")
        assert restarts_logged(text_log) >= 1
        print(
            f"{len(got)} alerts ({after} after the kill) of {len(rules)} subscriptions equal the backtest of {len(trades)} trades "
            f"({len(dead)} dead letters: {sorted(set(reasons))}) up to {final}; kill at {kill_ms}, "
            f"engine batches up to {last_batch}; back {back_s:.1f}s, first new batch {t_first:.1f}s, {BATCHES} new batches {t_resumed:.1f}s after the kill"
        )
    finally:
        seen |= _tree_pids(s)
        db.dispose()
        res = _tidewatch(env, "down")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "supervisord, kafka, postgres" in res.stdout
    assert len(seen) > 6
    assert [pid for pid in seen if _alive(pid)] == []
    assert process.all_records(s.run_dir) == [] and not supervision.socket_path(s).exists()
    for port in (s.kafka_port, s.pg_port):
        assert not process.port_open("127.0.0.1", port)
    print(f"test took {time.monotonic() - t_start:.0f}s")
