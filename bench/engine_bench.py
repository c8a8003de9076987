"""Tidewatch's engine side by side with the plain-Spark baseline: same events, same rules, one run.

Both sides read the same Kafka ``trades`` topic (Avro, 5,000 symbols, Zipf-skewed activity) on
the same SparkSession (``local[2]``) in the same process:

* **baselines** (``--baseline perrule|onescan|both``), draining the backlog with
  ``Trigger.AvailableNow`` to the ``noop`` sink: per rule (:mod:`bench.spark_baseline`, one
  ``groupBy(window(ts, T, slide), symbol)`` + HAVING per rule; ``--shapes``: ``queries``, a
  streaming query per rule, ``union``, one query over the union; both scan Kafka once per rule)
  and one scan (:mod:`bench.onescan_baseline`: Kafka read once, the rules as a broadcast table,
  one ``groupBy``); the ratio is also given against the better baseline;
* **Tidewatch** (:class:`engine.app.EngineApp`): the same rules subscribed through the
  ``subscriptions`` topic, then the same events; every rule is looked up at every 1 s pane
  (a finer slide than the baseline's), alerts committed to PostgreSQL and published to Kafka
  exactly once.  After each drain its alert log is checked against the backtest's evaluation
  code on the same trades, up to the engine's last lookup (``--no-check`` skips it): the figures
  are of exact output or the bench exits 1.

Sustained events/s = events drained / wall seconds (the baseline's rate counts the rows its
slowest query read when it did not finish within ``--timeout``).  Needs Kafka and PostgreSQL
(``tidewatch up``, or ``--bootstrap`` / ``--database-url``); each run makes its own topics and
database.

    .venv/bin/python bench/engine_bench.py --rules 10 --events 100000
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.spark_baseline import make_rules, run_baseline  # noqa: E402

if TYPE_CHECKING:
    import pyarrow as pa

    from engine.core import EngineCore
    from tidewatch.settings import Settings


def make_trades(n: int, n_symbols: int, rate: float, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` trades at ``rate`` events/s of event time, ending a minute ago (never "future")."""
    rng = np.random.default_rng(seed)
    span_ms = int(n / rate * 1000)
    t_end = int(time.time() * 1000) - 60_000
    ts = np.sort(rng.integers(t_end - span_ms, t_end, n)).astype(np.int64)
    ranks = rng.zipf(1.2, n) % n_symbols
    return {
        "symbol": np.array([f"S{i:05d}" for i in range(n_symbols)], dtype=object)[ranks],
        "ts": ts,
        "price": np.round(rng.uniform(10, 200, n), 2),
        "size": rng.integers(1, 1000, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n),
        "exchange": np.array(["NASDAQ"] * n, dtype=object),
    }


def run_settings(base: Any, prefix: str, run: str, **more: Any) -> Any:
    """``base`` with topics of their own (``<prefix>-<topic>-<run>``), a fresh checkpoint folder
    (removed when this process exits: a live run's snapshots are ≈ 0.5 GB) and no snapshots (a
    benchmark run never restarts), plus ``more``."""
    topics = ("trades", "packets", "subscriptions", "alerts", "results", "dead_letter")
    update: dict[str, Any] = {f"topic_{t}": f"{prefix}-{t.replace('_', '-')}-{run}" for t in topics}
    update["checkpoint_dir"] = Path(tempfile.mkdtemp(prefix=f"tw-{prefix}-"))
    atexit.register(shutil.rmtree, update["checkpoint_dir"], True)
    update["snapshot_every_batches"] = 10**9
    return base.model_copy(update=update | more)


def produce(bootstrap: str, topic: str, cols: dict[str, np.ndarray]) -> float:
    from confluent_kafka import Producer

    from tidewatch.wire.avro import encode_batch

    t0 = time.perf_counter()
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "queue.buffering.max.messages": 2_000_000,
            "batch.num.messages": 10_000,
            "compression.type": "lz4",
        }
    )
    for i, (sym, v) in enumerate(zip(cols["symbol"], encode_batch("trades", cols).messages(), strict=True)):
        p.produce(topic, key=sym.encode(), value=v)
        if i % 50_000 == 0:
            p.poll(0)
    p.flush()
    return time.perf_counter() - t0


def admin_url(database_url: str | None, settings: Settings) -> str:
    """``--database-url``, else the embedded stack's PostgreSQL (``tidewatch up``), whose
    application role is first allowed to create databases (one per run)."""
    if database_url:
        return database_url
    from tidewatch.stack.postgres_server import allow_createdb

    allow_createdb(settings)
    return settings.sqlalchemy_url


def fresh_database(admin_url: str, revision: str = "head", *, drop_at_exit: bool = True) -> str:
    """A new database on ``admin_url``'s server, migrated to ``revision``: its URL.  It is
    dropped when this process exits (:func:`drop_database`): a live run's alert log is
    hundreds of MB, and the dev server kept every bench's before 2026-12-01.  Not when
    ``drop_at_exit`` is false: on a server of the run's own, removed with its data before the
    process exits (:func:`tidewatch.stack.private.private_services`)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tidewatch.db.migrate import upgrade

    name = f"bench_{uuid.uuid4().hex[:10]}"
    eng = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    eng.dispose()
    if drop_at_exit:
        atexit.register(drop_database, admin_url, name)
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    upgrade(url, revision)
    return url


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` of ``admin_url``'s server, ending its sessions (PostgreSQL 13+);
    a server that is gone already is said, not raised (called at exit)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    eng = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    except OperationalError as exc:  # the server stopped before this process
        print(f"bench database {name} not dropped: {exc.orig}", file=sys.stderr)
    finally:
        eng.dispose()


def subscription_value(sid: str, name: str, text: str, settings: Settings, with_plan: bool) -> dict[str, Any]:
    """A rule's record on the ``subscriptions`` topic.  ``with_plan``: what ``tidewatch subscribe``
    and the dashboard publish (:func:`subscriptions.service.change_message`: the text and the
    compiled plan, compiled here, before the run, as the subscription service does at subscribe
    time -- the engine rebuilds the plan from its JSON, also at every replay); else the text
    alone, as an outside producer may write it (the engine compiles the text, at every replay too)."""
    from subscriptions.compiler import compile_rule

    value: dict[str, Any] = {"id": sid, "name": name, "rule": text}
    if with_plan:
        value["plan"] = compile_rule(text, settings).to_json()
    return value


def expected_alerts(
    rules: list[tuple[str, str]], cols: dict[str, np.ndarray], settings: Settings, until: int
) -> list[tuple[str, str, str, int]]:
    """(subscription id, key, kind, as_of) of ``tidewatch backtest``'s evaluation code on the
    bench's trades, ``rules`` as (subscription id, text), lookups every
    ``settings.lookup_period_ms`` up to ``until`` -- what the engine's alert log must hold after
    it drained the same events and looked up at ``until`` (RULES.md, the backtest contract)."""
    from engine.evaluation.backtest import EventFile, iter_alerts
    from subscriptions.compiler import compile_rule

    plans = [(sid, text, compile_rule(text, settings)) for sid, text in rules]
    files = [EventFile("trades", dict(cols))]
    return sorted(
        (rule, key, kind, int(as_of))
        for as_of, rule, key, kind in iter_alerts(plans, files, settings.lookup_period_ms, ci_p=settings.ci_p)
        if as_of <= until
    )


def compare_alerts(
    got: list[tuple[str, str, str, int]], expect: list[tuple[str, str, str, int]]
) -> dict[str, Any]:
    """The engine's alert log (``got``) against the backtest's (``expect``): counts, the first
    few alerts missing and extra, and ``equal`` (the same alerts, each once)."""
    g, e = set(got), set(expect)
    missing, extra = sorted(e - g), sorted(g - e)
    return {
        "equal": sorted(got) == sorted(expect),
        "alerts": len(got),
        "expected": len(expect),
        "missing": len(missing),
        "extra": len(extra),
        "duplicates": len(got) - len(g),
        "first_missing": [list(a) for a in missing[:3]],
        "first_extra": [list(a) for a in extra[:3]],
    }


def run_tidewatch(
    spark: Any,
    settings: Settings,
    bootstrap: str,
    db: str,
    rules: list[Any],
    cols: dict[str, np.ndarray],
    max_offsets: int,
    timeout_s: float,
    with_plan: bool = True,
    check: bool = True,
) -> dict[str, Any]:
    import json as _json

    import psutil
    from confluent_kafka import Producer

    from engine.app import EngineApp
    from engine.shards.engine import ShardedEngine

    app: Any = (ShardedEngine if settings.engine_shards else EngineApp)(
        settings, bootstrap=bootstrap, pg_url=db, engine_id=uuid.uuid4().hex[:8]
    )
    p = Producer({"bootstrap.servers": bootstrap})
    sids: list[str] = []
    for r in rules:
        sid = str(uuid.uuid4())
        sids.append(sid)
        p.produce(
            settings.topic_subscriptions,
            key=sid.encode(),
            value=_json.dumps(subscription_value(sid, r.name, r.text, settings, with_plan)).encode(),
        )
    p.flush()
    # the rules first (active before any event, as in a live system), then the engine is stopped,
    # the events are produced as a backlog, and the engine restarted to drain it
    q = app.start(spark, trigger_seconds=0.05, max_offsets_per_trigger=max_offsets)
    deadline = time.monotonic() + 120
    while not _rules_active(app, len(rules)) and time.monotonic() < deadline:
        time.sleep(0.1)
    q.stop()
    assert _rules_of(app) == len(rules), "rules not active"
    n = len(cols["ts"])
    produce(bootstrap, settings.topic_trades, cols)
    batches = app.delivered  # (start of evaluation, end of output, events) of every engine batch
    del batches[:]
    me = psutil.Process()
    cpu_start = sum(me.cpu_times()[:2])  # this process: every engine thread, librdkafka's too
    t0 = time.perf_counter()
    q = app.start(spark, trigger_seconds=0.05, max_offsets_per_trigger=max_offsets)
    try:

        def seen() -> float:  # every record is either applied or dead-lettered (e.g. late)
            return app.totals["events"] + app.totals["dead_letters"]

        deadline = time.monotonic() + timeout_s
        cpu_at: list[tuple[float, float]] = []  # (perf_counter, this process's CPU-s), every 0.05 s
        while seen() < n and time.monotonic() < deadline:
            time.sleep(0.05)
            cpu_at.append((time.perf_counter(), sum(me.cpu_times()[:2])))
        wall = time.perf_counter() - t0
        done = int(seen())
        cpu_s = sum(me.cpu_times()[:2]) - cpu_start
    finally:
        q.stop()
        app.close()
    rss = psutil.Process().memory_info().rss
    # steady state: from the end of the first batch to the end of the last (Spark's query start-up
    # and the first batch's JIT warm-up excluded; Spark's per-batch cost between batches included)
    steady = steady_cpu = None
    if len(batches) >= 3:
        rest = sum(b[2] for b in batches[1:])
        steady = rest / (batches[-1][1] - batches[0][1])
        # the driver's CPU over the same span: the first sample after the first batch's end to
        # the last sample (taken as the last batch's events were counted); the start-up's fixed
        # cost -- the query's start, the rules' restore, the first batch's JIT -- left out
        after = [c for t, c in cpu_at if t >= batches[0][1]]
        if len(after) >= 2:
            steady_cpu = (after[-1] - after[0], rest)
    per_batch = [round(b[1] - b[0], 3) for b in batches]
    checked = None
    if check:  # the alert log against the backtest on the same events, up to the last lookup
        t_check = time.perf_counter()
        until = app.core.applied_until if hasattr(app, "core") else app.applied_until
        expect = (
            expected_alerts(
                [(sid, r.text) for sid, r in zip(sids, rules, strict=True)], cols, settings, until
            )
            if until is not None
            else []
        )
        checked = compare_alerts(app.store.alert_log(), expect)
        checked |= {"until": until, "seconds": round(time.perf_counter() - t_check, 1)}
    return {
        "seconds": wall,
        "events": done,
        "finished": done >= n,
        "alerts": int(app.totals["alerts"]),
        "dead_letters": int(app.totals["dead_letters"]),
        "batches": app.batches_done,
        "steady_events_per_s": steady,
        "batch_seconds": per_batch,
        "state_bytes": _state_bytes(app),
        "driver_rss_bytes": rss,
        "cpu_s": cpu_s,  # the engine process's CPU while it drained the backlog (start-up included)
        # the same from the end of the first batch on: (CPU-s, events of the later batches)
        "steady_cpu": steady_cpu,
        "backtest": checked,  # None with --no-check
    }


def against_better(tw: dict[str, Any], baselines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Tidewatch against the fastest of ``baselines`` (shape -> :func:`run_baseline`'s result
    with ``events_per_s``): steady rates on both sides when every baseline has one, else rates
    with start-up included.  A baseline that did not finish its first micro-batch counts at the
    bound ``below_events_per_s`` (the ratio is then a lower bound, ``bound``)."""
    basis = "steady" if tw.get("steady_events_per_s") and all(
        b.get("steady_events_per_s") or b.get("below_events_per_s") for b in baselines.values()
    ) else "incl. start-up"  # fmt: skip

    def rate(b: dict[str, Any]) -> float:
        if b.get("below_events_per_s"):
            return float(b["below_events_per_s"])
        return float(b["steady_events_per_s"] if basis == "steady" else b["events_per_s"])

    shape = max(baselines, key=lambda k: rate(baselines[k]))
    best = rate(baselines[shape])
    mine = float(tw["steady_events_per_s"] if basis == "steady" else tw["events_per_s"])
    return {
        "shape": shape,
        "basis": basis,
        "events_per_s": best,
        "tidewatch_events_per_s": mine,
        "ratio": mine / best if best else float("inf"),
        "bound": bool(baselines[shape].get("below_events_per_s")),
    }


#: ``--modes``: the settings each Tidewatch mode runs with
MODES: dict[str, dict[str, Any]] = {
    # the driver's engine (engine_shards = 0, the default before Dec 8): the index on the driver,
    # the records decoded and pre-aggregated by Spark's executors (pipelined or not) ...
    "executors": {"engine_shards": 0, "engine_preaggregate": "executors", "engine_pipeline": True},
    "executors-serial": {"engine_shards": 0, "engine_preaggregate": "executors", "engine_pipeline": False},
    # ... or collected to the driver and decoded there (the path the driver CPU figure is against)
    "driver": {"engine_shards": 0, "engine_preaggregate": "driver", "engine_pipeline": True},
    # sharded evaluation (docs/engine.md, "Sharded evaluation"), the default: the indexes in
    # Spark's tasks, --shards of them (the default 1)
    "shards": {"engine_shards": 1},
    # the same with the shards on their keys' records (decode and pre-aggregation in the shard)
    # instead of the routing tasks' pane rows (engine_shard_input)
    "shards-records": {"engine_shards": 1, "engine_shard_input": "records"},
    # the shards with their Kafka output produced by the driver, after PostgreSQL's commit (the
    # merged batch), instead of by each shard's task (engine_shard_delivery, engine/shards/produce.py)
    "shards-driver": {"engine_shards": 1, "engine_shard_delivery": "driver"},
}


# ---------------------------------------------------------------- live: Tidewatch alone, latency
#: the live run's alert consumer's timeout (s) for a chunk of 1,000 alerts: librdkafka's
#: ``consume`` returns when the chunk is full or the timeout is over, so an alert of a partial
#: chunk is timed up to this late (0.2 s before 2026-12-07: docs/measurements/engine.md)
LATENCY_WAIT_S = 0.01
WINDOWS_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800)


@functools.lru_cache(maxsize=4)
def _key_names(stream: str, n_keys: int) -> np.ndarray:
    if stream == "trades":
        return np.array([f"S{i:05d}" for i in range(n_keys)], dtype=object)
    return np.array([f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(n_keys)], dtype=object)


def make_events(
    stream: str, n: int, n_keys: int, rate: float, t_end: int, seed: int
) -> dict[str, np.ndarray]:
    """``n`` events of ``stream`` at ``rate`` events/s of event time ending at ``t_end`` (ms),
    keys Zipf-skewed over ``n_keys`` symbols (trades) or source IPs (packets)."""
    rng = np.random.default_rng(seed)
    span_ms = max(int(n / rate * 1000), 1)
    ts = np.sort(rng.integers(t_end - span_ms, t_end, n)).astype(np.int64)
    ranks = rng.zipf(1.2, n) % n_keys
    names = _key_names(stream, n_keys)
    if stream == "trades":
        return {
            "symbol": names[ranks],
            "ts": ts,
            "price": np.round(rng.uniform(10, 200, n), 2),
            "size": rng.integers(1, 1000, n).astype(np.int64),
            "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n),
            "exchange": np.array(["NASDAQ"] * n, dtype=object),
        }
    return {
        "ts": ts,
        "src_ip": names[ranks],
        "dst_ip": names[rng.integers(0, 256, n)],
        "src_port": rng.integers(1024, 65000, n).astype(np.int64),
        "dst_port": rng.integers(1, 1024, n).astype(np.int64),
        "protocol": rng.choice(np.array(["TCP", "UDP"], dtype=object), n),
        "length": rng.integers(40, 1500, n).astype(np.int64),
        "tcp_flags": np.array(["S"] * n, dtype=object),
    }


def make_mixed_rules(
    n: int, stream: str, sample: dict[str, np.ndarray], span_s: float, seed: int = 1
) -> list[str]:
    """``n`` rules mixing COUNT / SUM / AVG / MIN / MAX with windows of 1 min - 3 h.

    Every rule has a COUNT or SUM threshold (its index driver, realistic: "busy AND ...") with
    the threshold set so that about 5-60 keys reach it once the window is full (estimated from
    ``sample``, a stretch of the same feed covering ``span_s`` seconds); 40 % add an AVG, MIN or
    MAX condition checked exactly on the candidates."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    key, val, num = ("symbol", "size", "price") if stream == "trades" else ("src_ip", "length", "length")
    frame = pd.DataFrame({"k": sample[key], "v": np.asarray(sample[val], np.float64)})
    g = frame.groupby("k", sort=False)["v"]
    est = {
        "COUNT(*)": np.sort(g.size().to_numpy(np.float64))[::-1],
        f"SUM({val})": np.sort(g.sum().to_numpy())[::-1],
    }
    lo, hi = float(np.min(sample[num])), float(np.max(sample[num]))
    out = []
    for i in range(n):
        w = int(rng.choice(WINDOWS_S))
        agg = "COUNT(*)" if i % 2 == 0 else f"SUM({val})"
        vals = est[agg] * min(w, span_s) / max(span_s, 1.0)
        r = int(rng.integers(5, 61))
        thr = float(np.floor(vals[min(r, len(vals) - 1)]))
        cond = f"{agg} OVER LAST {w} SECONDS > {thr:g}"
        kind = i % 10
        w2 = int(rng.choice([x for x in WINDOWS_S if x <= w]))
        if kind in (1, 2):
            cond += f" AND AVG({num}) OVER LAST {w2} SECONDS > {lo + (hi - lo) * rng.uniform(0.45, 0.55):.1f}"
        elif kind == 3:
            cond += f" AND MIN({num}) OVER LAST {w2} SECONDS < {lo + (hi - lo) * rng.uniform(0.0, 0.01):.1f}"
        elif kind == 4:
            cond += f" AND MAX({num}) OVER LAST {w2} SECONDS > {hi - (hi - lo) * rng.uniform(0.0, 0.01):.1f}"
        out.append(f"SELECT {key} FROM {stream} GROUP BY {key} HAVING {cond}")
    return out


def live_producer(
    bootstrap: str, topic: str, stream: str, rate: float, seconds: float, n_keys: int, stop_file: str
) -> None:
    """Produce ``stream`` events at ``rate`` per second of wall time, ``ts`` = the time of
    producing (a live feed, in order per partition), in chunks of 100 ms (run in its own
    process); writes ``{"t_first", "t_last", "n"}`` (epoch s) to ``stop_file + ".json"``."""
    from confluent_kafka import Producer

    from tidewatch.wire.avro import encode_batch

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 2_000_000,
            "batch.num.messages": 10_000,
        }
    )
    key = "symbol" if stream == "trades" else "src_ip"
    step = 0.1
    per = int(rate * step)
    make_events(stream, per, n_keys, per / step, 0, seed=0)  # warm the key names
    t_start = time.time()
    k = n = 0
    while time.time() - t_start < seconds and not Path(stop_file).exists():
        wait = t_start + k * step - time.time()
        if wait > 0:
            time.sleep(wait)
        now_ms = int(time.time() * 1000)
        cols = make_events(stream, per, n_keys, per / step, now_ms + 1, seed=k)
        cols["ts"] = np.sort(np.clip(cols["ts"], now_ms - 99, now_ms)).astype(np.int64)
        for kv, v in zip(cols[key], encode_batch(stream, cols).messages(), strict=True):
            p.produce(topic, key=kv.encode(), value=v)
        p.poll(0)
        k += 1
        n += per
    t_last = time.time()
    p.flush(30)
    Path(stop_file + ".json").write_text(json.dumps({"t_first": t_start, "t_last": t_last, "n": n}))


#: the parts of a micro-batch in Spark's progress reports (``durationMs``), in the order they run
SPARK_PARTS = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")


def _durations(p: Any) -> tuple[int, dict[str, int]]:
    """(input rows, ``durationMs``) of one ``StreamingQueryProgress`` (a dict of Spark's JSON)."""
    return int(p.get("numInputRows") or 0), {k: int(v) for k, v in (p.get("durationMs") or {}).items()}


def print_spark_parts(progress: list[tuple[int, dict[str, int]]]) -> None:
    """Median ms of each part of Spark's micro-batches with input: the first 10 and the rest
    (where the first seconds' time goes)."""
    busy = [ms for rows, ms in progress if rows > 0]
    if not busy:
        return

    def med(group: list[dict[str, int]]) -> str:
        return ", ".join(f"{k} {np.median([g.get(k, 0) for g in group]):.0f}" for k in SPARK_PARTS)

    print(f"Spark's micro-batches with input, median ms: first 10: {med(busy[:10])}", flush=True)
    if len(busy) > 10:
        print(f"  the other {len(busy) - 10}: {med(busy[10:])}", flush=True)


def cpu_by_role(me: Any, producer_pid: int | None) -> dict[str, float]:
    """CPU seconds (user + system) so far of the processes of a live run, by role: this
    driver (with the snapshot writers it forked and reaped), Spark's JVM (a child ``java``), Spark's
    Python workers (its ``python`` children: the executors' decode, pre-aggregation and shards), the
    Kafka broker (another ``java``), PostgreSQL (every ``postgres`` process) and the feed's producer
    process."""
    import psutil

    def secs(p: Any) -> float:
        t = p.cpu_times()
        return float(t.user + t.system)

    out = dict.fromkeys(("driver", "spark_jvm", "spark_python", "kafka", "postgres", "producer"), 0.0)
    t = me.cpu_times()  # the driver, with its reaped children: the forked snapshot writers
    out["driver"] = float(t.user + t.system + t.children_user + t.children_system)
    children = {c.pid for c in me.children(recursive=True)}
    for p in psutil.process_iter(["name", "pid"]):
        try:
            name = p.info["name"] or ""
            if p.pid == producer_pid:
                out["producer"] += secs(p)
            elif "java" in name:
                out["spark_jvm" if p.pid in children else "kafka"] += secs(p)
            elif name.startswith("python") and p.pid in children:
                out["spark_python"] += secs(p)
            elif name.startswith("postgres"):
                out["postgres"] += secs(p)
        except psutil.Error:  # a process that ended between listing and reading
            continue
    return out


def _rules_of(app: Any) -> int:
    return int(app.rules) if hasattr(app, "metas") else len(app.core.rules)


def _rules_active(app: Any, n: int) -> bool:
    """Every rule compiled and indexed, and the batch that subscribed them delivered (the driver
    core fills ``rules`` one by one while that batch still builds indexes; a sharded engine
    learns its shards' rule counts from their delivered output)."""
    if hasattr(app, "metas"):
        return bool(app.rules >= n and app.batches_done > 0)
    core = app.core
    return bool(len(core.rules) >= n and core.last_batch >= 0 and app.batches_done > core.last_batch)


def _state_bytes(app: Any) -> int:
    if hasattr(app, "metas"):
        return int(sum(m.state_bytes for m in app.metas.values()))
    return int(app.core.state_nbytes())


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6 if path.exists() else 0.0


def _shards_restart(
    a: argparse.Namespace, settings: Any, spark: Any, bootstrap: str, db: str, run: str,
    producer: Any, topic: str, stream: str,
) -> dict[str, Any]:  # fmt: skip
    """The sharded engine started again on the live run's checkpoint, one more event sent: the
    size of the shards' state in Spark's checkpoint and what rebuilding the shards took."""
    from engine.shards.engine import ShardedEngine
    from tidewatch.wire.avro import encode_batch

    state = Path(str(settings.checkpoint_dir)) / "spark" / "state"
    per = sorted(round(_dir_mb(d), 1) for d in state.glob("*/*") if d.is_dir())
    total = _dir_mb(state)
    files = Path(str(settings.checkpoint_dir)) / "tidewatch" / "shards"
    snap_files = sorted(round(_dir_mb(d), 1) for d in files.glob("shard-*"))
    app = ShardedEngine(settings, bootstrap=bootstrap, pg_url=db, engine_id=run)
    t0 = time.perf_counter()
    q = app.start(spark, trigger_seconds=a.trigger, max_offsets_per_trigger=a.max_offsets)
    one = make_events(stream, 1, a.keys, a.rate, int(time.time() * 1000), seed=7)
    producer.produce(topic, value=encode_batch(stream, one).messages()[0])
    producer.flush()
    deadline = time.monotonic() + 300
    while app.batches_done < 1 and time.monotonic() < deadline and q.isActive:
        time.sleep(0.2)
    first = time.perf_counter() - t0
    q.stop()
    app.close()
    parts = app.shard_parts[0] if app.shard_parts else {}
    return {
        "state_mb": total, "per_shard_mb": per, "rebuilt": sum(app.rebuilds.values()),
        "catch_up_s": float(parts.get("catch_up", float("nan"))), "first_s": first,
        "rebuilt_from": dict(app.rebuilt_from), "snapshot_files_mb": snap_files,
    }  # fmt: skip


def run_live(a: argparse.Namespace) -> dict[str, Any]:
    """Tidewatch alone on a live feed: sustained events/s, alert latency p50/p99, memory."""
    import multiprocessing
    import threading

    import psutil
    from confluent_kafka import Consumer, Producer

    from engine.app import EngineApp
    from engine.shards.engine import ShardedEngine
    from engine.sinks.publish import ensure_topics
    from engine.spark_session import build_spark
    from tidewatch.settings import get_settings
    from tidewatch.wire.avro import decode

    logging.getLogger("tidewatch.engine").setLevel(logging.INFO if a.verbose else logging.WARNING)
    base = get_settings()
    bootstrap = a.bootstrap or base.kafka_bootstrap
    run = uuid.uuid4().hex[:8]
    settings = run_settings(
        base, "live", run, allowed_lateness_ms=a.lateness_ms, engine_history_ms=a.history_ms,
        engine_lookup_every_ms=a.lookup_every_ms,
        # the first mode's settings, its shards those of this run (--shards: one run per value)
        **{**MODES[a.modes.split(",")[0]], "engine_shards": a.shards},
        **({"snapshot_every_batches": a.snapshot_every} if a.snapshot_every else {}),
        engine_snapshot_fork=not a.snapshot_in_thread,
    )  # fmt: skip
    ensure_topics(bootstrap, settings)
    stream = a.stream
    topic = settings.topic_trades if stream == "trades" else settings.topic_packets
    sample = make_events(
        stream, int(a.rate * min(a.live, 600)), a.keys, a.rate, int(time.time() * 1000), seed=99
    )
    texts = make_mixed_rules(a.rules, stream, sample, min(a.live, 600))
    spark = build_spark(settings, "tidewatch-engine-live")
    db = fresh_database(admin_url(a.database_url, base))
    app: Any = (ShardedEngine if a.shards else EngineApp)(
        settings, bootstrap=bootstrap, pg_url=db, engine_id=run
    )
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i, text in enumerate(texts):
        sid = str(uuid.uuid4())
        value = subscription_value(sid, f"m{i}", text, settings, not a.text_rules)
        p.produce(settings.topic_subscriptions, key=sid.encode(), value=json.dumps(value).encode())
    p.flush()
    batches = app.delivered  # (start of evaluation, end of output, events) of every engine batch
    t_sub = time.perf_counter()
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")  # every batch's progress
    q = app.start(spark, trigger_seconds=a.trigger, max_offsets_per_trigger=a.max_offsets)
    deadline = time.monotonic() + 600
    # active = compiled, indexed and the batch that subscribed them delivered: the core fills
    # ``rules`` one by one while that batch still builds indexes, so the count alone is not enough
    while not _rules_active(app, len(texts)) and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"{_rules_of(app):,} rules active after {time.perf_counter() - t_sub:.1f} s", flush=True)
    latencies: list[float] = []
    arrivals: list[float] = []  # wall ms each alert was read (the tail's timeline)
    stop = threading.Event()

    #: the CPU seconds of the bench's own latency consumer (its thread's clock, updated as it
    #: goes): not the engine's, so taken out of the driver's CPU below
    bench_cpu = {"consumer": 0.0}

    def consume() -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{run}", "isolation.level": "read_committed",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
        c.subscribe([settings.topic_alerts])
        while not stop.is_set():
            bench_cpu["consumer"] = time.thread_time()
            # librdkafka's consume waits for all 1,000 messages or the timeout: a short timeout,
            # so an alert is timed when it can be read, not when 1,000 are there
            for m in c.consume(1000, LATENCY_WAIT_S):
                v = m.value()
                if m.error() or v is None:
                    continue
                got = time.time() * 1000
                latencies.append(got - decode(v, "alerts")["as_of"])
                arrivals.append(got)
        c.close()

    th = threading.Thread(target=consume, daemon=True)
    th.start()
    stop_file = str(Path(str(settings.checkpoint_dir)) / "stop-producer")
    ctx = multiprocessing.get_context("spawn")
    prod = ctx.Process(
        target=live_producer, args=(bootstrap, topic, stream, a.rate, a.live, a.keys, stop_file)
    )
    n_before = len(batches)
    ev0 = app.totals["events"]
    t0 = time.perf_counter()
    wall0 = time.time()
    prod.start()
    own0 = bench_cpu["consumer"] + time.thread_time()  # the consumer's and this sampling thread's
    cpu0 = cpu_by_role(me := psutil.Process(), None)
    cpu1, own1 = cpu0, own0
    peak_rss = 0
    samples = []
    while prod.is_alive():
        time.sleep(1.0)
        cpu1 = cpu_by_role(me, prod.pid)
        own1 = bench_cpu["consumer"] + time.thread_time()
        rss = me.memory_info().rss
        jvm = 0
        for ch in me.children(recursive=True):
            try:
                if "java" in ch.name():
                    jvm += ch.memory_info().rss
            except psutil.Error:  # a child that ended between listing and reading
                continue
        peak_rss = max(peak_rss, rss)
        samples.append((time.perf_counter() - t0, app.totals["events"] - ev0, rss, jvm))
    feed = json.loads(Path(stop_file + ".json").read_text())
    t_prod = feed["t_last"] - feed["t_first"]
    produced = int(feed["n"])
    # engine progress sampled from the feed's first event on (the producer's start-up excluded)
    t_feed0 = t0 + (feed["t_first"] - wall0)
    time.sleep(a.trigger * 2 + a.lateness_ms / 1000 + 5)  # the tail of the feed reaches the engine
    drained = app.totals["events"] - ev0
    progress = [_durations(p) for p in q.recentProgress]
    q.stop()
    stop.set()
    th.join(5)
    app.close()
    restart = _shards_restart(a, settings, spark, bootstrap, db, run, p, topic, stream) if a.shards else None
    spark.stop()
    lat = np.array(latencies) / 1000.0
    late_b = batches[n_before:]
    # the rate the engine kept up with: events applied while the feed ran / feed seconds
    off = t_feed0 - t0
    kept = [s for s in samples if off < s[0] <= off + t_prod]
    rate_kept = (kept[-1][1] - kept[0][1]) / (kept[-1][0] - kept[0][0]) if len(kept) > 1 else 0.0
    jvm_peak = max((s[3] for s in samples), default=0)
    print(
        f"live {stream}: {a.rules:,} rules, {a.keys:,} keys, feed {a.rate:,.0f} events/s for {t_prod:.0f} s "
        f"({produced:,} events); engine applied {drained:,} ({rate_kept:,.0f} events/s while the feed ran, "
        f"{len(late_b)} batches, median batch {np.median([b[1] - b[0] for b in late_b]) if late_b else 0:.2f} s); "
        f"alerts {len(lat):,}, latency produce->alerts p50 {np.percentile(lat, 50) if len(lat) else float('nan'):.2f} s "
        f"p99 {np.percentile(lat, 99) if len(lat) else float('nan'):.2f} s max {lat.max() if len(lat) else float('nan'):.2f} s; "
        f"state {_state_bytes(app) / 1e6:.0f} MB, driver (Python) RSS peak {peak_rss / 1e9:.2f} GB, "
        f"Spark JVM RSS peak {jvm_peak / 1e9:.2f} GB",
        flush=True,
    )
    if len(lat):  # where the tail is: latency by 10 s of the feed (when the alert was read)
        at = (np.array(arrivals[: len(lat)]) / 1000.0 - wall0) // 10 * 10
        print(
            "latency by 10 s of the feed (alerts, p50 / p99 s): "
            + "; ".join(
                f"{int(b)}-{int(b) + 10} s {int((at == b).sum()):,} {np.percentile(lat[at == b], 50):.2f}"
                f" / {np.percentile(lat[at == b], 99):.2f}"
                for b in np.unique(at)
            ),
            flush=True,
        )
    print_spark_parts(progress)
    if a.shards:
        shard_ms = np.array(app.shard_seconds) * 1000
        print(
            f"{a.shards} shards: slowest shard per batch median {np.median(shard_ms):.0f} ms, p99 "
            f"{np.percentile(shard_ms, 99):.0f} ms; rebuilt from the state store: {app.rebuilds}, "
            f"caught up from the batch log: {app.catch_ups}",
            flush=True,
        )
        names = sorted({k for p in app.shard_parts for k in p})
        print(
            "  a shard task's Python parts, median / max ms over batches (slowest shard): "
            + ", ".join(
                f"{k} {np.median([p.get(k, 0) for p in app.shard_parts]) * 1000:.0f} / "
                f"{max(p.get(k, 0) for p in app.shard_parts) * 1000:.0f}"
                for k in names
            ),
            flush=True,
        )
        captures = [p["snapshot_start"] * 1000 for p in app.shard_parts if p.get("snapshot_start", 0) > 0]
        stored = app.snapshots_stored
        print(
            f"  shard snapshots (due every {settings.snapshot_every_batches} batches): "
            + (
                f"{len(captures)} batches started one, the fork of its writer (or the capture) in "
                "the task (the stall) "
                f"median / max {np.median(captures):.0f} / {max(captures):.0f} ms; "
                if captures
                else "none captured; "
            )
            + (
                f"{len(stored)} files named in Spark's state store, "
                + ", ".join(f"shard {sh} batch {b} {n / 1e6:.1f} MB" for sh, b, n in stored[-4:])
                if stored
                else "none stored"
            ),
            flush=True,
        )
        if restart:
            print(
                f"  the query started again on its checkpoint: Spark's state of the shards "
                f"{restart['state_mb']:.1f} MB on disk ({restart['per_shard_mb']} MB per shard's "
                f"state store directory), the shards' snapshot files {restart['snapshot_files_mb']} MB "
                f"per shard; its first batch rebuilt {restart['rebuilt']} shard(s), the "
                f"slowest in {restart['catch_up_s']:.2f} s (snapshot restored, logged batches read "
                f"again from Kafka and run again); from the snapshot of batch, per shard (-1: none) "
                f"{restart['rebuilt_from']}; first batch delivered {restart['first_s']:.1f} s "
                "after the start",
                flush=True,
            )
    elif a.snapshot_every:
        snaps = app.snapshots.written
        phases = {b: (c, f) for b, c, f in app.snapshots.timings}
        if a.snapshot_in_thread:
            how, first, then = (
                "captured in the evaluation thread, finished and written by a thread",
                "capture",
                "finish",
            )
        else:
            how, first, then = "written by a forked child", "fork", "child"
        each = ", ".join(
            f"{n / 1e6:.0f} MB in {sec:.1f} s ({first} {phases[b][0]:.2f} s, {then} {phases[b][1]:.2f} s)"
            for b, _, n, sec in snaps
        )
        print(
            f"state snapshots every {a.snapshot_every} batches, {how}: {len(snaps)} written "
            f"({each or 'none'}), {app.snapshots.skipped} skipped (the previous one still in flight)",
            flush=True,
        )
    cpu = {k: cpu1[k] - (cpu0[k] if k != "producer" else 0.0) for k in cpu1}
    # the driver's figure is the engine's: the bench's latency consumer (decoding every alert)
    # and this thread's sampling (psutil over every process each second) run in the same process
    cpu["bench_threads"] = own1 - own0
    cpu["driver"] -= cpu["bench_threads"]
    print(
        f"CPU seconds while the feed ran ({t_prod:.0f} s x {os.cpu_count()} cores = {(os.cpu_count() or 1) * t_prod:.0f}): "
        + ", ".join(
            f"{k} {v:.1f}" if k in ("driver", "bench_threads") else f"{k} {v:.0f}" for k, v in cpu.items()
        )
        + " (driver: the engine's, the bench's own threads out)",
        flush=True,
    )
    if a.json:
        a.json.write_text(
            json.dumps(
                {"latency_s": lat.tolist()[:100000], "samples": samples, "batches": late_b, "cpu_s": cpu},
                default=str,
            )
        )
    pct = (lambda q: float(np.percentile(lat, q))) if len(lat) else (lambda q: float("nan"))
    return {
        "p50": pct(50), "p99": pct(99), "events_per_s": rate_kept, "alerts": len(lat), "cpu_s": cpu,
        "events": produced, "feed_s": t_prod,
    }  # fmt: skip


def run_core(a: argparse.Namespace) -> None:
    """The engine core alone (no Spark, no I/O): ``EngineCore`` with the pane-fed evaluator over
    ``--events`` encoded records, ``--rules`` of :func:`make_mixed_rules` -- where the
    driver-held index stops scaling (events/s, one lookup of every rule, state, peak RSS).

    ``--gc-compare``: the same replay twice in this process, first with Python's default garbage
    collector thresholds, then with the engine's (``engine_gc_threshold``), and their ratio."""
    from tidewatch.settings import get_settings

    settings = get_settings()
    if not a.gc_compare:
        _core_replay(a, settings, settings.engine_gc_threshold)
        return
    base = _core_replay(a, settings, 0)
    tuned = _core_replay(a, settings, settings.engine_gc_threshold)
    print(
        f"garbage collector: engine thresholds {tuned['events_per_s'] / base['events_per_s']:.2f}x the events/s "
        f"of Python's defaults ({tuned['events_per_s']:,.0f} vs {base['events_per_s']:,.0f}); GC time "
        f"{tuned['gc_s']:.2f} s vs {base['gc_s']:.2f} s, longest collection {tuned['gc_max_ms']:.0f} ms vs "
        f"{base['gc_max_ms']:.0f} ms",
        flush=True,
    )
    print("command:", " ".join(sys.argv))


def subscribed_core(settings: Settings, texts: list[str], allowed_lateness_ms: int) -> EngineCore:
    """An ``EngineCore`` (the engine's evaluator and rule compiler, no future bound) that has
    subscribed ``texts`` as ``m0``, ``m1``, ... in its batch 0."""
    from engine.core import EngineCore
    from engine.messages import SubscriptionChange
    from engine.rule_evaluator import make_evaluator, rule_compiler

    core = EngineCore(
        pane_ms=settings.pane_ms,
        allowed_lateness_ms=allowed_lateness_ms,
        max_future_ms=10**12,
        evaluator_factory=lambda: make_evaluator(settings),
        compile_rule=rule_compiler(settings),
    )
    core.process(0, {}, [SubscriptionChange(f"m{i}", "upsert", f"m{i}", x) for i, x in enumerate(texts)])
    return core


def record_table(msgs: list[bytes], lo: int, hi: int, kafka_ts: int) -> pa.Table:
    """Kafka records ``msgs[lo:hi]`` of partition 0 (offsets ``lo`` on, Kafka timestamp
    ``kafka_ts``) as the Arrow table ``EngineCore.process`` takes for a stream."""
    import pyarrow as pa

    return pa.table(
        {
            "partition": pa.array(np.zeros(hi - lo, np.int32)),
            "offset": pa.array(np.arange(lo, hi, dtype=np.int64)),
            "timestamp": pa.array(np.full(hi - lo, kafka_ts, np.int64)),
            "value": pa.array(msgs[lo:hi], pa.binary()),
        }
    )


def _core_replay(a: argparse.Namespace, settings: Settings, gc_threshold: int) -> dict[str, float]:
    import gc
    import resource

    from engine.runtime.gc_tuning import tune_gc
    from tidewatch.wire.avro import encode_batch

    stream = a.stream
    cols = make_events(stream, a.events, a.keys, a.rate, int(time.time() * 1000) - 60_000, seed=3)
    span = a.events / a.rate
    texts = make_mixed_rules(a.rules, stream, cols, span)
    msgs = encode_batch(stream, cols).messages()
    gc.collect()
    tune_gc(gc_threshold)
    gc_time = {"t0": 0.0, "total": 0.0, "max": 0.0}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_time["t0"] = time.perf_counter()
        else:
            d = time.perf_counter() - gc_time["t0"]
            gc_time["total"] += d
            gc_time["max"] = max(gc_time["max"], d)

    t = time.perf_counter()
    core = subscribed_core(settings, texts, allowed_lateness_ms=2000)
    t_rules = time.perf_counter() - t
    n = len(msgs)
    kafka_ts = int(time.time() * 1000)
    busy, n_lookups, n_alerts = 0.0, 0, 0
    gc.callbacks.append(on_gc)
    try:
        for b, lo in enumerate(range(0, n, a.max_offsets), start=1):
            tbl = record_table(msgs, lo, min(n, lo + a.max_offsets), kafka_ts)
            t = time.perf_counter()
            out = core.process(b, {stream: tbl}, [])
            busy += time.perf_counter() - t
            n_lookups += len(out.lookups)
            n_alerts += len(out.alerts)
    finally:
        gc.callbacks.remove(on_gc)
    ev: Any = core.evaluator
    assert core.applied_until is not None
    t = time.perf_counter()
    for k in range(5):  # one lookup of every rule at the final state
        ev.step(core.applied_until + settings.pane_ms * (k + 1))
    look = (time.perf_counter() - t) / 5
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(
        f"core {stream}: {a.rules:,} rules, {a.keys:,} keys: {n:,} events ({span:.0f} s of event time) in "
        f"{busy:.1f} s = {n / busy:,.0f} events/s; {n_lookups} lookups, {n_alerts:,} alerts; one lookup of "
        f"every rule {look * 1000:.0f} ms; rules added in {t_rules:.1f} s; state "
        f"{core.state_nbytes() / 1e6:.0f} MB; peak RSS {rss:.2f} GB; GC thresholds {gc.get_threshold()}: "
        f"{gc_time['total']:.2f} s collecting, longest {gc_time['max'] * 1000:.0f} ms",
        flush=True,
    )
    if not a.gc_compare:
        print("command:", " ".join(sys.argv))
    return {"events_per_s": n / busy, "gc_s": gc_time["total"], "gc_max_ms": gc_time["max"] * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=None, help="Kafka (default: settings.kafka_bootstrap)")
    ap.add_argument(
        "--database-url", default=None, help="PostgreSQL server URL (a fresh database is made on it)"
    )
    ap.add_argument("--rules", type=int, default=10)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--symbols", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=50_000.0, help="event-time rate of the data set (events/s)")
    ap.add_argument(
        "--fixed-thresholds", action="store_true", help="the old low thresholds (most busy symbols alert)"
    )
    ap.add_argument("--slide", type=int, default=60, help="the baseline's slide in seconds")
    ap.add_argument(
        "--shapes", default="queries,union", help="the per-rule baseline's shapes to run (queries, union)"
    )
    ap.add_argument(
        "--baseline",
        choices=["perrule", "onescan", "both", "none"],
        default="both",
        help="plain-Spark baselines: per rule (--shapes), one scan (bench/onescan_baseline.py), both, or none",
    )
    ap.add_argument(
        "--modes",
        default="shards",
        help="Tidewatch's modes to run, each on its own copy of the events: shards (the default path: "
        "sharded evaluation, --shards shards, on pane rows, each shard producing its Kafka output), "
        "executors (the driver's engine, engine_shards = 0: engine_preaggregate = executors, "
        "pipelined), executors-serial (the same unpipelined), driver (the driver's engine with the "
        "records collected to the driver, pipelined), shards-records (the same on records: engine_shard_input = "
        "records), shards-driver (shards whose Kafka output the driver produces: engine_shard_delivery = "
        "driver); several: driver CPU per event side by side",
    )
    ap.add_argument(
        "--no-bare",
        action="store_true",
        help="skip Spark's bare Kafka read of the same topic (the ceiling: nothing decoded or sent to Python)",
    )
    ap.add_argument("--max-offsets", type=int, default=200_000, help="Tidewatch's maxOffsetsPerTrigger")
    ap.add_argument(
        "--baseline-max-offsets", type=int, default=20_000, help="the baseline's maxOffsetsPerTrigger"
    )
    ap.add_argument("--timeout", type=float, default=300, help="seconds each side may take")
    ap.add_argument("--lateness-ms", type=int, default=60_000, help="Tidewatch's allowed lateness")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--verbose", action="store_true", help="log every engine batch")
    ap.add_argument(
        "--live", type=float, default=0, help="live mode: feed seconds (Tidewatch alone, latency)"
    )
    ap.add_argument(
        "--gc-compare",
        action="store_true",
        help="with --core-only: replay twice, Python's default GC thresholds vs the engine's",
    )
    ap.add_argument(
        "--core-only",
        action="store_true",
        help="the engine core alone, no Spark/Kafka/PostgreSQL (--events, --rules, --keys, --stream, "
        "--rate; --max-offsets is the batch size)",
    )
    ap.add_argument("--stream", choices=["trades", "packets"], default="trades", help="live mode: the feed")
    ap.add_argument("--keys", type=int, default=5000, help="live mode: symbols / source IPs")
    ap.add_argument("--trigger", type=float, default=0.5, help="live mode: the engine's trigger interval (s)")
    ap.add_argument(
        "--history-ms", type=int, default=60_000, help="live mode: raw history kept for new rules (PSoup)"
    )
    ap.add_argument(
        "--lookup-every-ms",
        type=int,
        default=None,
        help="live mode: lookups at multiples of this (default: pane)",
    )
    ap.add_argument(
        "--snapshot-every",
        type=int,
        default=0,
        help="live mode: snapshot the state every N batches, as the engine does (its default is "
        "snapshot_every_batches = 50); 0: no snapshots",
    )
    ap.add_argument(
        "--text-rules",
        action="store_true",
        help="subscribe the rules as their text alone, as an outside producer may (the engine "
        "compiles each text, again at a replay); default: as `tidewatch subscribe` does, the text "
        "with its compiled plan",
    )
    ap.add_argument(
        "--no-check",
        action="store_true",
        help="skip the check of each drain's alert log against the backtest's evaluation of the same "
        "events up to the engine's last lookup (on by default; it exits 1 on any difference)",
    )
    ap.add_argument(
        "--shards",
        default="1",
        help="live mode: engine_shards of each run, comma-separated, run one after the other in this "
        "process (1: the default path; 0: the driver-held index; e.g. 0,1 for the two side by side); "
        "drains: the shards of the --modes shards* (0: their own, 1)",
    )
    ap.add_argument(
        "--snapshot-in-thread",
        action="store_true",
        help="live mode: snapshots captured in the evaluation thread and written by a thread "
        "(engine_snapshot_fork = false) instead of by a forked child (the default)",
    )
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    if a.live:
        runs = {}
        for n in [int(x) for x in str(a.shards).split(",")]:
            print(f"--- live run, engine_shards = {n}", flush=True)
            runs[n] = run_live(argparse.Namespace(**{**vars(a), "shards": n}))
        if len(runs) > 1:
            print(
                "side by side (engine_shards: p50 / p99 s, events/s kept, driver CPU-µs per event, "
                "driver CPU-µs per rule lookup = driver CPU / (rules x the feed's seconds: a lookup every 1 s)):",
                flush=True,
            )
            for n, r in runs.items():
                per = r["cpu_s"]["driver"] / max(1.0, r["events"]) * 1e6
                per_rule = r["cpu_s"]["driver"] / max(1.0, a.rules * r["feed_s"]) * 1e6
                print(
                    f"  {n}: {r['p50']:.2f} / {r['p99']:.2f}, {r['events_per_s']:,.0f}, {per:.2f}, {per_rule:.3f}",
                    flush=True,
                )
        print("command:", " ".join(sys.argv))
        return
    if a.core_only:
        run_core(a)
        return
    logging.getLogger("tidewatch.engine").setLevel(logging.INFO if a.verbose else logging.WARNING)

    from engine.spark_session import build_spark
    from tidewatch.settings import get_settings

    base = get_settings()
    bootstrap = a.bootstrap or base.kafka_bootstrap
    run = uuid.uuid4().hex[:8]
    settings = run_settings(base, "bench", run, allowed_lateness_ms=a.lateness_ms)
    from engine.sinks.publish import ensure_topics

    ensure_topics(bootstrap, settings)
    cols = make_trades(a.events, a.symbols, a.rate)
    rules = make_rules(a.rules) if a.fixed_thresholds else make_rules(a.rules, data=cols)
    spark = build_spark(settings, "tidewatch-engine-bench")
    out: dict[str, Any] = {
        "rules": a.rules,
        "events": a.events,
        "symbols": a.symbols,
        "slide_s": a.slide,
        "max_offsets_per_trigger": a.max_offsets,
        "baseline_max_offsets_per_trigger": a.baseline_max_offsets,
        "rate": a.rate,
        "command": " ".join(sys.argv),
        "subscribed_as": "text" if a.text_rules else "text and plan",
    }
    modes = [m for m in a.modes.split(",") if m]
    mismatched = False  # some drain's alert log differs from the backtest's
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: unknown {', '.join(unknown)} (one of {', '.join(MODES)})")
    try:
        db = fresh_database(admin_url(a.database_url, base))
        for i, mode in enumerate(modes):
            # each mode drains its own copy of the events (its own topics); the baselines read the first's
            upd = MODES[mode]
            if mode.startswith("shards") and (n_sh := int(str(a.shards).split(",")[0])) > 0:  # --shards N
                upd = {**upd, "engine_shards": n_sh}
            s_mode = settings.model_copy(update=upd) if i == 0 else run_settings(
                base, "bench", f"{run}-{mode}", allowed_lateness_ms=a.lateness_ms, **upd
            )  # fmt: skip
            if i:
                ensure_topics(bootstrap, s_mode)
                db = fresh_database(admin_url(a.database_url, base))
            tw = run_tidewatch(
                spark, s_mode, bootstrap, db, rules, cols, a.max_offsets, a.timeout, not a.text_rules,
                check=not a.no_check,
            )  # fmt: skip
            tw["events_per_s"] = tw["events"] / tw["seconds"]
            tw["driver_cpu_us_per_event"] = tw["cpu_s"] / max(tw["events"], 1) * 1e6
            sc = tw["steady_cpu"]
            tw["driver_cpu_us_per_event_steady"] = sc[0] / max(sc[1], 1) * 1e6 if sc else None
            out[f"tidewatch_{mode}"] = tw
            if i == 0:
                out["tidewatch"] = tw
            steady = tw["steady_events_per_s"]
            print(
                f"tidewatch ({mode}): {tw['events']:,} events in {tw['seconds']:.1f} s = {tw['events_per_s']:,.0f} events/s "
                f"(query start included; steady {steady or 0:,.0f} events/s) "
                f"({tw['batches']} batches, {tw['alerts']:,} alerts, {tw['dead_letters']:,} dead letters, state {tw['state_bytes'] / 1e6:.1f} MB, "
                f"driver RSS {tw['driver_rss_bytes'] / 1e9:.2f} GB, driver CPU {tw['cpu_s']:.1f} s = "
                f"{tw['driver_cpu_us_per_event']:.2f} us/event; "
                f"steady {tw['driver_cpu_us_per_event_steady'] or 0:.2f})",
                flush=True,
            )
            if (bt := tw["backtest"]) is not None:
                mismatched |= not bt["equal"]
                print(
                    f"  alert log vs backtest up to the last lookup ({bt['until']}): "
                    f"{'EQUAL' if bt['equal'] else 'DIFFERENT'} ({bt['alerts']:,} alerts, {bt['expected']:,} "
                    f"expected; missing {bt['missing']:,}, extra {bt['extra']:,}, duplicated {bt['duplicates']:,}"
                    f"{', first missing ' + str(bt['first_missing']) if bt['missing'] else ''}"
                    f"{', first extra ' + str(bt['first_extra']) if bt['extra'] else ''}; "
                    f"checked in {bt['seconds']} s)",
                    flush=True,
                )
        for other in (m for m in modes if m != "driver" and "driver" in modes):
            d, e = out["tidewatch_driver"], out[f"tidewatch_{other}"]
            ratio = d["driver_cpu_us_per_event"] / max(e["driver_cpu_us_per_event"], 1e-9)
            ds, es = d["driver_cpu_us_per_event_steady"], e["driver_cpu_us_per_event_steady"]
            steady_ratio = ds / max(es, 1e-9) if ds and es else None
            suffix = "" if other == "executors" else f"_{other}"  # the executors' keys as before
            out[f"driver_cpu_ratio{suffix}"], out[f"driver_cpu_ratio_steady{suffix}"] = ratio, steady_ratio
            print(
                f"driver CPU per event, driver mode / {other} mode = {ratio:,.1f}x "
                f"(steady {steady_ratio or float('nan'):,.1f}x)",
                flush=True,
            )
        tw = out["tidewatch"]
        steady = tw["steady_events_per_s"]
        if not a.no_bare:  # Spark's ceiling, same topic, same batch size as Tidewatch
            bare = run_baseline(
                spark, bootstrap, settings.topic_trades, rules, slide_s=a.slide, shape="bare",
                max_offsets=a.max_offsets, timeout_s=a.timeout,
            )  # fmt: skip
            bare["events_per_s"] = (a.events if bare["finished"] else bare["processed"]) / bare["seconds"]
            out["spark_bare_read"] = bare
            b_steady = bare.get("steady_events_per_s")
            print(
                f"Spark's bare Kafka read: {bare['events_per_s']:,.0f} events/s (steady {b_steady or 0:,.0f}); "
                f"Tidewatch ({modes[0]}) / bare = {tw['events_per_s'] / bare['events_per_s']:.2f} "
                f"(steady {(steady or 0) / b_steady if b_steady else float('nan'):.2f})",
                flush=True,
            )
        shapes = [s for s in a.shapes.split(",") if s] if a.baseline in ("perrule", "both") else []
        shapes += ["onescan"] if a.baseline in ("onescan", "both") else []
        for shape in shapes:
            res = run_baseline(
                spark,
                bootstrap,
                settings.topic_trades,
                rules,
                slide_s=a.slide,
                shape=shape,
                max_offsets=a.baseline_max_offsets,
                timeout_s=a.timeout,
            )
            n = a.events if res["finished"] else res["processed"]
            # stopped mid-batch: rated by its finished micro-batches' own seconds, not by the rows
            # over the time allowed (which counts the unfinished batch's time against it)
            done_s = sum(res["batch_seconds"]) if not res["finished"] and res.get("batch_seconds") else None
            res["events_per_s"] = n / (done_s or res["seconds"])
            if not res["finished"] and not res["processed"]:  # not even its first micro-batch
                res["below_events_per_s"] = min(a.baseline_max_offsets, a.events) / res["seconds"]
            out[f"baseline_{shape}"] = res
            ratio = tw["events_per_s"] / res["events_per_s"] if res["events_per_s"] else float("inf")
            bs = res.get("steady_events_per_s")
            if bs and steady:
                print(f"steady state: Tidewatch {steady:,.0f} / baseline {bs:,.0f} = {steady / bs:,.1f}x")
            bound = res.get("below_events_per_s")
            took = f"{done_s:.1f} s of finished micro-batches" if done_s else f"{res['seconds']:.1f} s"
            print(
                f"baseline ({shape}, slide {a.slide} s): {n:,} events in {took} = "
                f"{res['events_per_s']:,.0f} events/s"
                f"{f' (first micro-batch not done: < {bound:,.0f} events/s)' if bound else ''}, finished={res['finished']}"
                f"{'; micro-batches done (s): ' + str(res['batch_seconds']) if res.get('batch_seconds') else ''}"
                f"{' errors=' + str(res['errors'])[:300] if res['errors'] else ''}; "
                f"Tidewatch / baseline = {ratio:,.1f}x",
                flush=True,
            )
        if shapes:
            out["against_better_baseline"] = better = against_better(
                tw, {s: out[f"baseline_{s}"] for s in shapes}
            )
            print(
                f"against the better baseline ({better['shape']}, {better['events_per_s']:,.0f} events/s "
                f"{better['basis']}): Tidewatch {better['tidewatch_events_per_s']:,.0f} events/s = "
                f"{'> ' if better['bound'] else ''}{better['ratio']:,.1f}x",
                flush=True,
            )
    finally:
        spark.stop()
    print("command:", out["command"])
    if a.json:
        a.json.write_text(json.dumps(out, indent=2, default=str))
    if mismatched:
        sys.exit("the alert log differs from the backtest's (see above): the figures are of wrong output")


if __name__ == "__main__":
    main()
