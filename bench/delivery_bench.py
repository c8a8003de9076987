"""The engine's alert delivery, the alert log written inline and expanded behind the commit side
by side in one process: µs per alert.

One batch's output goes to PostgreSQL (:meth:`engine.sinks.store.Store.commit`: alerts, batch id,
metrics in one transaction) and to Kafka (Avro alerts, results, progress marker in one
transaction), by the overlapped delivery (:meth:`engine.sinks.deliver.Delivery.deliver`: the
Kafka transaction opened and its records produced on a thread while PostgreSQL commits, the Kafka
commit after PostgreSQL's).  Each side is timed on the same synthetic batches:

* **inline**: the path until Nov 30 -- the commit writes every alert into ``alerts`` (one
  ``COPY``) and applies the batch's changes to ``current_results`` (:func:`write_direct
  <engine.sinks.store.write_direct>` inside the commit);
* **deferred**: the default from migration 0011 -- the commit writes the batch's alerts as ONE
  ``engine_outputs`` row (:mod:`engine.sinks.output_block`); a thread expands it into ``alerts``
  and ``current_results`` behind the commit (:meth:`engine.sinks.store.Store.project`, the same
  :func:`write_direct` in a transaction of its own).

Columns printed (median µs per alert): "PostgreSQL" = from the start until PostgreSQL committed
(the Kafka records produced meanwhile), "Kafka" = from there until Kafka committed, "delivered" =
both (the batch is in PostgreSQL and in Kafka, exactly once), "expansion" = the deferred side's
expansion of the batch into the per-alert tables (timed alone: the bench waits for it before the
next batch; the engine runs it while the next batch is evaluated), "all" = delivered + expansion.
The inline/deferred ratios are of "delivered" and of "all".  "Kafka alone" is the batch's Kafka
transaction by itself (:meth:`Publisher.publish <engine.sinks.publish.Publisher.publish>`: the
columns, the records, the produce loops, the commit; no PostgreSQL, no thread beside it): the floor
of the "delivered" column.  Earlier comparisons are this file as
of 7183e43 (the alert log of 0009 against 0010), 4f2fbaf (sequential against overlapped delivery)
and 34073b8 (``write_copy`` and the per-alert encoder against the columns).

Each side writes to a database of its own (the same alerts, so the tables grow alike, at the
schema of head) with its own transactional id; each delivers its own copy of the batch's alert
list (the columns cached for one list are not the other's); the two sides alternate, and the
median of ``--repeat`` batches per size is printed.  Before them ``--warm-up`` batches (30 by
default) of the largest size go through each side untimed: a fresh broker's CPU per 20,000-alert
batch falls from ≈ 115 to ≈ 40 CPU-ms over its first ≈ 30 such batches (its JIT; Dec 1), and the
engine's broker is warm from the input streams it takes all day.  ``--warm-up 0`` times a cold
broker, as every run before Dec 1 did (one 200-alert batch per side first).  Real services: an embedded PostgreSQL and
Kafka broker started here (:mod:`tidewatch.stack.embedded`, free ports, temporary run dir,
stopped by PID at the end), or ``--database-url`` / ``--bootstrap``.

    flock /tmp/tidewatch-heavy.lock .venv/bin/python bench/delivery_bench.py --sizes 1000,20000

The synthetic alerts have distinct ids within a batch (as the engine's do: one change of a
subscription's result per key and lookup time), and come as the engine's core hands them over:
one block of many subscriptions per lookup time (:class:`engine.messages.LookupBlock`, from Dec 1;
until then a block per subscription and lookup time, :class:`engine.messages.AlertBlock`: with
10,000 subscriptions, 20,000 alerts made ≈ 15,700 blocks), not Alert objects (the bench until
Nov 30 gave Alert objects, whose columns are built by one comprehension per field); the garbage
collector is tuned as the engine tunes it (``engine_gc_threshold``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import fresh_database  # noqa: E402
from engine.messages import Alert, AlertBlock, AlertSeq, BatchOutput, LookupBlock  # noqa: E402
from engine.runtime.gc_tuning import tune_gc  # noqa: E402
from tidewatch.settings import Settings  # noqa: E402

#: the two sides, and the parts of a delivery timed for each
SIDES = ("inline", "deferred")
PARTS = ("pg", "kafka", "delivered", "expansion", "all")
LABELS = [
    "COUNT(*) OVER LAST 10 SECONDS",
    "SUM(size) OVER LAST 20 SECONDS",
    "AVG(price) OVER LAST 30 SECONDS",
    "MAX(price) OVER LAST 15 SECONDS - MIN(price) OVER LAST 15 SECONDS",
]
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
    return BatchOutput(batch_id=batch_id, alerts=as_blocks(alerts), events={"trades": 200_000})


def as_blocks(alerts: list[Alert]) -> AlertSeq:
    """``alerts`` as the engine's core hands them to the sinks: an :class:`AlertSeq` of one
    :class:`LookupBlock` per lookup time (its subscriptions in the order of their first alert,
    each one's keys in order), not Alert objects (:meth:`engine.core.EngineCore._emit`)."""
    groups: dict[tuple[int, str], list[Alert]] = {}
    for a in alerts:
        groups.setdefault((a.as_of, a.subscription_id), []).append(a)
    by_tau: dict[int, list[AlertBlock]] = {}
    for (tau, sid), xs in sorted(groups.items(), key=lambda kv: kv[0][0]):  # stable: first alerts first
        labels = list(xs[0].values)
        cols = [[a.values[label] for a in xs] for label in labels]
        by_tau.setdefault(tau, []).append(AlertBlock(sid, xs[0].rule_name, xs[0].stream, tau,
                                                     [a.key for a in xs], [a.kind for a in xs], labels, cols))  # fmt: skip
    seq = AlertSeq()
    for blocks in by_tau.values():
        seq.add_block(LookupBlock.of_blocks(blocks))
    return seq


def copy_of(alerts: AlertSeq) -> AlertSeq:
    """A sequence of the same blocks, another object (the columns :meth:`AlertColumns.of
    <engine.sinks.alert_columns.AlertColumns.of>` caches for one are not the other's)."""
    seq = AlertSeq()
    for b in alerts.blocks():
        seq.add_block(b)  # type: ignore[arg-type]  # blocks only: as_blocks made them
    return seq


@contextmanager
def services(a: argparse.Namespace) -> Iterator[tuple[str, str, Any]]:
    """``(PostgreSQL URL, Kafka bootstrap, settings)``: the given ones, or an embedded server and
    broker of this run (stopped by PID and their run dir removed at the end)."""
    from tidewatch.settings import get_settings
    from tidewatch.stack.private import private_services

    if a.database_url and a.bootstrap:
        s = get_settings().model_copy(update={"kafka_bootstrap": a.bootstrap})
        yield a.database_url, a.bootstrap, s
        return
    with private_services("tw-delivery-bench-", get_settings(), postgres=True) as s:
        yield s.sqlalchemy_url, s.kafka_bootstrap or "", s


class Side:
    """One side: its Store (own database at head), its Publisher (own transactional id) and the
    overlapped delivery over them; ``inline``: the commit writes the per-alert tables itself.
    ``given_server``: the database is dropped at exit (a server of the run's own goes with its
    data)."""

    def __init__(
        self, name: str, pg_url: str, bootstrap: str, settings: Settings, given_server: bool
    ) -> None:
        from engine.sinks.deliver import Delivery
        from engine.sinks.publish import Publisher
        from engine.sinks.store import Store, write_direct
        from tidewatch.db.session import make_db_engine

        self.name = name
        self.store = Store(make_db_engine(fresh_database(pg_url, "head", drop_at_exit=given_server)))
        if name == "inline":  # the commit as it was: write_direct inside the batch's transaction
            self.store.commit = partial(self.store.commit, write=write_direct)  # type: ignore[method-assign]
        self.publisher = Publisher(bootstrap, settings, f"delivery-bench-{name}-{uuid.uuid4().hex[:6]}")
        self.delivery = Delivery(self.store, self.publisher, 60.0)
        self.next_batch = 0

    def deliver(self, out: BatchOutput) -> tuple[float, float, float]:
        """Seconds until PostgreSQL committed ``out``, from then until Kafka did, and of the
        batch's expansion into the per-alert tables (waited for here: timed alone; 0 inline)."""
        out = BatchOutput(batch_id=self.next_batch, alerts=copy_of(out.alerts), events=out.events)
        self.next_batch += 1
        d = self.delivery.deliver(out, watermark=None, metrics=METRICS)
        assert d.committed
        expanded = self.delivery.settle() if self.name == "deferred" else 0.0
        return d.pg_s, d.kafka_s, expanded

    def close(self) -> None:
        self.delivery.close()
        self.publisher.close()
        self.store.engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,20000", help="alerts per batch")
    ap.add_argument("--repeat", type=int, default=5, help="batches per size and side (median shown)")
    ap.add_argument(
        "--warm-up",
        type=int,
        default=30,
        help="batches of the largest size delivered through each side, untimed, before the timed "
        "ones (a fresh broker's JIT: 0 times a cold broker)",
    )
    ap.add_argument("--subscriptions", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=5_000)
    ap.add_argument(
        "--database-url", default=None, help="PostgreSQL server (with --bootstrap: no own services)"
    )
    ap.add_argument("--bootstrap", default=None, help="Kafka (with --database-url)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = ap.parse_args()
    from engine.sinks.alert_columns import AlertColumns
    from engine.sinks.publish import Publisher, ensure_topics

    sizes = [int(x) for x in a.sizes.split(",") if x]
    started = datetime.now(UTC)
    load0 = os.getloadavg()
    res: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "started_utc": started.isoformat(timespec="seconds"),
        "sizes": {},
    }
    with services(a) as (pg_url, bootstrap, base):
        tune_gc(base.engine_gc_threshold)  # as the engine does at its start
        run = uuid.uuid4().hex[:6]
        topics = ("alerts", "results", "dead_letter", "trades", "packets", "subscriptions")
        settings = base.model_copy(
            update={f"topic_{t}": f"dbench-{t.replace('_', '-')}-{run}" for t in topics}
        )
        ensure_topics(bootstrap, settings)
        given = bool(a.database_url and a.bootstrap)  # as services() decides
        sides = [Side(n, pg_url, bootstrap, settings, given) for n in SIDES]
        # Kafka's floor: the batch's transaction alone (columns, records, produce, commit), no
        # PostgreSQL and no other thread beside it
        alone = Publisher(bootstrap, settings, f"delivery-bench-kafka-{uuid.uuid4().hex[:6]}")
        try:
            warm = make_batch(0, 200, a.subscriptions, a.keys, seed=1)
            for side in sides:  # connections, the encoder's kernel, the producer, the threads
                side.deliver(warm)
            k = 0  # batches made: each gets its own as_of range (no alert id repeats)
            if a.warm_up > 0 and sizes:
                print(f"warming up: {a.warm_up} batches of {max(sizes):,} alerts through each side, untimed",
                      flush=True)  # fmt: skip
            for _ in range(a.warm_up if sizes else 0):  # the broker's JIT, PostgreSQL's caches
                k += 1
                out = make_batch(k, max(sizes), a.subscriptions, a.keys, seed=k)
                for side in sides:
                    side.deliver(out)
                alone.publish(k, AlertColumns.of(copy_of(out.alerts), slot=None))
            for n in sizes:
                per: dict[str, dict[str, list[float]]] = {s.name: {p: [] for p in PARTS} for s in sides}
                per["kafka alone"] = {"kafka": []}
                for r in range(a.repeat):
                    k += 1
                    out = make_batch(k, n, a.subscriptions, a.keys, seed=k)
                    order = sides if r % 2 == 0 else sides[::-1]  # alternate who goes first
                    for side in order:
                        pg_s, kafka_s, exp_s = side.deliver(out)
                        got = {"pg": pg_s, "kafka": kafka_s, "delivered": pg_s + kafka_s, "expansion": exp_s}
                        got["all"] = got["delivered"] + exp_s
                        for part, sec in got.items():
                            per[side.name][part].append(sec / n * 1e6)
                    t0 = time.perf_counter()
                    alone.publish(k, AlertColumns.of(copy_of(out.alerts), slot=None))
                    per["kafka alone"]["kafka"].append((time.perf_counter() - t0) / n * 1e6)
                fig = {
                    name: {part: statistics.median(v) for part, v in parts.items()}
                    for name, parts in per.items()
                }
                res["sizes"][n] = {"median_us_per_alert": fig, "runs_us_per_alert": per}
                print(f"batch of {n:,} alerts (median of {a.repeat}), µs per alert "
                      "(inline: the per-alert tables in the commit; deferred: one row, expanded behind it):")  # fmt: skip
                print(
                    f"  {'':10s}{'PostgreSQL':>12s}{'Kafka':>8s}{'delivered':>11s}{'expansion':>11s}{'all':>8s}"
                )
                for name in SIDES:
                    f = fig[name]
                    print(f"  {name:10s}{f['pg']:12.1f}{f['kafka']:8.1f}{f['delivered']:11.1f}"
                          f"{f['expansion']:11.1f}{f['all']:8.1f}")  # fmt: skip
                print(
                    f"  {'Kafka alone':22s}{fig['kafka alone']['kafka']:8.1f}  (its transaction, nothing beside it)"
                )
                old, new = fig["inline"], fig["deferred"]
                print(
                    f"  inline/deferred: delivered {old['delivered'] / new['delivered']:.2f}x, "
                    f"all {old['all'] / new['all']:.2f}x",
                    flush=True,
                )
        finally:
            alone.close()
            for side in sides:
                side.close()
            del sides, side, alone  # the producers' threads end before the broker does
            gc.collect()
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
