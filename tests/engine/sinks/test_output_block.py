"""A batch's ``engine_outputs`` row (:mod:`engine.sinks.output_block`): what is decoded is what
the expansion would have written from the batch in memory -- the same alerts in the same order,
their ids, values JSON and value doubles, the withheld changes and the removed subscriptions --
for random batches (Hypothesis) against the Alert objects themselves.  Pure: no services."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.messages import Alert, AlertBlock, AlertSeq, BatchOutput, LookupBlock
from engine.sinks.alert_columns import AlertColumns, values_json
from engine.sinks.output_block import decode, encode, expands, with_columns

LABELS = ["COUNT(*) OVER LAST 10 SECONDS", "SUM(size)", 'odd "label"\n', "é"]
number = st.one_of(
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(),
)


@st.composite
def outputs(draw: Any) -> BatchOutput:
    """Alerts as the core makes them (one block of typed values per lookup time, or a block of one
    subscription and lookup time) and as objects, CAPPED records among them, maybe withheld
    changes and removed subscriptions."""
    seq = AlertSeq()
    for t in range(draw(st.integers(0, 4))):
        sid = draw(st.sampled_from(["s1", "00000000-0000-0000-0000-000000000002", "ü"]))
        keys = draw(st.lists(st.text(max_size=6), max_size=8, unique=True))
        labels = draw(st.lists(st.sampled_from(LABELS), max_size=3, unique=True))
        kinds = [draw(st.sampled_from(["ENTER", "EXIT"])) for _ in keys]
        cols = [[draw(number) for _ in keys] for _ in labels]
        block = AlertBlock(sid, f"rule {sid}", "trades", 1000 * t, keys, kinds, labels, cols)
        try:  # the core's lookup block, when its values are typed doubles (ints below 2**53)
            seq.add_block(LookupBlock.of_blocks([block]) if draw(st.booleans()) else block)
        except ValueError:
            seq.add_block(block)
        if draw(st.booleans()):
            seq.append(Alert(sid, "r", "packets", "10.0.0.1", "CAPPED", 1000 * t, {"withheld": 3}))
    withheld = [
        Alert("s1", "r", "trades", k, "ENTER", 5, {"n": draw(number)})
        for k in draw(st.lists(st.text(max_size=4), max_size=3))
    ]
    removed = draw(st.lists(st.sampled_from(["s1", "gone"]), max_size=2, unique=True))
    return BatchOutput(batch_id=draw(st.integers(0, 10**6)), alerts=seq, withheld=withheld, removed=removed)


def _same(a: float | int | None, b: float | int | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, rel_tol=0))


@settings(max_examples=150, deadline=None)
@given(outputs())
def test_a_decoded_row_is_the_batch_the_expansion_reads(out: BatchOutput) -> None:
    row = encode(out)
    got = decode(out.batch_id, row)
    assert got.batch_id == out.batch_id and got.removed == out.removed
    want = list(out.alerts)  # the Alert objects, the independent side
    cols = AlertColumns.of(got.alerts, slot=None) if len(got.alerts) else None
    assert len(got.alerts) == len(want) and (row.alert_rows is None) == (not want)
    if cols is not None:
        assert cols.ids.to_pylist() == [a.id for a in want]
        assert cols.kind.to_pylist() == [a.kind for a in want]
        assert cols.as_of.tolist() == [a.as_of for a in want]
        assert cols.values_json.to_pylist() == [values_json(a.values) for a in want]
        for a, text in zip(want, cols.values_json.to_pylist(), strict=True):
            assert all(_same(a.values[k], v) for k, v in json.loads(text).items())
    assert [(a.key, a.kind, a.values) for a in got.withheld] == [
        (a.key, a.kind, a.values) for a in out.withheld
    ]
    assert expands(out) == bool(want or out.withheld or out.removed)


def test_the_live_path_hands_the_columns_built_for_both_sinks_on_as_they_are() -> None:
    alerts = [Alert("s", "r", "trades", f"K{i}", "ENTER", 7, {"n": i}) for i in range(5)]
    out = BatchOutput(batch_id=3, alerts=alerts, removed=["x"])
    cols = AlertColumns.of(out.alerts)
    live = with_columns(out, cols)
    nxt = BatchOutput(batch_id=4, alerts=[Alert("s", "r", "trades", "N", "EXIT", 8, {"n": 0})])
    nxt_cols = AlertColumns.of(nxt.alerts)  # the next batch, being delivered meanwhile
    assert AlertColumns.of(live.alerts) is cols and live.removed == ["x"] and live.batch_id == 3
    assert AlertColumns.of(nxt.alerts) is nxt_cols  # the expansion did not evict its columns
    assert not expands(BatchOutput(batch_id=4))


def test_a_kind_the_alert_log_refuses_is_refused_before_anything_is_written() -> None:
    out = BatchOutput(batch_id=1, alerts=[Alert("s", "r", "trades", "K", "MAYBE", 7, {})])
    with pytest.raises(ValueError, match="'MAYBE' is not one of ENTER, EXIT, CAPPED"):
        encode(out)


@pytest.mark.parametrize(
    ("value", "typed"),
    [(3, True), (2.5, True), (None, True), (-0.0, True), (2**53 - 1, True), (2**53, False), (True, False)],
)
def test_values_go_as_typed_doubles_unless_a_double_cannot_say_them(value: Any, typed: bool) -> None:
    """None, ints below 2**53 and floats are stored as doubles with their type (the JSON text is
    the expansion's to compute); anything else (a bool, a larger int) with the JSON text itself.
    Either way the decoded text is the batch's."""
    import pyarrow as pa

    out = BatchOutput(batch_id=1, alerts=[Alert("s", "r", "trades", "K", "ENTER", 7, {"v": value, "n": 1})])
    row = encode(out)
    assert row.alert_rows is not None
    stored = pa.ipc.open_stream(pa.py_buffer(row.alert_rows)).read_all().column_names
    assert ("values_json" not in stored) is typed
    got = AlertColumns.of(decode(1, row).alerts, slot=None)
    assert got.values_json.to_pylist() == [values_json({"v": value, "n": 1})]


@pytest.mark.parametrize("n", [1, 255, 256, 3000])
def test_a_row_is_compressed_from_its_threshold_and_reads_back_either_way(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.sinks import output_block

    out = BatchOutput(
        batch_id=7,
        alerts=[Alert("s1", "r", "trades", f"K{i % 40}", "ENTER", 1000 * i, {"n": i % 7}) for i in range(n)],
    )
    row = encode(out)
    got = list(decode(7, row).alerts)
    assert [(a.key, a.as_of, a.values) for a in got] == [(a.key, a.as_of, a.values) for a in out.alerts]
    threshold = output_block._COMPRESS_FROM_ROWS
    monkeypatch.setattr(output_block, "_COMPRESS_FROM_ROWS", 10**9)  # the same tables, plain
    plain = encode(out)
    assert row.alert_rows is not None and plain.alert_rows is not None
    assert (len(row.alert_rows) < len(plain.alert_rows)) == (n >= threshold)
