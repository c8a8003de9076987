"""Soak: the engine at a steady fraction of its measured maximum rate for many minutes.

Issue 7 ("Load"): a live feed at 50 % of the engine's measured maximum (≈ 50,000 events/s with
10,000 mixed rules over 5,000 symbols, ``bench/engine_bench.py --live``, docs/engine.md), so
25,000 events/s, for ``--minutes`` (default 20), with ``--rules`` (default 10,000) rules of
:func:`bench.engine_bench.make_mixed_rules` (COUNT/SUM thresholds over windows of 1 min - 3 h,
40 % with an AVG/MIN/MAX condition).  It proves three things:

* **lag stays bounded**: every second, the engine's lag = wall clock - the largest event time
  it has applied (the feed stamps ``ts`` = the time of producing, so this is the end-to-end
  delay of the event path, the engine's ``engine_metrics.lag_ms``); p50 / p99 / max over the
  run and over its last 5 minutes, and the backlog (records in Kafka not yet applied);
* **memory is flat**: RSS every ~10 s of every process: the engine's Python driver (this
  process), its Spark JVM, the feed process, and Kafka and PostgreSQL when they run here
  (embedded, started by this script, or found listening on the given ports); start / end / max;
* **zero alerts lost**: the engine's alert log in PostgreSQL equals the backtest
  (:func:`engine.evaluation.backtest.iter_alerts`, the engine's own evaluation code, evaluated
  as ``tidewatch backtest`` does; RULES.md backtest contract, lookups every
  ``engine_lookup_every_ms`` = the pane) of exactly the events the engine used: every record of
  the feed topic read back from Kafka, minus those it dead-lettered, up to the engine's last
  lookup time (missing / extra must be 0 / 0).

The engine's panes come from its executors' pre-aggregation merged on the driver; the
backtest's from the raw events read back, aggregated in this process.  Both feed the evaluator's
structures (Arasu & Widom 2004, section 4: basic windows / panes of width g); their equality is
the engine's delivery contract (docs/engine.md).

Without ``--bootstrap`` / ``--database-url`` the script starts its own Kafka broker and
PostgreSQL server (the embedded stack's code, ``tidewatch.stack.embedded``) in a temporary run
directory on free ports, and stops them (by PID) at the end.

    .venv/bin/python bench/soak.py --minutes 20 --rate 25000 --rules 10000
    .venv/bin/python bench/soak.py --minutes 2 --rate 5000 --rules 1000      # a quick check
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import live_producer, make_events, make_mixed_rules, run_settings  # noqa: E402
from tidewatch.stack.spark_cluster import free_port  # noqa: E402

if TYPE_CHECKING:
    from tidewatch.settings import Settings

log = logging.getLogger("tidewatch.soak")


# ---------------------------------------------------------------- infrastructure
@dataclass
class Stack:
    """Kafka and PostgreSQL for the soak: given, or started here (embedded) and stopped here."""

    bootstrap: str
    db_url: str
    settings: Settings | None = None  # the embedded stack's settings (None: given servers)
    run_dir: Path | None = None
    pids: dict[str, int] = field(default_factory=dict)  # "kafka" / "postgres" -> PID (local only)

    def stop(self) -> None:
        if self.settings is None:
            return
        from tidewatch.stack import kafka_broker as kafka
        from tidewatch.stack import postgres_server as postgres

        for name, stop in (("kafka", kafka.stop), ("postgres", postgres.stop)):
            try:
                stop(self.settings)
            except Exception as e:  # noqa: BLE001 - best effort, report and go on
                print(f"stopping {name}: {e}", flush=True)
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def _listener_pid(port: int) -> int | None:
    """PID of the local process listening on ``port`` (None if none or not visible)."""
    import psutil

    try:
        for c in psutil.net_connections("tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return int(c.pid)
    except (psutil.AccessDenied, PermissionError):
        return None
    return None


def start_stack(a: argparse.Namespace) -> Stack:
    """The given servers, or an embedded Kafka broker and PostgreSQL server on free ports."""
    from tidewatch.db.migrate import upgrade
    from tidewatch.settings import get_settings

    base = get_settings()
    if a.bootstrap and a.database_url:
        from sqlalchemy.engine import make_url

        from bench.engine_bench import fresh_database

        st = Stack(a.bootstrap, fresh_database(a.database_url))
        for name, port in (
            ("kafka", int(a.bootstrap.rsplit(":", 1)[1])),
            ("postgres", make_url(st.db_url).port),
        ):
            pid = _listener_pid(int(port or 5432))
            if pid is not None:
                st.pids[name] = pid
        return st
    from tidewatch.stack import kafka_broker as kafka
    from tidewatch.stack import postgres_server as postgres

    run_dir = Path(tempfile.mkdtemp(prefix="tw-soak-run-"))
    run_dir.chmod(0o755)  # the postgres server user (when root runs this) must reach it
    kafka_port = free_port()
    s = base.model_copy(
        update={
            "run_dir": run_dir,
            "kafka_port": kafka_port,
            "kafka_bootstrap": f"127.0.0.1:{kafka_port}",
            "kafka_controller_port": free_port(),
            "pg_port": free_port(),
            "kafka_heap": a.kafka_heap,
        }
    )
    st = Stack(s.kafka_bootstrap, "", settings=s, run_dir=run_dir)
    try:
        st.pids["kafka"] = kafka.start(s).pid
        st.pids["postgres"] = postgres.start(s).pid
        st.db_url = s.sqlalchemy_url
        upgrade(st.db_url)
    except BaseException:
        st.stop()
        raise
    return st


# ---------------------------------------------------------------- sampling
def _rss(pid: int | None, tree: bool = False) -> int | None:
    """RSS of ``pid`` (bytes; with ``tree``: plus all its descendants, e.g. PostgreSQL's backends)."""
    import psutil

    if pid is None:
        return None
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        procs = [p, *p.children(recursive=True)] if tree else [p]
        total = 0
        for q in procs:
            try:
                total += q.memory_info().rss
            except psutil.Error:
                pass
        return total or None
    except psutil.Error:
        return None


def _spark_jvm_pid(exclude: set[int]) -> int | None:
    """The Spark JVM: the ``java`` child of this process running Spark (not an embedded broker)."""
    import psutil

    for ch in psutil.Process().children(recursive=True):
        try:
            if ch.pid in exclude or "java" not in ch.name():
                continue
            if any("spark" in x.lower() for x in ch.cmdline()):
                return int(ch.pid)
        except psutil.Error:
            continue
    return None


def _topic_end(bootstrap: str, topic: str) -> int:
    """Sum of the high watermarks of ``topic``'s partitions (= records produced: no transactions)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"soak-end-{uuid.uuid4().hex[:6]}"})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions)
    finally:
        c.close()


def _pct(x: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(x), q)) if x else float("nan")


# ---------------------------------------------------------------- read back and backtest
def read_partitions(bootstrap: str, topic: str, chunk: int = 500_000) -> Iterator[list[tuple[int, int, Any]]]:
    """Every record of ``topic`` (read_committed) as (partition, offset, value), in chunks of about
    ``chunk`` records (bounded memory: the caller decodes each chunk)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"soak-read-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
        }
    )
    out: list[tuple[int, int, Any]] = []
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        pending = {p for p, hi in ends.items() if hi > 0}
        idle = 0
        while pending and idle < 40:
            msgs = c.consume(10_000, 0.5)
            idle = 0 if msgs else idle + 1
            for m in msgs:
                if m.error():
                    continue
                out.append((int(m.partition() or 0), int(m.offset() or 0), m.value()))
            if len(out) >= chunk:
                yield out
                out = []
            for p in list(pending):  # the last offset may be a transaction marker
                if c.position([TopicPartition(topic, p)])[0].offset >= ends[p]:
                    pending.discard(p)
        if out:
            yield out
    finally:
        c.close()


def dead_lettered(bootstrap: str, topic: str, source_topic: str) -> set[tuple[int, int]]:
    """(partition, offset) of the records of ``source_topic`` the engine dead-lettered."""
    from tidewatch.wire.avro import decode

    got = set()
    for _p, _o, v in (r for ch in read_partitions(bootstrap, topic) for r in ch):
        if v is None:
            continue
        d = decode(v, "dead_letter")
        if d["source_topic"] == source_topic:
            got.add((int(d["source_partition"]), int(d["source_offset"])))
    return got


def events_from_topic(
    bootstrap: str, topic: str, stream: str, skip: set[tuple[int, int]], until: int
) -> tuple[Any, int, int]:
    """The events of ``topic`` minus ``skip`` with ``ts <= until``, as a backtest ``EventFile``
    (ts-sorted, string fields dictionary-coded); also the records read and those left out."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from engine.evaluation.backtest import EventFile
    from tidewatch.wire.avro import decode_batch

    n_read = 0
    batches = []
    for chunk in read_partitions(bootstrap, topic):
        n_read += len(chunk)
        keep = [v for p, o, v in chunk if (p, o) not in skip] if skip else [v for _p, _o, v in chunk]
        rb, ok = decode_batch(stream, pa.array(keep, pa.binary()))
        if not ok.all():
            log.warning("%d records of %s did not decode", int((~ok).sum()), topic)
        batches.append(rb.filter(pc.less_equal(rb.column("ts"), until)))
    tbl = pa.Table.from_batches(batches) if batches else None
    if tbl is None or tbl.num_rows == 0:
        return EventFile(stream, {"ts": np.zeros(0, np.int64)}), n_read, n_read
    ts = tbl.column("ts").to_numpy()
    order = np.argsort(ts, kind="stable")
    cols: dict[str, np.ndarray] = {}
    codes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in tbl.column_names:
        col = tbl.column(name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            enc = pc.dictionary_encode(col).unify_dictionaries()
            uniq = np.asarray(enc.chunk(0).dictionary.to_numpy(zero_copy_only=False), dtype=object)
            c = np.concatenate(
                [np.asarray(ch.indices.to_numpy(zero_copy_only=False), np.int64) for ch in enc.chunks]
            )
            c = c[order]
            codes[name] = (c, uniq)
            cols[name] = uniq[c]
        else:
            cols[name] = col.to_numpy()[order]
    return EventFile(stream, cols, [], codes), n_read, n_read - tbl.num_rows


def backtest_alerts(
    subs: dict[str, str], ev_file: Any, every: int, until: int
) -> list[tuple[str, str, str, int]]:
    """(subscription id, key, kind, as_of) of the backtest of ``subs`` over ``ev_file``, as_of <= until.

    Evaluated as ``tidewatch backtest`` does (:func:`engine.evaluation.backtest.run_backtest`): the
    shared evaluator with panes of width ``every``, the lookup period (identical answers to the
    raw-event evaluator; Arasu & Widom 2004, section 4).  Without panes every event would be a
    row of every structure until its longest window ends: a 20-minute soak under 3-hour windows
    does not fit in this machine's memory that way (docs/RELIABILITY.md, "Load")."""
    from engine.evaluation.backtest import iter_alerts, make_evaluator
    from engine.runtime.gc_tuning import tune_gc
    from subscriptions.compiler import compile_rule
    from tidewatch.settings import get_settings

    settings = get_settings()
    tune_gc(settings.engine_gc_threshold)  # as the engine and `tidewatch backtest` do
    plans = [(sid, text, compile_rule(text, settings)) for sid, text in subs.items()]
    t0 = time.perf_counter()
    last = [t0]

    def progress(j: int, total: int) -> None:
        if time.perf_counter() - last[0] > 30:
            last[0] = time.perf_counter()
            print(f"  backtest: lookup {j:,} of {total:,} ({time.perf_counter() - t0:.0f} s)", flush=True)

    return sorted(
        (rule, key, kind, int(as_of))
        for as_of, rule, key, kind in iter_alerts(
            plans,
            [ev_file],
            every,
            progress=progress,
            evaluator=make_evaluator("shared", settings.ci_p, every),
        )
        if as_of <= until
    )


# ---------------------------------------------------------------- the soak
def run(a: argparse.Namespace) -> int:
    import psutil
    from confluent_kafka import Producer
    from sqlalchemy import create_engine

    from engine.app import EngineApp
    from engine.sinks.publish import ensure_topics
    from engine.sinks.store import Store
    from engine.spark_session import build_spark

    logging.getLogger("tidewatch.engine").setLevel(logging.INFO if a.verbose else logging.WARNING)
    t_begin = time.time()
    stack = start_stack(a)
    prod: Any = None
    spark: Any = None
    app: Any = None
    q: Any = None
    ckpt: Path | None = None
    try:
        from tidewatch.settings import get_settings

        base = stack.settings or get_settings()
        run_id = uuid.uuid4().hex[:8]
        settings = run_settings(
            base, "soak", run_id, allowed_lateness_ms=a.lateness_ms, engine_history_ms=a.history_ms,
            engine_lookup_every_ms=a.lookup_every_ms,
        )  # fmt: skip
        ckpt = Path(str(settings.checkpoint_dir))
        bootstrap = stack.bootstrap
        ensure_topics(bootstrap, settings)
        stream = a.stream
        topic = settings.topic_trades if stream == "trades" else settings.topic_packets
        span = min(a.minutes * 60, 600)
        sample = make_events(stream, int(a.rate * span), a.keys, a.rate, int(time.time() * 1000), seed=99)
        texts = make_mixed_rules(a.rules, stream, sample, span) if a.rules else []
        texts += rows_rules(a.rows_rules, stream, seed=7, longest=a.rows_max)
        del sample
        spark = build_spark(settings, "tidewatch-soak")
        spark.sparkContext.setLogLevel("ERROR")  # no "batch is falling behind" line per slow batch
        app = EngineApp(settings, bootstrap=bootstrap, pg_url=stack.db_url, engine_id=run_id)
        subs: dict[str, str] = {}
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for i, text in enumerate(texts):
            sid = str(uuid.uuid4())
            subs[sid] = text
            p.produce(settings.topic_subscriptions, key=sid.encode(),
                      value=json.dumps({"id": sid, "name": f"soak{i}", "rule": text}).encode())  # fmt: skip
        p.flush()
        del p
        t_sub = time.perf_counter()
        q = app.start(spark, trigger_seconds=a.trigger, max_offsets_per_trigger=a.max_offsets)
        deadline = time.monotonic() + 600
        while len(app.core.rules) < len(texts) and time.monotonic() < deadline:
            time.sleep(0.2)
        if len(app.core.rules) < len(texts):
            raise RuntimeError(f"only {len(app.core.rules)} of {len(texts)} rules active after 600 s")
        print(f"{len(app.core.rules):,} rules active after {time.perf_counter() - t_sub:.1f} s", flush=True)

        stop_file = str(Path(str(settings.checkpoint_dir)) / "stop-producer")
        ctx = multiprocessing.get_context("spawn")
        seconds = a.minutes * 60
        prod = ctx.Process(
            target=live_producer, args=(bootstrap, topic, stream, a.rate, seconds, a.keys, stop_file)
        )
        ev0 = app.totals["events"]
        prod.start()
        t0 = time.time()
        local = {"kafka": stack.pids.get("kafka"), "postgres": stack.pids.get("postgres")}
        jvm = None
        procs: dict[str, tuple[int | None, bool]] = {}
        lags: list[tuple[float, float]] = []  # (s since feed start, lag ms)
        mem: list[tuple[float, dict[str, int | None]]] = []
        held: list[tuple[float, int]] = []  # (s since feed start, rows the state holds, exactly)
        backlog: list[tuple[float, int]] = []
        next_print = t0 + a.sample_s
        me = psutil.Process()
        me.cpu_percent()
        while prod.is_alive():
            time.sleep(1.0)
            now = time.time()
            mx = app.core.max_ts
            if mx is not None:
                lags.append((now - t0, now * 1000 - mx))
            if now >= next_print or not prod.is_alive():
                next_print = now + a.sample_s
                if jvm is None:
                    jvm = _spark_jvm_pid({v for v in local.values() if v})
                procs = {
                    "engine driver (Python)": (os.getpid(), False),
                    "engine Spark JVM": (jvm, False),
                    "feed (Python)": (prod.pid, False),
                    "Kafka": (local["kafka"], False),
                    "PostgreSQL (all backends)": (local["postgres"], True),
                }
                rss = {k: _rss(pid, tree) for k, (pid, tree) in procs.items()}
                state = int(app.core.state_nbytes())
                rss["engine state (evaluator)"] = state
                # the driver without its state: flat when only the windows filling up grow it
                drv = rss["engine driver (Python)"]
                rss["driver RSS - state"] = None if drv is None else drv - state
                mem.append((now - t0, rss))
                held.append((now - t0, int(app.core.evaluator.rows_held())))
                done = int(app.totals["events"] - ev0 + app.totals["dead_letters"])
                end = _topic_end(bootstrap, topic)
                backlog.append((now - t0, end - done))
                lag = lags[-1][1] / 1000 if lags else float("nan")
                load = os.getloadavg()[0]
                print(
                    f"[{time.strftime('%H:%M:%S')}] t={now - t0:6.0f} s  produced {end:,}  applied {done:,}  "
                    f"backlog {end - done:,}  lag {lag:5.2f} s  alerts {int(app.totals['alerts']):,}  "
                    f"batches {app.batches_done}  "
                    + "  ".join(
                        f"{k.split(' (')[0]} {v / 1e9:.2f} GB" for k, v in rss.items() if v is not None
                    )
                    + f"  rows held {held[-1][1]:,}  load {load:.1f}",
                    flush=True,
                )
        feed = json.loads(Path(stop_file + ".json").read_text())
        produced = int(feed["n"])
        # the tail of the feed reaches the engine
        deadline = time.monotonic() + a.drain_s
        while time.monotonic() < deadline:
            if app.totals["events"] - ev0 + app.totals["dead_letters"] >= produced:
                break
            time.sleep(0.5)
        time.sleep(a.trigger * 2 + 1)
        q.stop()
        q = None
        app.close()
        applied = int(app.totals["events"] - ev0)
        dead = int(app.totals["dead_letters"])
        until = app.core.applied_until
        state_mb = app.core.state_nbytes() / 1e6
        batches_done = app.batches_done
        app = None  # the engine's state goes before the backtest builds its own
        spark.stop()
        spark = None
        gc.collect()
        t_end_soak = time.time()

        # ------------------------------------------------------------ zero alerts lost
        print(f"verifying: engine lookups up to {until}; reading {topic} back from Kafka ...", flush=True)
        t_v = time.perf_counter()
        got = Store(create_engine(stack.db_url)).alert_log()
        skip = dead_lettered(bootstrap, settings.topic_dead_letter, topic) if dead else set()
        every = settings.lookup_period_ms
        expect: list[tuple[str, str, str, int]] = []
        n_read = n_used = 0
        if until is not None:
            ev_file, n_read, n_out = events_from_topic(bootstrap, topic, stream, skip, int(until))
            n_used = ev_file.n
            print(
                f"  {n_read:,} records read back, {len(skip):,} dead-lettered, {n_used:,} events with "
                f"ts <= the last lookup; backtest of {len(subs):,} rules every {every} ms ...",
                flush=True,
            )
            expect = backtest_alerts(subs, ev_file, every, int(until))
            del ev_file
        got_set, exp_set = set(got), set(expect)
        missing, extra = sorted(exp_set - got_set), sorted(got_set - exp_set)
        verify_s = time.perf_counter() - t_v

        # ------------------------------------------------------------ report
        dur = feed["t_last"] - feed["t_first"]
        tail = [x for t, x in lags if t >= dur - 300]
        all_lag = [x for _t, x in lags]
        names = list(procs)
        print()
        print(
            f"soak: {a.stream}, {len(texts):,} rules, {a.keys:,} keys, feed {a.rate:,.0f} events/s for "
            f"{dur / 60:.1f} min (load average at the end {os.getloadavg()[0]:.1f})"
        )
        print(
            f"{'process':28s} {'start RSS':>10s} {'end RSS':>10s} {'max RSS':>10s} {'end-start':>10s} "
            f"{'2nd half MB/min':>16s}"
        )
        rss_rows = {}
        for k in [*names, "engine state (evaluator)", "driver RSS - state"]:
            vals = [int(m[k] or 0) for _t, m in mem if m.get(k)]
            if not vals:
                print(f"{k:28s} {'(not local)':>10s}")
                continue
            s0, s1, smax = vals[0], vals[-1], max(vals)
            # growth rate over the second half of the run (least squares): ~0 when flat
            pts = [(t, float(m[k] or 0)) for t, m in mem if m.get(k) and t >= dur / 2]
            slope = (
                float(np.polyfit([x for x, _ in pts], [y for _, y in pts], 1)[0]) * 60 / 1e6
                if len(pts) > 2
                else float("nan")
            )
            rss_rows[k] = {"start": s0, "end": s1, "max": smax, "slope_2nd_half_mb_per_min": slope}
            print(
                f"{k:28s} {s0 / 1e9:9.2f}G {s1 / 1e9:9.2f}G {smax / 1e9:9.2f}G {(s1 - s0) / 1e6:+9.0f}M "
                f"{slope:+16.1f}"
            )
        h2 = [n for t, n in held if t >= dur / 2]
        if h2:
            print(
                f"rows the state holds (history + per-key row buffers, counted exactly), second half: "
                f"min {min(h2):,} max {max(h2):,} end {h2[-1]:,}"
            )
        print(
            f"lag (wall clock - largest applied event time), 1 s samples: whole run p50 {_pct(all_lag, 50) / 1000:.2f} s "
            f"p99 {_pct(all_lag, 99) / 1000:.2f} s max {max(all_lag, default=float('nan')) / 1000:.2f} s; "
            f"last 5 min p50 {_pct(tail, 50) / 1000:.2f} s p99 {_pct(tail, 99) / 1000:.2f} s "
            f"max {max(tail, default=float('nan')) / 1000:.2f} s; backlog max {max((b for _t, b in backlog), default=0):,} records"
        )
        print(
            f"events: produced {produced:,}, applied {applied:,}, dead-lettered {dead:,}; engine batches "
            f"{batches_done:,}; state {state_mb:.0f} MB; alerts {len(got):,} in PostgreSQL"
        )
        print(
            f"zero alerts lost: backtest of the {n_used:,} events the engine used (lookups every {every} ms up to "
            f"its last lookup {until}): {len(expect):,} alerts; engine {len(got):,}; missing {len(missing):,}, "
            f"extra {len(extra):,} -> {'OK' if not missing and not extra else 'MISMATCH'} (verified in {verify_s:.0f} s)"
        )
        if missing or extra:
            print(f"  first missing {missing[:3]}; first extra {extra[:3]}")
        print(f"run took {(t_end_soak - t_begin) / 60:.1f} min + verification {verify_s / 60:.1f} min")
        print("command:", " ".join([".venv/bin/python", "bench/soak.py", *sys.argv[1:]]))
        if a.json:
            a.json.write_text(json.dumps({
                "args": vars(a) | {"json": str(a.json)}, "produced": produced, "applied": applied,
                "dead_letters": dead, "alerts": len(got), "expected": len(expect), "missing": len(missing),
                "extra": len(extra), "lags": lags, "mem": mem, "held": held, "backlog": backlog, "rss": rss_rows,
            }, default=str))  # fmt: skip
        ok = not missing and not extra and produced > 0 and applied + dead >= produced
        return 0 if ok else 1
    finally:
        if q is not None:
            try:
                q.stop()
            except Exception:  # noqa: BLE001
                pass
        if prod is not None and prod.is_alive():
            prod.terminate()
            prod.join(10)
        if spark is not None:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001
                pass
        if app is not None and q is not None:  # an error mid-run: the engine still holds clients
            try:
                app.close()
            except Exception:  # noqa: BLE001
                pass
        app = None
        gc.collect()  # the engine's Kafka clients go before the broker does
        stack.stop()
        if ckpt is not None:
            shutil.rmtree(ckpt, ignore_errors=True)


def rows_rules(n: int, stream: str, seed: int = 7, longest: int = 200) -> list[str]:
    """``n`` rules over ``LAST k ROWS`` windows (k 5 to ``longest``): SUM thresholds a little above k times
    the field's mean (sizes 1-999, lengths 40-1499 in :func:`bench.engine_bench.make_events`),
    some with a WHERE, so a share of the keys is in each result and changes."""
    rng = np.random.default_rng(seed)
    key, field, mean = ("symbol", "size", 500.0) if stream == "trades" else ("src_ip", "length", 770.0)
    where = "side = 'ASK'" if stream == "trades" else "protocol = 'TCP'"
    out = []
    for i in range(n):
        k = int(rng.integers(5, max(6, longest + 1)))
        thr = k * mean * rng.uniform(1.0, 1.15)
        w = f" WHERE {where}" if i % 3 == 0 else ""
        out.append(
            f"SELECT {key} FROM {stream}{w} GROUP BY {key} HAVING SUM({field}) OVER LAST {k} ROWS > {thr:.0f}"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0, help="feed duration")
    ap.add_argument("--rate", type=float, default=25_000.0, help="events/s of the feed (wall time)")
    ap.add_argument("--rules", type=int, default=10_000)
    ap.add_argument(
        "--rows-rules",
        type=int,
        default=0,
        help="also this many LAST n ROWS rules (n 5 to --rows-max): memory must stay flat once each key has n rows",
    )
    ap.add_argument("--rows-max", type=int, default=200, help="the largest n of --rows-rules")
    ap.add_argument("--keys", type=int, default=5000, help="symbols / source IPs")
    ap.add_argument("--stream", choices=["trades", "packets"], default="trades")
    ap.add_argument("--bootstrap", default=None, help="Kafka (default: an embedded broker started here)")
    ap.add_argument(
        "--database-url", default=None, help="PostgreSQL server URL (a fresh database is made on it)"
    )
    ap.add_argument("--lateness-ms", type=int, default=500, help="the engine's allowed lateness")
    ap.add_argument("--trigger", type=float, default=0.5, help="the engine's trigger interval (s)")
    ap.add_argument("--max-offsets", type=int, default=200_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--history-ms", type=int, default=60_000, help="raw history kept for new rules")
    ap.add_argument("--lookup-every-ms", type=int, default=None, help="lookups at multiples of this")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between progress lines")
    ap.add_argument("--drain-s", type=float, default=300.0, help="max wait for the tail after the feed")
    ap.add_argument("--kafka-heap", default="768m", help="-Xmx of the embedded broker")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--verbose", action="store_true", help="log every engine batch")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    sys.exit(run(a))


if __name__ == "__main__":
    main()
