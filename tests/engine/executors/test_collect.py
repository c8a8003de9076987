"""The token check of ``collect_preaggregated`` (no Spark): output whose tasks ran with another
call's parameters, or with none, is refused; the shared function outside a Spark task refuses to
run without its parameters."""

from __future__ import annotations

import pyarrow as pa
import pytest

from engine.errors import BatchParamsMismatch
from engine.executors.collect import _check_token
from engine.executors.preagg import OUTPUT_SCHEMA, Preaggregator, TaskParamsPreaggregator
from tests.engine.executors.support import kafka_table, params


def _output(token: str) -> pa.Table:
    recs = [("trades", p, t, 1, 3, 2, True, 5) for p in range(3) for t in range(2)]
    batches = kafka_table(recs, seed=1).to_batches()
    return pa.Table.from_batches(list(Preaggregator(params(), token)(batches)), schema=OUTPUT_SCHEMA)


def test_output_of_this_call_passes_and_any_other_is_refused() -> None:
    out = _output("7-3")
    _check_token(out, "7-3")
    with pytest.raises(BatchParamsMismatch, match="7-3"):
        _check_token(out, "7-4")
    with pytest.raises(BatchParamsMismatch, match="none"):
        _check_token(_output(""), "7-4")
    mixed = pa.concat_tables([out, _output("7-2")])  # one task with a stale property
    with pytest.raises(BatchParamsMismatch):
        _check_token(mixed, "7-3")


def test_the_shared_function_needs_its_parameters() -> None:
    batches = kafka_table([("trades", 0, 0, 1, 3, 2, True, 5)], seed=1).to_batches()
    with pytest.raises(BatchParamsMismatch, match="collect_preaggregated"):
        list(TaskParamsPreaggregator()(batches))
