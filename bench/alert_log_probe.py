"""Where PostgreSQL's part of alert delivery goes, step by step: µs per alert.

The steps of :func:`engine.sinks.store.write_direct` on one raw psycopg2 connection, each timed on
its own, for batches of ``--alerts`` synthetic alerts (``bench/delivery_bench.py``'s
``make_batch``) into a database brought to ``--revision``:

* ``columns``: :class:`~engine.sinks.alert_columns.AlertColumns` of the batch (Python, the client);
* ``csv``: the ``COPY``'s CSV written by Arrow (the client);
* ``copy``: the server's ``COPY`` into ``alerts`` (heap, WAL, ``jsonb`` parsing, every index);
* ``results``: the net change of each (subscription, key) read back and applied to
  ``current_results`` (one statement);
* ``commit``.

``--drop`` removes indexes of ``alerts`` first (``pk``: the primary key, ``subscription``: the
0009 index on (subscription_id, as_of), ``seq``: the unique ``seq``), to see what each costs.  An
embedded PostgreSQL and Kafka broker of this run (``delivery_bench.services``), stopped at the
end.  Medians over the batches after the first two::

    .venv/bin/python bench/alert_log_probe.py --revision 0009
    .venv/bin/python bench/alert_log_probe.py --revision head
    .venv/bin/python bench/alert_log_probe.py --revision head --drop pk,seq
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.delivery_bench import make_batch, services  # noqa: E402
from bench.engine_bench import fresh_database  # noqa: E402

DROP = {
    "pk": "ALTER TABLE alerts DROP CONSTRAINT pk_alerts",
    "subscription": "DROP INDEX IF EXISTS ix_alerts_subscription_as_of",
    "seq": "ALTER TABLE alerts DROP CONSTRAINT uq_alerts_seq",
}
STEPS = ("columns", "csv", "copy", "results", "commit")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alerts", type=int, default=20_000, help="alerts per batch")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--revision", default="head", help="the schema: a migration revision (0009, head)")
    ap.add_argument("--drop", default="", help=f"indexes of alerts to drop first: {','.join(DROP)}")
    a = ap.parse_args()
    import pyarrow as pa

    from engine.sinks import store as st
    from engine.sinks.alert_columns import AlertColumns
    from tidewatch.db.session import make_db_engine

    with services(argparse.Namespace(database_url=None, bootstrap=None)) as (pg_url, _bootstrap, _s):
        eng = make_db_engine(fresh_database(pg_url, a.revision))
        raw = eng.raw_connection()
        conn = raw.dbapi_connection
        cur = conn.cursor()
        for name in filter(None, a.drop.split(",")):
            cur.execute(DROP[name])
        conn.commit()
        times: dict[str, list[float]] = {s: [] for s in STEPS}
        for b in range(a.batches):
            out = make_batch(b + 1, a.alerts, 10_000, 5_000, seed=b + 1)
            t0 = time.perf_counter()
            cols = AlertColumns.of(out.alerts)
            n = len(cols)
            tbl = pa.table(
                {
                    "id": cols.ids, "sid": cols.subscription_uuid_text, "key": cols.key, "kind": cols.kind,
                    "as_of": pa.array(cols.as_of, pa.int64()).cast(pa.timestamp("ms")), "vals": cols.values_json,
                    "batch": pa.repeat(pa.scalar(b, pa.int64()), n),
                    "engine": pa.repeat(pa.scalar("default", pa.large_string()), n),
                }
            )  # fmt: skip
            t1 = time.perf_counter()
            data = st._csv(tbl)
            t2 = time.perf_counter()
            cur.execute(st._NET)
            after = int(cur.fetchone()[0])
            t3 = time.perf_counter()
            cur.copy_expert(st._COPY_ALERTS, io.BytesIO(data), size=1 << 20)
            t4 = time.perf_counter()
            cur.execute(st._FROM_LOGGED, {"after": after, "engine": "default", "batch": b})
            t5 = time.perf_counter()
            conn.commit()
            t6 = time.perf_counter()
            for step, dt in zip(STEPS, (t1 - t0, t2 - t1, t4 - t3, t5 - t4, t6 - t5), strict=True):
                times[step].append(dt / a.alerts * 1e6)
        raw.close()
        eng.dispose()
    med = {s: statistics.median(v[2:] or v) for s, v in times.items()}
    print(f"alerts per batch {a.alerts:,}, schema {a.revision}, dropped: {a.drop or 'none'}; µs per alert:")
    print("  " + "".join(f"{s:>10s}" for s in (*STEPS, "total")))
    print("  " + "".join(f"{med[s]:10.2f}" for s in STEPS) + f"{sum(med.values()):10.2f}")


if __name__ == "__main__":
    main()
