"""The warm-up records (:mod:`engine.executors.warmup`) go through the executors' whole path:
valid, not late, one event of each stream per task, pane rows made -- so the kernels a
micro-batch needs are the ones the warm-up loaded."""

from __future__ import annotations

from engine.executors.output import preaggregate_here
from engine.executors.warmup import warm_up_records
from tests.engine.executors.support import BASE, TOPICS, params


def test_warm_up_records_are_valid_events_of_every_stream() -> None:
    p = params()
    tbl = warm_up_records(p, 2, BASE + 1_000)
    eb = preaggregate_here(tbl, p)
    assert not len(eb.dead), eb.dead.reason
    assert eb.events == {"trades": 2, "packets": 2}
    assert eb.panes, "no pane rows: the aggregation kernels did not run"
    assert set(tbl.column("topic").to_pylist()) == set(TOPICS.values())
