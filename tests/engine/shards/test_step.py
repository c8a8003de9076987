"""Shards vs one engine core on the same micro-batches (no services, no Spark): the union of the
shards' outputs is the single core's -- alerts with their values, lookups, dead letters, events,
rule changes -- for 1, 2 and 3 shards, packets routed by both key fields, a ROWS window, a
historical window, FILTER, late events and a rule added mid-stream (PSoup); and the shard state
round-trips through its snapshot."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.core import EngineCore, default_core
from engine.messages import BatchOutput
from engine.rule_evaluator import rule_compiler
from engine.shards.charts import answer_owned
from engine.shards.route import merge_spans, route_records, shard_of
from engine.shards.step import decode_output, encode_output, merge_outputs, meta_of, run_shard
from engine.sinks.charts import compute_answer
from engine.sources.readers import split_topics, subscription_changes
from tests.engine.shards.support import TOPICS, alert_rows, scenario_batches, split_tasks, sub_record
from tidewatch.settings import Settings, get_settings

MAX_FUTURE = 60_000


def _settings() -> Settings:
    return get_settings().model_copy(
        update={"pane_ms": 1000, "allowed_lateness_ms": 2_000, "max_future_ms": MAX_FUTURE}
    )


def _single(
    batches: list[pa.Table],
    s: Settings,
    strides: list[dict[str, int]] | None = None,
    keep: list[EngineCore] | None = None,
) -> list[BatchOutput]:
    core = default_core(s)
    if keep is not None:
        keep.append(core)
    outs = []
    for b, tbl in enumerate(batches):
        parts = split_topics(tbl, TOPICS)
        changes = subscription_changes(parts.pop("subscriptions"))
        outs.append(core.process(b, parts, changes, strides=strides[b] if strides else None))
    return outs


def _sharded(
    batches: list[pa.Table],
    s: Settings,
    n: int,
    restore_at: int | None = None,
    cap: int = 0,
    strides: list[dict[str, int]] | None = None,
    keep: list[EngineCore] | None = None,
) -> list[BatchOutput]:
    """The batches over ``n`` shards (uncapped, as the sharded engine runs them), merged as its
    driver merges them, capped at ``cap`` alerts per lookup; ``strides``: each batch's, as the
    driver decided them (engine.shards.strides); ``keep`` gets the shards' cores at the end."""
    cores = [default_core(s) for _ in range(n)]
    outs = []
    for b, tbl in enumerate(batches):
        routed = [route_records(t, TOPICS, n, MAX_FUTURE) for t in split_tasks(tbl)]
        span = merge_spans(sp for _, sp in routed)
        per = []
        for shard in range(n):
            recs = pa.concat_tables([r[shard] for r, _ in routed])
            out = run_shard(cores[shard], b, shard, n, recs, span, TOPICS, strides[b] if strides else None)
            # through the wire format, as the driver gets it
            back, meta = decode_output(encode_output(out, meta_of(cores[shard], shard, b, 0.0, "live", 0)))
            assert meta.batch_id == b and meta.shard == shard
            per.append(back)
        outs.append(merge_outputs(b, per, cap))
        if restore_at == b:  # every shard rebuilt from its snapshot: the same from here on
            cores = [EngineCore.from_bytes(c.to_bytes(), rule_compiler(s)) for c in cores]
    if keep is not None:
        keep.extend(cores)
    return outs


def _dead(outs: list[BatchOutput]) -> Counter[tuple[str, int, int, str]]:
    return Counter(
        (d.source_topic[i], d.source_partition[i], d.source_offset[i], d.reason[i])
        for d in (o.dead for o in outs)
        for i in range(len(d))
    )


@pytest.fixture(scope="module")
def case() -> tuple[list[pa.Table], dict[str, str], list[BatchOutput]]:
    batches, ids = scenario_batches()
    return batches, ids, _single(batches, _settings())


@pytest.mark.parametrize("n", [1, 2, 3])
def test_shards_equal_one_core(case: Any, n: int) -> None:
    batches, ids, single = case
    sharded = _sharded(batches, _settings(), n)
    want = [alert_rows(o.alerts) for o in single]
    got = [alert_rows(o.alerts) for o in sharded]
    assert sum(map(len, want)) > 200
    assert got == want  # batch by batch: every alert, its lookup time and its values
    assert [o.lookups for o in sharded] == [o.lookups for o in single]
    assert [o.events for o in sharded] == [o.events for o in single]
    assert all(set(o.events) == {"trades", "packets"} for o in sharded)
    assert _dead(sharded) == _dead(single)
    reasons = Counter(r for *_, r in _dead(single).elements())
    assert reasons["late"] == 20 and reasons["undecodable"] == 2 and reasons["invalid"] == 3
    # the rules on the second key field and the late rule (PSoup) fired
    subs = {a.subscription_id for o in single for a in o.alerts}
    assert {ids["fan_in"], ids["rows"], ids["late_bid"], ids["ago"], ids["filter"]} <= subs


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_alert_cap_over_shards_keeps_what_one_capped_core_keeps(case: Any, n: int) -> None:
    """The driver caps the shards' merged alerts in the one core's order (engine.shards.capped):
    the same alerts kept, the same CAPPED records (withheld counts by kind), the same withheld
    alerts, and the results (kept and withheld) still every change."""
    batches, _, uncapped = case
    cap = 2
    single = _single(batches, _settings().model_copy(update={"engine_alert_cap_per_lookup": cap}))
    sharded = _sharded(batches, _settings(), n, cap=cap)
    capped = [a for o in single for a in o.alerts if a.kind == "CAPPED"]
    assert len(capped) > 20 and any(a.values["withheld_exit"] for a in capped)
    assert any(p == 1 for o in uncapped for *_, p in o.segments)  # a new rule's whole-result diff
    assert [alert_rows(o.alerts) for o in sharded] == [alert_rows(o.alerts) for o in single]
    assert [alert_rows(o.withheld) for o in sharded] == [alert_rows(o.withheld) for o in single]
    assert [alert_rows(o.result_changes()) for o in sharded] == [alert_rows(o.alerts) for o in uncapped]
    for o in sharded:  # each (subscription, key)'s changes in their order: by lookup time
        times = [a.as_of for a in o.result_changes()]
        assert times == sorted(times)


def test_the_alert_cap_over_shards_orders_changed_rules_as_one_core(case: Any) -> None:
    """A rule changed twice in one batch (two whole-result diffs at one time, ENTERs and EXITs
    each): one budget and one CAPPED record for both, the same alerts kept as one core keeps."""
    batches, ids, _ = case
    batches = list(batches)
    sid = ids["drop"]
    rise = "SELECT symbol FROM trades GROUP BY symbol HAVING LAST(price) OVER LAST 8 SECONDS > FIRST(price) OVER LAST 8 SECONDS"
    fall = "SELECT symbol FROM trades GROUP BY symbol HAVING LAST(price) OVER LAST 20 SECONDS < FIRST(price) OVER LAST 20 SECONDS"
    recs = [sub_record(sid, "drop", rise), sub_record(sid, "drop", fall)]
    change = pa.table(
        {
            "topic": ["subscriptions"] * 2, "partition": pa.array([0, 0], pa.int32()),
            "offset": pa.array([20_000, 20_001], pa.int64()),
            "timestamp": pa.array([0, 0], pa.timestamp("ms")),
            "key": pa.array([k for k, _ in recs], pa.binary()), "value": pa.array([v for _, v in recs], pa.binary()),
        }
    )  # fmt: skip
    batches[9] = pa.concat_tables([change, batches[9].cast(change.schema)])
    cap = 3
    single = _single(batches, _settings().model_copy(update={"engine_alert_cap_per_lookup": cap}))
    diffs = [a for a in single[9].alerts if a.subscription_id == sid and a.as_of == single[8].lookups[-1]]
    assert [a.kind for a in diffs][-1] == "CAPPED" and diffs[-1].values["withheld_exit"]
    for n in (2, 3):
        sharded = _sharded(batches, _settings(), n, cap=cap)
        assert [alert_rows(o.alerts) for o in sharded] == [alert_rows(o.alerts) for o in single]
        assert [alert_rows(o.withheld) for o in sharded] == [alert_rows(o.withheld) for o in single]


def test_shards_with_the_drivers_strides_equal_one_core_with_them(case: Any) -> None:
    """The overload policy over shards: every shard runs a batch with the strides the driver
    recorded for it; the union of their alerts is one core's with the same strides (and the
    strides and degraded list are the batch's)."""
    batches, ids, uncapped = case
    batches = list(batches)
    budgeted = ["drop", "mix_4", "count", "fan_in"]
    subs = split_topics(batches[0], TOPICS)["subscriptions"]
    values = []
    for v in subs.column("value").to_pylist():
        doc = json.loads(v)
        if doc["id"] in {ids[n] for n in budgeted}:
            doc["staleness_budget_ms"] = 4_000
        values.append(json.dumps(doc).encode())
    subs = subs.set_column(subs.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    rest = batches[0].filter(pc.not_equal(batches[0].column("topic"), "subscriptions"))
    batches[0] = pa.concat_tables([subs, rest.cast(subs.schema)])
    plan = [{}, {ids["drop"]: 2}, {ids["drop"]: 4, ids["mix_4"]: 2}, {ids["drop"]: 4, ids["fan_in"]: 4}]
    strides = [plan[b % len(plan)] for b in range(len(batches))]
    single = _single(batches, _settings(), strides)
    assert [alert_rows(o.alerts) for o in single] != [alert_rows(o.alerts) for o in uncapped]  # they bite
    assert single[2].degraded[ids["mix_4"]] == {"every_ms": 2_000, "budget_ms": 4_000}
    for n in (2, 3):
        sharded = _sharded(batches, _settings(), n, strides=strides)
        assert [alert_rows(o.alerts) for o in sharded] == [alert_rows(o.alerts) for o in single]
        assert [(o.strides, o.degraded) for o in sharded] == [(o.strides, o.degraded) for o in single]


@pytest.mark.parametrize("n", [2, 3])
def test_each_chart_request_is_answered_by_the_shard_owning_its_key_as_one_core(case: Any, n: int) -> None:
    """The key page's charts with shards (engine.shards.charts): each request answered by exactly
    one shard, the one owning its key, with the series one core gives -- trades and packets
    rules, a key grouped by the second key field (dst_ip), a key never seen, a rule unknown."""
    batches, ids, single_outs = case
    one: list[EngineCore] = []
    shards: list[EngineCore] = []
    _single(batches, _settings(), keep=one)
    _sharded(batches, _settings(), n, keep=shards)
    by_rule: dict[str, list[str]] = {}
    for o in single_outs:
        for a in o.alerts:
            by_rule.setdefault(a.subscription_id, []).append(a.key)
    wanted = [
        (ids[r], k)
        for r in ("count", "scan", "fan_in", "rows", "ago")
        for k in sorted(set(by_rule[ids[r]]))[:3]
    ]
    wanted += [(ids["count"], "NO-SUCH-KEY"), ("00000000-0000-0000-0000-00000000beef", "S1")]
    requests = [(i, sid, key) for i, (sid, key) in enumerate(wanted)]
    answers = [answer_owned(c, shard, n, requests, 1000) for shard, c in enumerate(shards)]
    assert sorted(r for a in answers for r in a) == [r for r, _, _ in requests]  # each once
    points = 0
    for rid, sid, key in requests:
        want_answer, want_error = compute_answer(one[0], sid, key, 1000)
        ((got_answer, got_error),) = [a[rid] for a in answers if rid in a]
        assert shard_of([key], n)[0] == next(i for i, a in enumerate(answers) if rid in a)
        assert got_error == want_error
        if want_answer is not None:
            assert got_answer is not None
            got_answer.pop("compute_ms"), want_answer.pop("compute_ms")
            # ``held_from`` is a bound from the retained units (the oldest holding the key; the
            # newest when none does): a shard's units hold its keys' events only, so for a key it
            # holds its bound is the same or later -- more conservative, never less: what it marks
            # partial includes what one core marks; for a key it never saw, the newest event the
            # shard holds (every event of the key was routed to it: none is held anywhere)
            got_from, want_from = got_answer.pop("held_from"), want_answer.pop("held_from")
            seen = key != "NO-SUCH-KEY"
            assert got_from is not None and want_from is not None and (got_from >= want_from or not seen)
            for g, w in zip(got_answer["aggregates"], want_answer["aggregates"], strict=True):
                gp, wp = g.pop("partial", []), w.pop("partial", [])
                assert not seen or all(x or not y for x, y in zip(gp, wp, strict=True)), (sid, key)
            assert got_answer == want_answer, (sid, key)
            points += sum(v is not None for a in got_answer["aggregates"] for v in a.get("values", []))
    assert points > 50 and answers[0] and answers[1]


def test_shard_rebuilt_from_its_snapshot_goes_on_the_same(case: Any) -> None:
    batches, _, single = case
    sharded = _sharded(batches, _settings(), 2, restore_at=7)
    assert [alert_rows(o.alerts) for o in sharded] == [alert_rows(o.alerts) for o in single]


def test_routing_sends_each_key_to_one_shard_and_rules_to_all() -> None:
    batches, _ = scenario_batches()
    tables, span = route_records(batches[0], TOPICS, 3, MAX_FUTURE)
    assert len(tables) == 3
    subs = [t.filter(pa.compute.equal(t.column("topic"), "subscriptions")).num_rows for t in tables]
    assert subs[0] > 0 and len(set(subs)) == 1  # every rule change reaches every shard
    for s, t in enumerate(tables):
        trades = split_topics(t, TOPICS)["trades"]
        keys = trades.column("key").to_pylist()
        good = [
            k.decode() for k, v in zip(keys, trades.column("value").to_pylist(), strict=True) if k != b"S0"
        ]
        assert all(o == s for o in shard_of(good, 3))
    assert span.num_rows >= 2 and set(span.column("stream").to_pylist()) <= {"trades", "packets"}


def test_shard_of_is_stable() -> None:
    # the owner of a key never depends on the process (CRC-32, not Python's salted hash)
    assert shard_of(["S0", "S1", "10.0.0.1"], 4).tolist() == [
        __import__("zlib").crc32(k.encode()) % 4 for k in ["S0", "S1", "10.0.0.1"]
    ]
    assert shard_of([], 4).tolist() == [] and shard_of(["x"], 1).tolist() == [0]


def test_router_rows_carry_each_shards_records_the_span_and_the_offsets() -> None:
    import json

    from engine.shards.route import ROUTED_SCHEMA, Router, ipc_table, merge_ranges
    from engine.sources.readers import offset_ranges

    batches, _ = scenario_batches()
    tbl = batches[1]
    out = list(Router(TOPICS, [7, 3], MAX_FUTURE)(tbl.to_batches(max_chunksize=300)))
    assert len(out) == 1 and out[0].schema == ROUTED_SCHEMA
    rows = out[0].to_pylist()
    assert [r["shard"] for r in rows] == [7, 3]  # the labels, in shard order
    tables, span = route_records(tbl, TOPICS, 2, MAX_FUTURE)
    for r, t in zip(rows, tables, strict=True):
        assert ipc_table(r["records"]).equals(t)
        assert ipc_table(r["span"]).equals(span)
        assert merge_ranges([json.loads(r["ranges"])]) == offset_ranges(tbl)
    assert merge_ranges([{"t": {"0": [5, 9]}}, {"t": {"0": [1, 4], "1": [0, 0]}}]) == {
        "t": {"0": [1, 9], "1": [0, 0]}
    }


def test_a_partition_marked_present_holds_the_watermark_for_its_first_events() -> None:
    """A Kafka transaction's partitions become readable one by one: a batch with the first events
    of one partition while another holds records not yet readable must not make the second's
    events late -- the Router marks it present, the shard's core treats it as waiting."""
    import zlib

    from engine.shards.route import PRESENT
    from tests.engine.shards.support import _table, sub_record
    from tests.engine.support import make_scenario
    from tidewatch.wire.avro import encode_batch

    sc = make_scenario(n_packets=1)
    t = sc.trades
    values = encode_batch("trades", t).messages()
    rows: list[list[tuple[str, int, int, int, bytes, bytes]]] = [[], []]
    for i, (sym, ts) in enumerate(zip(t["symbol"], t["ts"], strict=True)):
        p = zlib.crc32(str(sym).encode()) % 2
        rows[p].append(("trades", p, len(rows[p]), int(ts), str(sym).encode(), values[i]))
    k, v = sub_record("00000000-0000-0000-0000-000000000001", "count", RULE_COUNT)
    first = _table([("subscriptions", 0, 0, int(t["ts"][0]), k, v), *rows[0]])
    late = {}
    for marked in (False, True):
        core = default_core(_settings())
        recs, span_t = route_records(first, TOPICS, 1, MAX_FUTURE)
        span = merge_spans([span_t])
        if marked:
            span[("trades", 1)] = (PRESENT, PRESENT)
        run_shard(core, 0, 0, 1, recs[0], span, TOPICS)
        recs, span_t = route_records(_table(rows[1]), TOPICS, 1, MAX_FUTURE)
        out = run_shard(core, 1, 0, 1, recs[0], merge_spans([span_t]), TOPICS)
        late[marked] = sum(r == "late" for r in out.dead.reason)
    assert late[False] > 100 and late[True] == 0, late


def test_merge_spans_keeps_event_times_over_present_marks() -> None:
    from engine.shards.route import PRESENT, SPAN_SCHEMA, split_span

    def tbl(rows: list[tuple[str, int, int, int]]) -> pa.Table:
        return pa.table(
            {c: [r[i] for r in rows] for i, c in enumerate(SPAN_SCHEMA.names)}, schema=SPAN_SCHEMA
        )

    a = tbl([("trades", 0, 5, 9), ("trades", 1, PRESENT, PRESENT), ("packets", 0, PRESENT, PRESENT)])
    b = tbl([("trades", 1, 3, 4), ("trades", 0, 1, 7), ("packets", 0, PRESENT, PRESENT)])
    span = merge_spans([a, b])
    assert span == {("trades", 0): (1, 9), ("trades", 1): (3, 4), ("packets", 0): (PRESENT, PRESENT)}
    assert merge_spans([b, a]) == span
    assert split_span(span) == ({("trades", 0): (1, 9), ("trades", 1): (3, 4)}, [("packets", 0)])


RULE_COUNT = "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 10 SECONDS > 12"
