"""engine.core: batch logic (time, lookups, alerts, PSoup rule changes, snapshots) with a brute-force evaluator."""

from __future__ import annotations

from typing import cast

import numpy as np
import pyarrow as pa

from engine.core import EngineCore
from engine.evaluation.rules import Changes
from engine.messages import Alert, SubscriptionChange, parse_subscription_change
from engine.runtime.state_codec import allow
from tidewatch.wire.avro import encode_batch

G = 1000


@allow  # a test's evaluator: allowed in snapshots besides the engine's own classes
class BruteCount:
    """Evaluator stand-in (``engine.rule_evaluator.RuleEvaluator``): rule 'COUNT(*) OVER LAST T > k', kept
    as raw events (brute force)."""

    def __init__(self) -> None:
        self.rules: dict[str, tuple[int, int]] = {}
        self.keys: list[str] = []
        self.ts: list[int] = []
        self.prev: dict[str, set[str]] = {}  # each rule's result at its last step

    def add_rule(self, name: str, plan: tuple[int, int]) -> None:
        self.rules[name] = plan

    def remove_rule(self, name: str) -> None:
        del self.rules[name]
        self.prev.pop(name, None)

    def apply(self, stream: str, batch: dict[str, np.ndarray]) -> None:
        assert np.all(np.diff(batch["ts"]) >= 0)
        assert not self.ts or batch["ts"].min() > max(self.ts) - 10**9
        self.keys += list(batch["symbol"])
        self.ts += batch["ts"].tolist()

    def lookup(self, now: int) -> dict[str, set[str]]:
        return {name: brute(self.keys, self.ts, now, T, k) for name, (T, k) in self.rules.items()}

    def step(self, now: int) -> Changes:
        """Every rule's changes since its previous step (a new rule's: from an empty result)."""
        changes = Changes(now)
        for name, cur in self.lookup(now).items():
            old = self.prev.get(name, set())
            for keys, kind in ((sorted(cur - old), "ENTER"), (sorted(old - cur), "EXIT")):
                changes.add(np.full(len(keys), name, dtype=object), np.array(keys, dtype=object), kind)
            self.prev[name] = cur
        return changes

    def evaluate_now(self, name: str, now: int) -> set[str]:
        T, k = self.rules[name]
        return brute(self.keys, self.ts, now, T, k)

    def current_ids(self, name: str) -> list[str]:
        return sorted(self.prev.get(name, set()))

    def values(self, name: str, keys: object, now: int) -> dict[str, dict[str, float | int | str | None]]:
        return {}  # no values: the alerts carry none

    def values_many(
        self, wanted: dict[str, list[str]], now: int
    ) -> dict[str, dict[str, dict[str, float | int | str | None]]]:
        return {name: {} for name in wanted}

    @property
    def nbytes(self) -> int:
        return 0


def brute(keys: list[str], ts: list[int], now: int, T: int, k: int) -> set[str]:
    counts: dict[str, int] = {}
    for key, t in zip(keys, ts, strict=True):
        if now - T < t <= now:
            counts[key] = counts.get(key, 0) + 1
    return {key for key, c in counts.items() if c > k}


def compile_rule(text: str, plan: object) -> tuple[tuple[int, int], str]:
    T, k = (int(x) for x in text.split())
    return (T, k), "trades"


def make_core() -> EngineCore:
    return EngineCore(
        pane_ms=G,
        allowed_lateness_ms=2 * G,
        max_future_ms=10**12,
        evaluator_factory=BruteCount,
        compile_rule=compile_rule,
    )


def records(symbols: list[str], ts: list[int], offset0: int) -> dict[str, pa.Table]:
    n = len(ts)
    vals = encode_batch(
        "trades",
        {
            "symbol": symbols,
            "ts": np.array(ts, np.int64),
            "price": np.ones(n),
            "size": np.ones(n, np.int64),
            "side": ["BID"] * n,
            "exchange": ["X"] * n,
        },
    ).messages()
    return {
        "trades": pa.table(
            {
                "partition": pa.array([0] * n, pa.int32()),
                "offset": pa.array(np.arange(offset0, offset0 + n, dtype=np.int64)),
                "value": pa.array(vals, pa.binary()),
            }
        )
    }


def stream(seed: int, n_batches: int = 12, per: int = 40) -> list[tuple[list[str], list[int]]]:
    rng = np.random.default_rng(seed)
    out, t = [], 10 * G
    for _ in range(n_batches):
        ts = np.sort(t + rng.integers(0, 3 * G, per))
        ts = ts + rng.integers(-1500, 0, per)  # a bit of disorder, within the lateness mostly
        out.append(([f"K{int(i)}" for i in rng.integers(0, 5, per)], ts.tolist()))
        t += 2 * G
    return out


def test_alerts_equal_brute_force_backtest() -> None:
    core = make_core()
    rule = SubscriptionChange("s1", "upsert", "busy", f"{3 * G} 4")
    batches = stream(1)
    alerts, off = [], 0
    for b, (syms, ts) in enumerate(batches):
        out = core.process(b, records(syms, ts, off), [rule] if b == 0 else [])
        off += len(ts)
        alerts += out.alerts
        late = set(zip(out.dead.source_offset, out.dead.reason, strict=True))
        assert all(r == "late" for _, r in late)
    ev = core.evaluator
    assert isinstance(ev, BruteCount) and core.applied_until is not None
    # the same events, the same lookup times, brute force from scratch
    lookups = range(alerts[0].as_of if alerts else 0, core.applied_until + 1, G)
    expect: list[tuple[str, str, int]] = []
    prev: set[str] = set()
    for tau in lookups:
        cur = brute(ev.keys, ev.ts, tau, 3 * G, 4)
        expect += [("ENTER", k, tau) for k in sorted(cur - prev)] + [
            ("EXIT", k, tau) for k in sorted(prev - cur)
        ]
        prev = cur
    assert [(a.kind, a.key, a.as_of) for a in alerts] == expect
    assert len({a.id for a in alerts}) == len(alerts)
    assert core.applied_until == ((max(max(ts) for _, ts in batches) - 2 * G) // G) * G


class TableFails(BruteCount):
    """An evaluator whose one-pass values fail (``value_table`` raises): the core asks rule by
    rule (``values``), and every alert still goes out."""

    def value_table(self, wanted: dict[str, list[str]], now: int) -> object:
        raise RuntimeError("no table this time")

    def values(self, name: str, keys: object, now: int) -> dict[str, dict[str, float | int | str | None]]:
        return {k: {"n": len(k)} for k in cast("list[str]", keys)}


def test_values_that_fail_in_one_pass_are_read_rule_by_rule_and_no_alert_is_lost() -> None:
    rule = SubscriptionChange("s1", "upsert", "busy", f"{3 * G} 4")
    got: dict[str, list[Alert]] = {}
    for name, factory in (("brute", BruteCount), ("fails", TableFails)):
        core = EngineCore(
            pane_ms=G, allowed_lateness_ms=2 * G, max_future_ms=10**12,
            evaluator_factory=factory, compile_rule=compile_rule,
        )  # fmt: skip
        got[name], off = [], 0
        for b, (syms, ts) in enumerate(stream(1)):
            got[name] += core.process(b, records(syms, ts, off), [rule] if b == 0 else []).alerts
            off += len(ts)
    assert got["fails"] and got["fails"] == got["brute"]
    assert all(a.values == {"n": len(a.key)} for a in got["fails"])


def test_late_events_are_dead_lettered_and_never_applied() -> None:
    core = make_core()
    core.process(0, records(["A"] * 3, [10_000, 11_000, 15_500], 0), [])
    assert core.applied_until == 13_000
    out = core.process(1, records(["A", "A"], [12_999, 13_001], 3), [])
    assert out.dead.counts()["late"] == 1 and out.dead.source_offset == [3]
    assert out.events["trades"] == 1


def test_new_rule_gets_results_at_once_from_old_data() -> None:
    core = make_core()
    core.process(
        0, records(["A"] * 6 + ["B"], [10_100, 10_200, 10_300, 10_400, 10_500, 10_600, 10_700], 0), []
    )
    core.process(1, records(["C"], [14_000], 7), [])
    assert core.applied_until == 12_000
    out = core.process(2, records([], [], 8), [SubscriptionChange("s", "upsert", "n", f"{5 * G} 3")])
    assert [(a.key, a.kind, a.as_of) for a in out.alerts] == [("A", "ENTER", 12_000)]
    out = core.process(3, records([], [], 8), [SubscriptionChange("s", "delete")])
    assert out.removed == ["s"] and not core.rules


def test_a_changed_rule_alerts_the_difference_of_its_results() -> None:
    """A new version of a subscription is diffed with its old result: EXIT for the keys it
    drops, ENTER for the keys it adds, nothing for the keys of both (none is left behind in
    the current results, none alerted twice)."""
    core = make_core()
    syms = ["A"] * 6 + ["B"] * 4 + ["C"] * 2
    core.process(0, records(syms, [10_100 + 50 * i for i in range(len(syms))], 0), [])
    core.process(1, records(["D"], [14_000], len(syms)), [])
    out = core.process(
        2, records([], [], 13), [SubscriptionChange("s", "upsert", "n", f"{5 * G} 3", version=1)]
    )
    assert [(a.key, a.kind) for a in out.alerts] == [("A", "ENTER"), ("B", "ENTER")]
    out = core.process(
        3, records([], [], 13), [SubscriptionChange("s", "upsert", "n", f"{5 * G} 1", version=2)]
    )
    assert [(a.key, a.kind) for a in out.alerts] == [("C", "ENTER")] and not out.removed
    assert core.current["s"] == {"A", "B", "C"}
    out = core.process(
        4, records([], [], 13), [SubscriptionChange("s", "upsert", "n", f"{5 * G} 5", version=3)]
    )
    assert [(a.key, a.kind) for a in out.alerts] == [("B", "EXIT"), ("C", "EXIT")]
    assert core.current["s"] == {"A"}


def test_a_removed_subscription_names_the_keys_its_result_had() -> None:
    """Deleted or paused: ``removed`` and ``removed_keys`` (its result then: the tombstones of the
    ``results`` topic).  A changed rule is not removed (it is diffed); a subscription deleted and
    subscribed again in one batch stays removed, with the keys of before, and its new version's
    result is alerted from empty."""
    core = make_core()
    syms = ["A"] * 6 + ["B"] * 4 + ["C"] * 2
    core.process(0, records(syms, [10_100 + 50 * i for i in range(len(syms))], 0), [])
    core.process(1, records(["D"], [14_000], len(syms)), [])
    up = lambda v, n: SubscriptionChange("s", "upsert", "n", f"{5 * G} {n}", version=v)  # noqa: E731
    core.process(2, records([], [], 13), [up(1, 3)])
    assert core.current["s"] == {"A", "B"}
    out = core.process(3, records([], [], 13), [up(2, 1)])
    assert not out.removed and not out.removed_keys
    out = core.process(4, records([], [], 13), [SubscriptionChange("s", "pause", version=3)])
    assert out.removed == ["s"] and out.removed_keys == {"s": ["A", "B", "C"]} and not out.alerts
    out = core.process(5, records([], [], 13), [up(4, 5)])
    assert not out.removed and [(a.key, a.kind) for a in out.alerts] == [("A", "ENTER")]
    # deleted, then subscribed again, then changed, all in one batch
    out = core.process(
        6, records([], [], 13), [SubscriptionChange("s", "delete", version=5), up(6, 3), up(7, 1)]
    )
    assert out.removed == ["s"] and out.removed_keys == {"s": ["A"]}
    assert [(a.key, a.kind) for a in out.alerts] == [("A", "ENTER"), ("B", "ENTER"), ("C", "ENTER")]
    assert core.current["s"] == {"A", "B", "C"}


def test_snapshot_restore_then_continue_equals_uninterrupted() -> None:
    batches = stream(7)
    rule = SubscriptionChange("s1", "upsert", "busy", f"{4 * G} 5")

    def run(core: EngineCore, lo: int, hi: int) -> list[str]:
        ids = []
        for b in range(lo, hi):
            syms, ts = batches[b]
            ids += [
                a.id for a in core.process(b, records(syms, ts, 1000 * b), [rule] if b == 0 else []).alerts
            ]
        return ids

    whole = run(make_core(), 0, len(batches))
    core = make_core()
    first = run(core, 0, 5)
    restored = EngineCore.from_bytes(core.to_bytes(), compile_rule=compile_rule)
    assert restored.last_batch == 4 and restored.applied_until == core.applied_until
    assert first + run(restored, 5, len(batches)) == whole


def test_parse_subscription_change() -> None:
    c = parse_subscription_change(b"7", b'{"id": 7, "name": "x", "rule": "SELECT ...", "status": "active"}')
    assert (c.subscription_id, c.op, c.text) == ("7", "upsert", "SELECT ...")
    assert parse_subscription_change(b"7", None).op == "delete"
    assert parse_subscription_change(b"7", b'{"id": "7", "status": "paused"}').op == "pause"


def test_subscription_versions_and_outbox_message() -> None:
    msg = (
        b'{"subscription_id": "u1", "name": "n", "rule_text": "3000 1", "rule": "3000 1", "op": "upsert",'
        b' "status": "active", "version": 2}'
    )
    c = parse_subscription_change(b"u1", msg)
    assert (c.op, c.version, c.text) == ("upsert", 2, "3000 1")
    core = make_core()
    out = core.process(0, records([], [], 0), [c])
    assert "u1" in core.rules and not out.rule_errors
    old = SubscriptionChange("u1", "delete", version=1)  # a replay of an older change: ignored
    core.process(1, records([], [], 0), [old])
    assert "u1" in core.rules
    core.process(2, records([], [], 0), [SubscriptionChange("u1", "pause", version=3)])
    assert "u1" not in core.rules


def test_bad_rule_is_reported_not_fatal() -> None:
    core = make_core()
    out = core.process(0, records([], [], 0), [SubscriptionChange("x", "upsert", "x", "not a rule")])
    assert out.rule_errors and out.rule_errors[0][0] == "x" and not core.rules


def records_on(parts: list[tuple[int, list[str], list[int], int]]) -> dict[str, pa.Table]:
    """Trades on several Kafka partitions: (partition, symbols, ts, first offset) each."""
    tables = []
    for part, syms, ts, off in parts:
        t = records(syms, ts, off)["trades"]
        tables.append(t.set_column(0, "partition", pa.array([part] * len(ts), pa.int32())))
    return {"trades": pa.concat_tables(tables)}


def test_lagging_partition_holds_the_watermark_back_instead_of_going_late() -> None:
    """Backlog drain: partition 1 is far behind partition 0 but delivers records in every batch."""
    core = make_core()  # lateness 2 s, idle timeout 5 s
    core.process(0, records_on([(0, ["A"] * 2, [100_000, 101_000], 0), (1, ["B"], [10_000], 0)]), [])
    assert core.watermark == 10_000 - 2 * G  # the lagging partition decides
    out = core.process(1, records_on([(0, ["A"], [102_000], 2), (1, ["B"] * 2, [20_000, 30_000], 1)]), [])
    assert out.dead.counts()["late"] == 0 and out.events["trades"] == 3
    assert core.watermark == 30_000 - 2 * G and core.applied_until == 28_000
    # the global-max watermark would have made partition 1's events late (ts <= 99,000)
    assert core.max_ts == 102_000


def test_idle_partition_stops_holding_the_watermark_back() -> None:
    core = make_core()
    core.process(0, records_on([(0, ["A"], [10_000], 0), (1, ["B"], [10_500], 0)]), [])
    assert core.watermark == 10_000 - 2 * G
    # partition 0 goes quiet; partition 1 moves on: within the idle timeout it still holds
    core.process(1, records_on([(1, ["B"], [14_000], 1)]), [])
    assert core.watermark == 10_000 - 2 * G
    # more than 5 s (idle timeout) ahead of partition 0: partition 0 is idle
    core.process(2, records_on([(1, ["B"], [15_500], 2)]), [])
    assert core.watermark == 15_500 - 2 * G
    # partition 0 comes back: the watermark never goes back; its record behind it is late
    out = core.process(3, records_on([(0, ["A", "A"], [12_000, 16_000], 1)]), [])
    assert core.watermark == 15_500 - 2 * G
    assert out.dead.counts()["late"] == 1 and out.dead.source_offset == [1]


def test_watermark_state_survives_a_snapshot() -> None:
    core = make_core()
    core.process(0, records_on([(0, ["A"], [50_000], 0), (1, ["B"], [20_000], 0)]), [])
    restored = EngineCore.from_bytes(core.to_bytes(), compile_rule=compile_rule)
    assert restored.part_max == core.part_max and restored.watermark == core.watermark == 18_000
    for c in (core, restored):
        c.process(1, records_on([(1, ["B"], [30_000], 1)]), [])
    assert restored.watermark == core.watermark == 28_000


def test_a_snapshot_this_engine_cannot_read_is_refused_by_type() -> None:
    """A snapshot naming a class that has moved (the evaluator of an older layout), a damaged
    file and a snapshot of another format all raise SnapshotUnreadable, so the engine replays the
    committed batches from Kafka instead of failing to start."""
    import pickle

    import pytest

    from engine.errors import SnapshotUnreadable
    from tests.engine.runtime.snapshots import rewrite

    good = make_core().to_bytes()
    moved = rewrite(
        good, lambda doc: doc.replace("tests.engine.test_core:BruteCount", "engine.gone:BruteCount")
    )
    older = pickle.dumps({"version": 1, "g": G})  # the pickled layout before the state codec
    for data in (moved, good[: len(good) // 2], older):
        with pytest.raises(SnapshotUnreadable):
            EngineCore.from_bytes(data, compile_rule=compile_rule)
    assert EngineCore.from_bytes(good, compile_rule=compile_rule).last_batch == -1
