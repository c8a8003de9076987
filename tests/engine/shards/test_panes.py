"""Shards on pane rows vs one engine core (no services, no Spark): the routing tasks decode and
pre-aggregate, the shards evaluate (:mod:`engine.shards.panes`), and the union of the shards'
outputs is the single core's on the raw records -- alerts with their values, lookups, dead
letters, events -- for 1, 2 and 3 shards, over the scenario of ``test_step`` (packets keyed by two
fields, a ROWS window, FILTER, late events, a rule added mid-stream whose history is read again).
The split itself is checked row by row against a brute force."""

from __future__ import annotations

from collections import Counter
from collections.abc import Set as AbstractSet
from typing import Any

import pyarrow as pa
import pytest

from engine.core import EngineCore, default_core
from engine.decode import STREAMS
from engine.executors.history import records_source
from engine.executors.preagg import Preaggregator, ipc_table
from engine.messages import BatchOutput
from engine.rule_evaluator import rule_compiler
from engine.shards.panes import (
    params_bytes,
    params_match,
    params_tag,
    property_value,
    run_shard_panes,
    shard_rows,
    split_output,
)
from engine.shards.route import shard_of
from engine.shards.step import decode_output, encode_output, merge_outputs, meta_of
from engine.sources.readers import split_topics, subscription_changes
from tests.engine.executors.support import read_logged
from tests.engine.shards.support import TOPICS, alert_rows, scenario_batches, split_tasks
from tests.engine.shards.test_step import _dead, _settings, _single


def _sharded_panes(
    batches: list[pa.Table],
    n: int,
    reread: AbstractSet[int] = frozenset(),
    restore_at: int | None = None,
) -> list[BatchOutput]:
    """The batches over ``n`` shards on pane rows, merged as the driver merges them; the batches of
    ``reread`` as a shard takes one whose routing had no parameters: read again whole and
    pre-aggregated by the shard (:func:`shard_rows`)."""
    s = _settings()
    cores = [default_core(s) for _ in range(n)]
    log: list[pa.Table] = []
    history = records_source(lambda ranges: read_logged(log, ranges), TOPICS, s.max_future_ms)
    outs = []
    for b, tbl in enumerate(batches):
        log.append(tbl)
        params = cores[0].batch_params(dict(TOPICS))
        assert all(c.batch_params(dict(TOPICS)) == params for c in cores)  # one state's, every shard's
        tasks = [
            split_output(pa.Table.from_batches(list(Preaggregator(params)(t.to_batches()))), n)
            for t in split_tasks(tbl)
        ]
        per = []
        for shard in range(n):
            if b in reread:
                rows = shard_rows(tbl, params, shard, n)
            else:
                rows = pa.concat_tables([t[shard] for t in tasks])
            out = run_shard_panes(cores[shard], b, shard, n, rows, params, [], history)
            back, _ = decode_output(encode_output(out, meta_of(cores[shard], shard, b, 0.0, "live", 0)))
            per.append(back)
        outs.append(merge_outputs(b, per))
        if restore_at == b:  # every shard rebuilt from its snapshot: the same from here on
            cores = [EngineCore.from_bytes(c.to_bytes(), rule_compiler(s)) for c in cores]
    return outs


@pytest.fixture(scope="module")
def case() -> tuple[list[pa.Table], dict[str, str], list[BatchOutput]]:
    batches, ids = scenario_batches()
    return batches, ids, _single(batches, _settings())


def _same(got: list[BatchOutput], want: list[BatchOutput]) -> None:
    assert sum(len(o.alerts) for o in want) > 200
    assert [alert_rows(o.alerts) for o in got] == [alert_rows(o.alerts) for o in want]
    assert [o.lookups for o in got] == [o.lookups for o in want]
    assert [o.events for o in got] == [o.events for o in want]
    assert _dead(got) == _dead(want)
    assert [o.removed for o in got] == [o.removed for o in want]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_shards_on_pane_rows_equal_one_core_on_records(case: Any, n: int) -> None:
    batches, ids, single = case
    _same(_sharded_panes(batches, n), single)
    subs = {a.subscription_id for o in single for a in o.alerts}
    assert {ids["fan_in"], ids["rows"], ids["late_bid"], ids["ago"], ids["filter"]} <= subs


def test_batches_read_again_by_the_shard_and_a_rebuild_change_nothing(case: Any) -> None:
    batches, _, single = case
    every_other = frozenset(range(0, len(batches), 2))
    _same(_sharded_panes(batches, 2, reread=every_other, restore_at=len(batches) // 2), single)


def test_split_sends_keyed_rows_to_their_owner_dead_letters_to_shard_0_the_clock_to_all(case: Any) -> None:
    """Brute force: every row of each batch's executor output, by kind, where it must go."""
    batches, _, _ = case
    core = default_core(_settings())  # the parameters of the state before each batch
    n, seen_kinds = 3, set()
    for b, tbl in enumerate(batches):
        params = core.batch_params(dict(TOPICS))
        out = pa.Table.from_batches(list(Preaggregator(params)(tbl.to_batches())))
        parts = split_output(out, n)
        held = [Counter(map(_row_key, p.to_pylist())) for p in parts]
        for row in out.to_pylist():
            kind, k = row["kind"], _row_key(row)
            seen_kinds.add(kind)
            holders = [sh for sh in range(n) if held[sh][k]]
            if kind in ("pane", "distinct"):
                assert holders == [int(shard_of([row["key"]], n)[0])], (b, row)
            elif kind == "dead":
                assert holders == [0]
            elif kind in ("partition", "record"):
                assert holders == list(range(n))
        for stream in ("trades", "packets"):  # raw events: to the shards of each key field
            want: Counter[tuple[int, int, int]] = Counter()
            for r in out.to_pylist():
                if r["kind"] == "event" and r["stream"] == stream:
                    t = ipc_table(r["payload"]).to_pylist()
                    for e in t:
                        for sh in {int(shard_of([e[f]], n)[0]) for f in STREAMS[stream].keys}:
                            want[(sh, e["partition"], e["offset"])] += 1
            got: Counter[tuple[int, int, int]] = Counter()
            for sh in range(n):
                for r in parts[sh].to_pylist():
                    if r["kind"] == "event" and r["stream"] == stream:
                        for e in ipc_table(r["payload"]).to_pylist():
                            got[(sh, e["partition"], e["offset"])] += 1
            assert got == want, (b, stream)
        parts_of = split_topics(tbl, TOPICS)
        core.process(b, parts_of, subscription_changes(parts_of.pop("subscriptions")))
    assert {"pane", "distinct", "dead", "partition", "record", "event"} <= seen_kinds


def _row_key(row: dict[str, Any]) -> str:
    return repr(sorted((k, v) for k, v in row.items() if k != "payload")) + repr(row.get("payload"))


def test_pane_rows_are_taken_only_when_every_task_made_them_with_the_shards_parameters() -> None:
    from dataclasses import replace

    core = default_core(_settings())
    own = core.batch_params(dict(TOPICS))
    tag = params_tag(property_value(4, params_bytes(own)))
    assert tag.startswith("4:")
    assert params_match([tag, tag], (tag, own), own)
    assert not params_match([], (tag, own), own)  # no routing task: nothing to take
    assert not params_match([tag, None], (tag, own), own)  # a task routed records
    assert not params_match([tag, "4:other"], (tag, own), own)  # a task with other parameters
    assert not params_match([tag], None, own)  # the shard's task got none
    assert not params_match([tag], (tag, own), replace(own, late_until=5))  # another state's
