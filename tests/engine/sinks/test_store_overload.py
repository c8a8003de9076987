"""The overload policy's record in PostgreSQL: ``engine_batches.strides`` in the batch's transaction,
read back for a replay (:meth:`Store.strides_of_batch`), and ``engine_metrics.degraded`` for Health
(real PostgreSQL: the embedded server of the ``restartable_pg`` fixture, a fresh database)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, text

from engine.messages import BatchOutput
from engine.sinks.store import Store
from tidewatch.settings import Settings

pytestmark = pytest.mark.integration

T0 = 1_763_900_000_000
METRICS = {"events_per_s": 1.0, "batch_ms": 2.0, "lag_ms": 3.0, "alerts": 0, "dead_letters": 0}


def test_commit_records_strides_and_degraded(restartable_pg: Settings) -> None:
    from tests.engine.test_engine_integration import fresh_database

    a, b = str(uuid.UUID(int=1)), str(uuid.UUID(int=2))
    eng = create_engine(fresh_database(restartable_pg.sqlalchemy_url))
    store = Store(eng)
    degraded = {a: {"every_ms": 4000, "budget_ms": 5000}, b: {"every_ms": 2000, "budget_ms": 2500}}
    try:
        out = BatchOutput(batch_id=1, lookups=[T0], strides={a: 4, b: 2}, degraded=degraded)
        assert store.commit(out, watermark=T0, metrics=METRICS)
        assert store.commit(BatchOutput(batch_id=2, lookups=[T0 + 1000]), watermark=T0, metrics=METRICS)
        # a recommit writes nothing, whatever strides it carries (the first decision stands)
        assert not store.commit(BatchOutput(batch_id=1, strides={a: 2}), watermark=T0, metrics=METRICS)
        assert store.strides_of_batch(1) == {a: 4, b: 2}
        assert store.strides_of_batch(2) == {} and store.strides_of_batch(99) == {}
        with eng.connect() as conn:
            rows = conn.execute(text("SELECT batch_id, degraded FROM engine_metrics ORDER BY 1")).all()
    finally:
        eng.dispose()
    assert [tuple(r) for r in rows] == [(1, degraded), (2, {})]
