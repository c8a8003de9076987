"""The engine's alert delivery, old and new side by side in one process: µs per alert.

One batch's output goes to PostgreSQL (:meth:`engine.sinks.store.Store.commit`: alert log, current
results, batch id, metrics in one transaction) and then to Kafka
(:meth:`engine.sinks.publish.Publisher.publish`: Avro alerts, results, progress marker in one
transaction), as ``EngineApp._deliver`` does.  Each side is timed on the same synthetic batches:

* **old** (Nov 23 -- Nov 25): ``COPY`` into a staging table, then ``INSERT … SELECT … ON CONFLICT``
  into ``alerts`` -- :func:`engine.sinks.store.write_copy` -- and the batch encoded by one Numba
  kernel from fields read alert by alert (``engine/sinks/alert_wire.py`` as of commit
  :data:`OLD_COMMIT`, read with ``git show``), produced by one interleaved loop with a delivery
  report per record -- :func:`produce_interleaved`;
* **new**: the batch's columns built once (:class:`engine.sinks.alert_columns.AlertColumns`),
  one ``COPY`` straight into ``alerts``, the net result changes read back from the rows logged --
  :func:`engine.sinks.store.write_direct` -- and the same kernel fed by the columns, produced by
  two tight loops, delivery reports for failures only -- :func:`engine.sinks.publish.produce_alerts`.

Each side writes to a database of its own (the same alerts, so the tables grow alike); the two
sides alternate, and the median of ``--repeat`` batches per size is printed.  Real services:
an embedded PostgreSQL and Kafka broker started here (:mod:`tidewatch.stack.embedded`, free ports,
temporary run dir, stopped by PID at the end), or ``--database-url`` / ``--bootstrap``.

    flock /tmp/tidewatch-heavy.lock .venv/bin/python bench/delivery_bench.py --sizes 1000,20000

The synthetic alerts have distinct ids within a batch (as the engine's do: one change of a
subscription's result per key and lookup time).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import fresh_database  # noqa: E402
from engine.messages import Alert, BatchOutput  # noqa: E402
from tidewatch.settings import Settings  # noqa: E402

LABELS = [
    "COUNT(*) OVER LAST 10 SECONDS",
    "SUM(size) OVER LAST 20 SECONDS",
    "AVG(price) OVER LAST 30 SECONDS",
    "MAX(price) OVER LAST 15 SECONDS - MIN(price) OVER LAST 15 SECONDS",
]
#: the commit whose ``engine/sinks/alert_wire.py`` is the old side's encoder
OLD_COMMIT = "511f00470252de55e89bc1221fe043a19c2c5745"
METRICS = {"events_per_s": 1.0, "batch_ms": 1.0, "lag_ms": 1.0, "alerts": 0, "dead_letters": 0}


def make_batch(batch_id: int, n: int, n_subs: int, n_keys: int, seed: int) -> BatchOutput:
    """``n`` alerts of ``n_subs`` rules over ``n_keys`` symbols, as the alert storm of the live
    bench makes them: in as_of order over 4 panes, ENTER and EXIT, 1-3 aggregate values each."""
    rng = random.Random(seed)
    subs = [str(uuid.UUID(int=random.Random(i).getrandbits(128), version=4)) for i in range(n_subs)]
    t0 = 1_763_900_000_000 + 10_000 * batch_id
    alerts = []
    seen: set[str] = set()
    for i in range(n):
        s = rng.randrange(n_subs)
        values: dict[str, float | int | None] = {}
        for j in range(1 + s % 3):
            values[LABELS[(s + j) % 4]] = rng.randrange(1, 500) if j == 0 else round(rng.uniform(1, 1e4), 2)
        kind = "ENTER" if rng.random() < 0.6 else "EXIT"
        while True:  # one change per (subscription, key, lookup time)
            a = Alert(subs[s], f"rule-{s}", "trades", f"S{rng.randrange(n_keys):05d}", kind,
                      t0 + 1000 * (4 * i // n), values)  # fmt: skip
            if a.id not in seen:
                break
        seen.add(a.id)
        alerts.append(a)
    return BatchOutput(batch_id=batch_id, alerts=alerts, events={"trades": 200_000})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def services(a: argparse.Namespace) -> Iterator[tuple[str, str, Any]]:
    """``(PostgreSQL URL, Kafka bootstrap, settings)``: the given ones, or an embedded server and
    broker of this run (stopped by PID and their run dir removed at the end)."""
    from tidewatch.settings import Settings, get_settings
    from tidewatch.stack import kafka_broker as kafka
    from tidewatch.stack import postgres_server as postgres

    if a.database_url and a.bootstrap:
        s = get_settings().model_copy(update={"kafka_bootstrap": a.bootstrap})
        yield a.database_url, a.bootstrap, s
        return
    root = Path(tempfile.mkdtemp(prefix="tw-delivery-bench-"))
    root.chmod(0o755)  # the PostgreSQL server runs as the postgres user when this runs as root
    port = _free_port()
    s = Settings(
        run_dir=root / "run",
        cache_dir=get_settings().cache_dir,
        pg_port=_free_port(),
        pg_password="tidewatch-bench",
        database_url=None,
        kafka_port=port,
        kafka_bootstrap=f"127.0.0.1:{port}",
        kafka_controller_port=_free_port(),
        kafka_security="plaintext",
    )
    started: list[Any] = []
    try:
        for svc in (postgres, kafka):
            svc.start(s)
            started.append(svc)
        postgres.allow_createdb(s)
        yield s.sqlalchemy_url, s.kafka_bootstrap, s
    finally:
        for svc in reversed(started):
            svc.stop(s)
        shutil.rmtree(root, ignore_errors=True)


def old_encoder(root: Path) -> Callable[..., Any]:
    """``encode_alerts`` of ``engine/sinks/alert_wire.py`` as of :data:`OLD_COMMIT` (the old side's)."""
    src = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:engine/sinks/alert_wire.py"],
        cwd=Path(__file__).resolve().parent.parent, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    path = root / "old_alert_wire.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_alert_wire", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    fn: Callable[..., Any] = mod.encode_alerts
    return fn


def produce_interleaved(encode: Callable[..., Any]) -> Callable[..., None]:
    """The old side's alert loop (``engine.sinks.publish.produce_alerts`` of Nov 23 -- Nov 25):
    each alert's records in turn, a keyword call per record."""

    def produce_alerts(p: Any, s: Any, alerts: Any, batch_id: int, now: int) -> None:
        recs = encode(alerts, batch_id, now)
        produce = p.produce
        ta, tr = s.topic_alerts, s.topic_results
        for i, (ak, av, rk, rv, present) in enumerate(
            zip(
                recs.alert_keys,
                recs.alert_values,
                recs.result_keys,
                recs.result_values,
                recs.present,
                strict=True,
            )
        ):
            produce(ta, value=av, key=ak)
            produce(tr, value=rv, key=rk)
            if not present:
                produce(tr, value=None, key=rk)
            if i % 1000 == 999:
                p.poll(0)  # serve delivery reports
        p.poll(0)

    return produce_alerts


class Side:
    """One delivery path: its Store (own database) and its Publisher (own transactional id)."""

    def __init__(self, name: str, pg_url: str, bootstrap: str, settings: Settings, tmp: Path) -> None:
        from engine.sinks import publish, store
        from engine.sinks.publish import Publisher
        from engine.sinks.store import Store
        from tidewatch.db.session import make_db_engine

        class OldPublisher(Publisher):  # a delivery report per record, as before
            producer_config = {"linger.ms": 5, "compression.type": "lz4"}  # noqa: RUF012

        self.name = name
        old = name == "old"
        self.store = Store(make_db_engine(fresh_database(pg_url)))
        self.publisher = (OldPublisher if old else Publisher)(
            bootstrap, settings, f"delivery-bench-{name}-{uuid.uuid4().hex[:6]}"
        )
        self.write: Callable[..., None] = store.write_copy if old else store.write_direct
        self.publisher.produce_alerts = (
            produce_interleaved(old_encoder(tmp)) if old else publish.produce_alerts
        )
        self.next_batch = 0

    def deliver(self, out: BatchOutput) -> tuple[float, float]:
        """Seconds of the PostgreSQL commit and of the Kafka transaction of ``out``."""
        out = BatchOutput(batch_id=self.next_batch, alerts=out.alerts, events=out.events)
        self.next_batch += 1
        t0 = time.perf_counter()
        assert self.store.commit(out, watermark=None, metrics=METRICS, write=self.write)
        t1 = time.perf_counter()
        self.publisher.publish(out.batch_id, out.alerts)
        return t1 - t0, time.perf_counter() - t1

    def close(self) -> None:
        self.publisher.close()
        self.store.engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,20000", help="alerts per batch")
    ap.add_argument("--repeat", type=int, default=5, help="batches per size and side (median shown)")
    ap.add_argument("--subscriptions", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=5_000)
    ap.add_argument(
        "--database-url", default=None, help="PostgreSQL server (with --bootstrap: no own services)"
    )
    ap.add_argument("--bootstrap", default=None, help="Kafka (with --database-url)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = ap.parse_args()
    from engine.sinks.publish import ensure_topics

    sizes = [int(x) for x in a.sizes.split(",") if x]
    started = datetime.now(UTC)
    load0 = os.getloadavg()
    res: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "started_utc": started.isoformat(timespec="seconds"),
        "sizes": {},
    }
    with services(a) as (pg_url, bootstrap, base):
        run = uuid.uuid4().hex[:6]
        topics = ("alerts", "results", "dead_letter", "trades", "packets", "subscriptions")
        settings = base.model_copy(
            update={f"topic_{t}": f"dbench-{t.replace('_', '-')}-{run}" for t in topics}
        )
        ensure_topics(bootstrap, settings)
        tmp = Path(tempfile.mkdtemp(prefix="tw-delivery-old-"))
        sides = [Side(n, pg_url, bootstrap, settings, tmp) for n in ("old", "new")]
        try:
            warm = make_batch(0, 200, a.subscriptions, a.keys, seed=1)
            for side in sides:  # connections, staging table, the encoder's kernel, the producer
                side.deliver(warm)
            k = 0  # batches made: each gets its own as_of range (no alert id repeats)
            for n in sizes:
                per: dict[str, dict[str, list[float]]] = {s.name: {"pg": [], "kafka": []} for s in sides}
                for r in range(a.repeat):
                    k += 1
                    out = make_batch(k, n, a.subscriptions, a.keys, seed=k)
                    order = sides if r % 2 == 0 else sides[::-1]  # alternate who goes first
                    for side in order:
                        pg_s, kafka_s = side.deliver(out)
                        per[side.name]["pg"].append(pg_s / n * 1e6)
                        per[side.name]["kafka"].append(kafka_s / n * 1e6)
                fig = {
                    name: {part: statistics.median(v) for part, v in parts.items()}
                    for name, parts in per.items()
                }
                for f in fig.values():
                    f["total"] = f["pg"] + f["kafka"]
                res["sizes"][n] = {"median_us_per_alert": fig, "runs_us_per_alert": per}
                print(f"batch of {n:,} alerts (median of {a.repeat}), µs per alert:")
                print(f"  {'':8s}{'PostgreSQL':>12s}{'Kafka':>10s}{'total':>10s}")
                for name in ("old", "new"):
                    f = fig[name]
                    print(f"  {name:8s}{f['pg']:12.1f}{f['kafka']:10.1f}{f['total']:10.1f}")
                old, new = fig["old"], fig["new"]
                print(
                    f"  old/new {old['pg'] / new['pg']:10.2f}x{old['kafka'] / new['kafka']:9.2f}x"
                    f"{old['total'] / new['total']:9.2f}x",
                    flush=True,
                )
        finally:
            for side in sides:
                side.close()
            del sides, side  # the producers' threads end before the broker does
            gc.collect()
            shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()
    res["finished_utc"] = datetime.now(UTC).isoformat(timespec="seconds")
    res["loadavg_start_end"] = [load0, load1]
    print(f"run {res['started_utc']} .. {res['finished_utc']} UTC, load average (1/5/15 min) "
          f"{load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f} at the start, {load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f} at the end")  # fmt: skip
    print(f"command: {res['command']}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
