"""The CPU a micro-batch's commit costs the engine's driver, by step, at small and large batches.

What the driver pays per batch whatever its events (docs/measurements/engine.md, "The sharded
driver's fixed cost per batch"): :meth:`engine.sinks.store.Store.commit` (the batch id, its
``engine_outputs`` row, its metrics row, in one transaction), :meth:`Store.last_committed
<engine.sinks.store.Store.last_committed>` (the question the sharded engine asks before a batch)
and :meth:`Store.project <engine.sinks.store.Store.project>` (the expansion behind the commit),
each timed by ``time.thread_time()`` (CPU of this thread: SQLAlchemy, psycopg2, Arrow; not the
server's), the median over ``--batches`` batches per size after ``--warm-up`` untimed ones.  The
batches are those of ``bench/delivery_bench.py`` (one block per lookup time).  Old against new
with ``bench/ab_trees.sh OLD 3 bench/commit_cpu.py`` (the services of ``tidewatch up
--services-only`` running; a fresh database per run on its PostgreSQL)::

    .venv/bin/python bench/commit_cpu.py --sizes 1,1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.delivery_bench import METRICS, make_batch  # noqa: E402
from bench.engine_bench import fresh_database  # noqa: E402
from tidewatch.settings import Settings  # noqa: E402


def cpu_ms(fn: Callable[[], object]) -> float:
    t = time.thread_time()
    fn()
    return (time.thread_time() - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,1000", help="alerts per batch")
    ap.add_argument("--batches", type=int, default=200, help="timed batches per size")
    ap.add_argument("--warm-up", type=int, default=50, help="untimed batches per size before them")
    a = ap.parse_args()
    from engine.sinks.store import Store
    from tidewatch.db.session import make_db_engine

    url = fresh_database(Settings().sqlalchemy_url)
    store = Store(make_db_engine(url), f"commit-cpu-{uuid.uuid4().hex[:6]}")
    k = 0
    for n in (int(x) for x in a.sizes.split(",") if x):
        got: dict[str, list[float]] = {"commit": [], "last_committed": [], "project": []}
        for i in range(a.warm_up + a.batches):
            k += 1
            out = make_batch(k, n, 100, 5_000, seed=k)
            step = {
                "last_committed": cpu_ms(store.last_committed),
                "commit": cpu_ms(lambda: store.commit(out, watermark=None, metrics=METRICS)),  # noqa: B023
                "project": cpu_ms(lambda: store.project(out.batch_id, out)),  # noqa: B023
            }
            if i >= a.warm_up:
                for name, ms in step.items():
                    got[name].append(ms)
        print(
            f"batch of {n:,} alerts, CPU-ms (median of {a.batches}): "
            + ", ".join(f"{name} {statistics.median(v):.3f}" for name, v in got.items()),
            flush=True,
        )
    store.engine.dispose()


if __name__ == "__main__":
    main()
