"""``EngineCore.process_preaggregated`` (executors mode) gives batch by batch the output of
``EngineCore.process`` (the driver path) on the same records: alerts with their values, dead
letters, event counts, lookups -- across rules added (a new key field, new column sets: PSoup
backfill, a stream fed raw while its pane specs changed) and removed, and a snapshot round trip."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from engine.core import EngineCore
from engine.decode import STREAMS
from engine.evaluation.evaluator import Evaluator
from engine.executors.history import records_source
from engine.executors.output import preaggregate_here
from engine.messages import SubscriptionChange
from engine.rule_evaluator import rule_compiler
from tests.engine.executors.support import BASE, IPS, SYMBOLS, TOPICS, G, kafka_rows, read_logged
from tidewatch.settings import get_settings
from tidewatch.wire.avro import encode_batch

RULES = [
    ("count", "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 2 SECONDS > 2"),
    ("ask", "SELECT symbol FROM trades WHERE side = 'ASK' GROUP BY symbol "
     "HAVING SUM(size) OVER LAST 3 SECONDS >= 5 AND AVG(price) OVER LAST 2 SECONDS < 3"),
    ("up", "SELECT symbol FROM trades GROUP BY symbol HAVING LAST(price) OVER LAST 2 SECONDS > FIRST(price) OVER LAST 2 SECONDS"),
    ("rows", "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) FILTER (WHERE side = 'BID') OVER LAST 3 ROWS > 5"),
    ("syn", "SELECT dst_ip FROM packets WHERE protocol = 'TCP' GROUP BY dst_ip HAVING COUNT(*) OVER LAST 2 SECONDS >= 2"),
    ("scan", "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST 3 SECONDS >= 2"),
    ("range", "SELECT symbol FROM trades GROUP BY symbol "
     "HAVING MAX(price) OVER LAST 3 SECONDS - MIN(price) OVER LAST 3 SECONDS > 1"),
    ("heavy", "SELECT src_ip FROM packets WHERE dst_port = 80 GROUP BY src_ip HAVING SUM(length) OVER LAST 2 SECONDS > 300"),
]  # fmt: skip
#: batch -> subscription changes applied first in it
CHANGES = {
    0: [("upsert", n) for n in ("count", "syn")],
    2: [("upsert", n) for n in ("ask", "up", "scan")],
    4: [("upsert", "rows"), ("delete", "count")],
    6: [("upsert", "range"), ("upsert", "heavy")],
    8: [("delete", "syn"), ("upsert", "count")],
}
TEXT = dict(RULES)


def _core(history_ms: int = 60_000) -> EngineCore:
    s = get_settings()
    return EngineCore(
        pane_ms=G,
        allowed_lateness_ms=1500,
        max_future_ms=10**9,
        evaluator_factory=lambda: Evaluator("shared", ci_p=2, pane_ms=G, history_ms=history_ms),
        compile_rule=rule_compiler(s),
        idle_timeout_ms=5000,
    )


def _batch(b: int, rng: np.random.Generator, offs: dict[tuple[str, int], int]) -> pa.Table:
    rows: list[tuple[str, int, int, bytes, bytes]] = []
    for _ in range(int(rng.integers(20, 80))):
        stream = "trades" if rng.random() < 0.65 else "packets"
        part = int(rng.integers(0, 3))
        ts = BASE + b * 1500 + int(rng.integers(-2500, 2500)) // 250 * 250
        k = int(rng.integers(0, 4))
        size = int(rng.integers(0, 7))
        if stream == "trades":
            rec: dict[str, Any] = {
                "symbol": SYMBOLS[k], "ts": ts, "price": float(rng.choice([0.5, 1.0, 2.5, 3.0, 4.25])),
                "size": size, "side": "ASK" if rng.random() < 0.5 else "BID",
                "exchange": ["NYSE", "NASDAQ"][size % 2],
            }  # fmt: skip
        else:
            rec = {
                "ts": ts, "src_ip": IPS[k % 3], "dst_ip": IPS[(k + size) % 3], "src_port": 1000 + size,
                "dst_port": 80 if rng.random() < 0.5 else 443, "protocol": "TCP" if size % 3 else "UDP",
                "length": 100 + size, "tcp_flags": "S",
            }  # fmt: skip
        value = encode_batch(stream, {f: [v] for f, v in rec.items()}).messages()[0]
        if rng.random() < 0.03:
            value = value[:-2]
        topic = TOPICS[stream]
        off = offs.get((topic, part), 0)
        offs[(topic, part)] = off + 1
        rows.append((topic, part, off, f"k{k}".encode(), value))
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    return kafka_rows(rows)


def _changes(b: int) -> list[SubscriptionChange]:
    return [
        SubscriptionChange(name, op, name, TEXT[name] if op == "upsert" else "")
        for op, name in CHANGES.get(b, [])
    ]


def _split(tbl: pa.Table) -> dict[str, pa.Table]:
    import pyarrow.compute as pc

    return {s: tbl.filter(pc.equal(tbl.column("topic"), TOPICS[s])) for s in STREAMS}


@pytest.mark.parametrize(
    ("seed", "history_ms", "pipelined"),
    [(1, 60_000, False), (2, 60_000, False), (3, 60_000, False), (4, 2_000, False), (5, 0, False),
     (1, 60_000, True), (3, 60_000, True), (4, 2_000, True), (6, 0, True)],
)  # fmt: skip
def test_executor_path_equals_driver_path_batch_by_batch(seed: int, history_ms: int, pipelined: bool) -> None:
    """Rules added later are filled from history the executors mode reads again from "Kafka"
    (``records_source``): a long retention, and a short one (dropped batches, units).

    ``pipelined``: each batch made with the parameters :meth:`EngineCore.params_after` gave
    before the batch ahead of it was processed (as ``EngineApp.on_batch_executors`` does while
    that batch is evaluated): pane specs one batch old, the late bound and watermark forecast."""
    rng = np.random.default_rng(seed)
    offs: dict[tuple[str, int], int] = {}
    driver, execs = _core(history_ms), _core(history_ms)
    n_alerts = 0
    log: list[pa.Table] = []  # "Kafka": every batch's records
    source = records_source(lambda ranges: read_logged(log, ranges), TOPICS, 10**9)
    raw_asked: list[frozenset[str]] = []
    ahead = None  # pipelined: this batch's parameters, decided before the batch ahead of it ran
    for b in range(20):
        tbl = _batch(b, rng, offs)
        log.append(tbl)
        want = driver.process(b, _split(tbl), _changes(b))
        params = ahead or execs.batch_params(dict(TOPICS))
        raw_asked.append(params.raw_streams)
        eb = preaggregate_here(tbl, params, batch=b)
        if pipelined:
            ahead = execs.params_after(dict(TOPICS), eb, None)
        got = execs.process_preaggregated(b, eb, params, _changes(b), history=source)
        assert got.lookups == want.lookups, b
        assert got.alerts == want.alerts, b
        assert got.events == want.events, b
        assert got.dead.reason == want.dead.reason and got.dead.source_offset == want.dead.source_offset, b
        assert got.removed == want.removed and got.changed == want.changed, b
        assert execs.watermark == driver.watermark and execs.applied_until == driver.applied_until
        n_alerts += len(want.alerts)
        if b == 5:  # the executors mode's state (pending pane rows included) round-trips
            execs = EngineCore.from_bytes(execs.to_bytes(), rule_compiler(get_settings()))
            assert execs.panes
    assert n_alerts > 20
    # events reach the driver raw only for a ROWS window ("rows" on trades from batch 4) or
    # for the few batches after a spec change (packets' last at batch 8)
    lag = int(pipelined)  # pipelined, the specs come one batch later
    assert all("trades" in r for r in raw_asked[5 + lag :]), raw_asked
    assert not any("packets" in r for r in raw_asked[14 + lag :]), [sorted(r) for r in raw_asked]
    if pipelined:
        assert ahead is not None and ahead.late_until == execs.applied_until
    if history_ms < 10_000:  # batches no rule can read again are dropped
        assert len(execs.history_index) < 12, execs.history_index.max_ts


def test_a_batch_made_for_another_late_bound_is_refused() -> None:
    """The pipelined parameters are checked against the state: a batch pre-aggregated with a
    late bound the state does not have would decide ``late`` differently, so it is refused."""
    from dataclasses import replace

    from engine.errors import BatchParamsMismatch

    rng = np.random.default_rng(7)
    offs: dict[tuple[str, int], int] = {}
    core = _core()
    log: list[pa.Table] = []
    source = records_source(lambda ranges: read_logged(log, ranges), TOPICS, 10**9)
    for b in range(4):
        tbl = _batch(b, rng, offs)
        log.append(tbl)
        params = core.batch_params(dict(TOPICS))
        eb = preaggregate_here(tbl, params, batch=b)
        core.process_preaggregated(b, eb, params, _changes(b), history=source)
    assert core.applied_until is not None
    tbl = _batch(4, rng, offs)
    params = replace(core.batch_params(dict(TOPICS)), late_until=core.applied_until - G)
    with pytest.raises(BatchParamsMismatch):
        core.process_preaggregated(4, preaggregate_here(tbl, params, batch=4), params, [])
    assert core.last_batch == 3  # nothing of the batch was taken


def test_last_lookup_is_the_last_multiple_of_the_period_up_to_now() -> None:
    from engine.watermark import last_lookup

    assert last_lookup(1000, None, 500) == 1000
    assert last_lookup(1000, 1499, 500) == 1000  # now = 1000: nothing due
    assert last_lookup(1000, 2730, 500) == 2500
    assert last_lookup(1000, 2730, 1000) == 2000
    assert last_lookup(1200, 2730, 500) == 2200  # a restored state off the period's grid
