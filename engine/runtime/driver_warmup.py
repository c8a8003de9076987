"""Loading the driver's compiled kernels before the first micro-batch.

The driver's per-batch work -- the collective index's updates and lookups (CI-COUNT / CI-SUM,
R-INT, B-INT: Arasu & Widom 2004, sections 3-4), the exact merge of the executors' pane rows,
the alerts' values -- runs Numba kernels compiled once and cached on disk (``cache=True``).  A
process loads each kernel from that cache at its first call, and compiles it there when the
cache is cold (a fresh checkout's first run).  The first batch with events pays for all of them:
for a core of 1,000 mixed rules, 0.39-0.85 s against 0.14 s for the same batch in a second core
of the same process, and the batch after it ≈ 0.2 s more (docs/measurements/engine.md, "The
driver's kernels loaded at start").  On a live feed that is latency for the first lookups'
alerts and a backlog for the batches after them: the start's tail.

:func:`warm_driver` pays it at engine start instead.  A throwaway core made by the engine's own
factory subscribes :data:`RULES` (every aggregate of every stream, integer and float fields,
predicates, FILTER, a historical window, ROWS windows) and takes :data:`BATCHES` small batches of
synthetic events of both streams through the path of the engine's mode (:func:`warm_batch`) --
in executors mode the executors' pure function run in this process and merged
(:func:`engine.executors.output.preaggregate_here`), as a replay does -- so that lookups happen,
results enter and leave, and the alerts' values are read.  Its alerts are made into the columns
both sinks read (:func:`read_alerts`).  Nothing is read from or
written to Kafka or PostgreSQL, and the engine's own core is not touched: the warm-up changes
no state, only what the process has loaded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa

from engine.core import EngineCore
from engine.decode import Decoded, empty
from engine.executors.warmup import kafka_records_of
from engine.messages import BatchOutput, SubscriptionChange

#: the rules of the throwaway core: each aggregate on integer and float fields of both streams,
#: a predicate (its own column set), FILTER, arithmetic between aggregates, a historical window,
#: ROWS windows (raw events kept by the driver);
#: windows of ``a`` = 2, ``b`` = 3 and ``g`` = 1 panes (:func:`rules_for`)
RULES: tuple[str, ...] = (
    "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST {a} MILLISECONDS > 3",
    "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST {b} MILLISECONDS > 400",
    "SELECT symbol FROM trades WHERE side = 'ASK' GROUP BY symbol "
    "HAVING SUM(price) OVER LAST {a} MILLISECONDS > 100 AND AVG(size) OVER LAST {a} MILLISECONDS > 10",
    "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST {a} MILLISECONDS > 2 "
    "AND MIN(price) OVER LAST {a} MILLISECONDS < 50 AND MAX(size) OVER LAST {b} MILLISECONDS > 100",
    "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST {a} MILLISECONDS > 2 "
    "AND MAX(price) OVER LAST {a} MILLISECONDS - MIN(price) OVER LAST {a} MILLISECONDS > 1 "
    "AND MIN(size) OVER LAST {a} MILLISECONDS < 500",
    "SELECT symbol FROM trades WHERE exchange = 'NASDAQ' GROUP BY symbol "
    "HAVING LAST(price) OVER LAST {b} MILLISECONDS < 1.5 * FIRST(price) OVER LAST {b} MILLISECONDS "
    "AND SUM(size) FILTER (WHERE side = 'BID') OVER LAST {a} MILLISECONDS >= 0.3 * SUM(size) OVER LAST {a} MILLISECONDS",
    "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(DISTINCT side) OVER LAST {a} MILLISECONDS > 1",
    "SELECT symbol FROM trades GROUP BY symbol HAVING AVG(size) OVER {b} MILLISECONDS TO {g} MILLISECONDS AGO > 100",
    "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST {a} MILLISECONDS > 2 "
    "AND AVG(price) OVER LAST 10 ROWS > 40 AND MAX(size) OVER LAST 5 ROWS > 200",
    "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST {a} MILLISECONDS > 2",
    "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST {b} MILLISECONDS > 2000",
    "SELECT dst_ip FROM packets WHERE protocol = 'TCP' AND tcp_flags = 'S' GROUP BY dst_ip "
    "HAVING COUNT(*) OVER LAST {a} MILLISECONDS > 2 AND AVG(length) OVER LAST {a} MILLISECONDS > 100",
    "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(*) OVER LAST {a} MILLISECONDS > 2 "
    "AND MIN(length) OVER LAST {a} MILLISECONDS < 300 AND MAX(dst_port) OVER LAST {a} MILLISECONDS > 100",
)


def rules_for(pane_ms: int) -> list[str]:
    """:data:`RULES` with windows in panes of ``pane_ms`` (every window a multiple of it)."""
    return [r.format(a=2 * pane_ms, b=3 * pane_ms, g=pane_ms) for r in RULES]


BATCHES = 4  #: batches of events after the one that subscribes the rules
EVENTS = 2_000  #: events of each stream per batch
KEYS = 40  #: distinct keys of each stream


def _events(
    stream: str, n: int, lo_ms: int, hi_ms: int, rng: np.random.Generator, n_keys: int
) -> dict[str, Any]:
    """``n`` valid events of ``stream`` with event times in ``[lo_ms, hi_ms)``, in time order,
    over the first ``n_keys`` keys."""
    ts = np.sort(rng.integers(lo_ms, hi_ms, n)).astype(np.int64)
    keys = rng.integers(0, n_keys, n)
    if stream == "trades":
        return {
            "symbol": [f"WARM{k:02d}" for k in keys],
            "ts": ts,
            "price": np.round(rng.uniform(10, 90, n), 2),
            "size": rng.integers(1, 1000, n).astype(np.int64),
            "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n).tolist(),
            "exchange": ["NASDAQ"] * n,
        }
    return {
        "ts": ts,
        "src_ip": [f"192.0.2.{k}" for k in keys],
        "dst_ip": [f"198.51.100.{k}" for k in rng.integers(0, KEYS, n)],
        "src_port": rng.integers(1024, 65000, n).astype(np.int64),
        "dst_port": rng.integers(1, 1024, n).astype(np.int64),
        "protocol": rng.choice(np.array(["TCP", "UDP"], dtype=object), n).tolist(),
        "length": rng.integers(40, 1500, n).astype(np.int64),
        "tcp_flags": ["S"] * n,
    }


def kafka_records(
    topics: Mapping[str, str], lo_ms: int, hi_ms: int, seed: int, n_keys: int = KEYS
) -> pa.Table:
    """Kafka rows (:func:`kafka_records_of`) of :data:`EVENTS` valid events of each stream of
    ``topics`` with event times in ``[lo_ms, hi_ms)`` over ``n_keys`` keys, offsets starting at
    ``seed * EVENTS``."""
    rng = np.random.default_rng(seed)
    return pa.concat_tables(
        [
            kafka_records_of(
                topics[stream], stream, _events(stream, EVENTS, lo_ms, hi_ms, rng, n_keys), seed * EVENTS
            )
            for stream in ("trades", "packets")
            if stream in topics
        ]
    )


class _OtherThreads(logging.Filter):
    """Drops the records logged by the thread that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


@contextmanager
def _quiet() -> Iterator[None]:
    """The engine's log without this thread's records meanwhile: the throwaway core's "subscription
    warm-up-3 (...) is active" would read as the engine's own (other threads still log)."""
    logger, only = logging.getLogger("tidewatch.engine"), _OtherThreads()
    logger.addFilter(only)
    try:
        yield
    finally:
        logger.removeFilter(only)


def _no_history(stream: str, _index: Any, _lo: int | None, _hi: int | None) -> Decoded:
    """No event before the warm-up's first batch (an :data:`engine.core.EventSource`)."""
    return empty(stream)


def warm_driver(
    core_factory: Callable[[], EngineCore], topics: Mapping[str, str], *, executors: bool
) -> tuple[float, int]:
    """Run a throwaway core of ``core_factory`` through :data:`BATCHES` batches of synthetic
    events (see the module docstring); ``topics``: stream -> topic, as the engine's.  Returns the
    seconds it took and the alerts the throwaway core made (> 0: its lookups ran).  What the
    throwaway core logs is not logged (:func:`_quiet`)."""
    with _quiet():
        return _warm_driver(core_factory, topics, executors=executors)


def warm_batch(
    core: EngineCore,
    batch: int,
    records: pa.Table,
    topics: Mapping[str, str],
    changes: list[SubscriptionChange],
    *,
    executors: bool,
) -> BatchOutput:
    """One batch of Kafka ``records`` (of the event streams of ``topics``, nothing before them)
    through ``core`` by the path of the engine's mode: the executors' pure function run here and
    merged (:func:`engine.executors.output.preaggregate_here`, as a replay does), or the driver's
    decode."""
    if executors:
        from engine.executors.output import preaggregate_here

        params = core.batch_params(dict(topics))
        eb = preaggregate_here(records, params, batch=batch)
        # rules new at this batch with nothing pending before it: the events read again for
        # their pane specs (the engine's Kafka history) are none
        return core.process_preaggregated(batch, eb, params, changes, history=_no_history)
    by_stream = {s: records.filter(pa.compute.equal(records.column("topic"), t)) for s, t in topics.items()}
    return core.process(batch, by_stream, changes)


def read_alerts(out: BatchOutput) -> int:
    """Make ``out``'s alerts into the columns both sinks read
    (:class:`engine.sinks.alert_columns.AlertColumns`); how many there were."""
    from engine.sinks.alert_columns import AlertColumns

    if out.alerts:
        cols = AlertColumns.of(out.alerts)
        cols.ids, cols.subscription_uuid_text, cols.values_json, cols.value_floats, cols.present  # noqa: B018
    return len(out.alerts)


def _warm_driver(
    core_factory: Callable[[], EngineCore], topics: Mapping[str, str], *, executors: bool
) -> tuple[float, int]:
    t0 = time.perf_counter()
    core = core_factory()
    streams = {s: t for s, t in topics.items() if s in ("trades", "packets")}
    rules = [
        SubscriptionChange(f"warm-up-{i}", "upsert", f"warm-up {i}", text)
        for i, text in enumerate(rules_for(core.g))
    ]
    no_records = kafka_records(streams, 0, 1, 0).slice(0, 0)
    # event times ending a minute ago, each batch's span past the lateness and two lookup periods
    span = core.lateness + 2 * core.L
    start = (int(time.time() * 1000) - 60_000 - BATCHES * span) // core.L * core.L
    alerts = 0
    for b in range(BATCHES + 1):
        # the last two batches on half the keys: the others go idle past every time window and
        # are expired (the index's reset of a key and the recompute of its blocks)
        n_keys = KEYS if b <= BATCHES - 2 else KEYS // 2
        recs = (
            no_records
            if b == 0
            else kafka_records(streams, start + (b - 1) * span, start + b * span, b, n_keys)
        )
        alerts += read_alerts(
            warm_batch(core, b, recs, streams, rules if b == 0 else [], executors=executors)
        )
    return time.perf_counter() - t0, alerts
