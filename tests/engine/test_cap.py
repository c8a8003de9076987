"""engine.cap: the per-subscription cap on alerts per lookup (``engine_alert_cap_per_lookup``):
which alerts are kept, the CAPPED record, the withheld list, the result changes the sinks get,
and the core with the cap off (unchanged), on (lookups and a new rule's whole result) and across
a snapshot."""

from __future__ import annotations

from engine.cap import CAPPED, cap_alerts, republished_results
from engine.core import EngineCore
from engine.messages import Alert, BatchOutput, SubscriptionChange
from tests.engine.test_core import G, compile_rule, make_core, records, stream


def _a(sid: str, key: str, kind: str = "ENTER", tau: int = 5) -> Alert:
    return Alert(sid, f"rule {sid}", "trades", key, kind, tau, {"v": 1})


def core(cap: int = 0) -> EngineCore:
    """test_core's core with the alert cap ``cap`` (a setting: ``EngineCore(alert_cap=...)``)."""
    c = make_core()
    c.alert_cap = cap
    return c


def test_the_first_cap_alerts_are_kept_and_one_capped_record_says_the_rest() -> None:
    out = BatchOutput(0, alerts=[_a("x", "k0")])
    seg = [_a("s", f"k{i}", "ENTER" if i < 3 else "EXIT") for i in range(5)] + [_a("t", "k9")]
    out.alerts += seg
    cap_alerts(out, 1, 2)
    assert [(a.subscription_id, a.key, a.kind) for a in out.alerts] == [
        ("x", "k0", "ENTER"), ("s", "k0", "ENTER"), ("s", "k1", "ENTER"), ("s", "", CAPPED), ("t", "k9", "ENTER"),
    ]  # fmt: skip
    capped = out.alerts[3]
    assert capped.values == {"withheld": 3, "withheld_enter": 1, "withheld_exit": 2, "cap": 2}
    assert capped.id == "s||CAPPED|5" and capped.rule_name == "rule s" and capped.as_of == 5
    assert out.withheld == seg[2:5] and out.withheld[0].values == {"v": 1}
    # every change, in an order where each (subscription, key)'s last change is last; no CAPPED
    assert sorted(a.id for a in out.result_changes()) == sorted(a.id for a in [out.alerts[0], *seg])
    assert all(a.kind != CAPPED for a in out.result_changes())


def test_a_subscription_changed_twice_at_one_time_shares_one_cap_and_one_record() -> None:
    out = BatchOutput(0, alerts=[_a("s", "a"), _a("s", "b")])
    cap_alerts(out, 0, 3)
    assert len(out.alerts) == 2 and not out.withheld
    first = len(out.alerts)
    out.alerts += [_a("s", "c"), _a("s", "d", "EXIT"), _a("s", "a", "EXIT")]
    cap_alerts(out, first, 3)
    assert [a.key for a in out.alerts] == ["a", "b", "c", ""]
    first = len(out.alerts)
    out.alerts += [_a("s", "e")]
    cap_alerts(out, first, 3)
    assert [a.key for a in out.alerts] == ["a", "b", "c", ""]
    assert out.alerts[3].values == {"withheld": 3, "withheld_enter": 1, "withheld_exit": 2, "cap": 3}
    assert [a.key for a in out.withheld] == ["d", "a", "e"]
    # a's ENTER (kept) comes before its EXIT (withheld) in the result changes
    assert [(a.key, a.kind) for a in out.result_changes() if a.key == "a"] == [("a", "ENTER"), ("a", "EXIT")]


def test_cap_off_or_never_reached_changes_nothing() -> None:
    outs = {}
    for cap in (0, 10_000):
        c = core(cap)
        got, off = [], 0
        for b, (syms, ts) in enumerate(stream(3)):
            rules = [SubscriptionChange("s1", "upsert", "busy", f"{3 * G} 2")] if b == 0 else []
            o = c.process(b, records(syms, ts, off), rules)
            off += len(ts)
            assert not o.withheld and o.result_changes() is o.alerts
            got += o.alerts
        outs[cap] = got
    assert outs[0] == outs[10_000] and outs[0]


def test_capped_lookups_keep_the_first_alerts_and_every_change_for_the_results() -> None:
    """The same batches with cap 1 and without: the capped run's alert log is, per (subscription,
    lookup time), the first alert of the uncapped one plus a CAPPED record counting the rest; its
    result changes are the uncapped alerts; the core's current results are the same."""
    runs: dict[int, tuple[list[Alert], list[Alert], EngineCore]] = {}
    for cap in (0, 1):
        c = core(cap)
        alerts: list[Alert] = []
        changes: list[Alert] = []
        off = 0
        for b, (syms, ts) in enumerate(stream(5, per=60)):
            rules = [SubscriptionChange(s, "upsert", s, f"{3 * G} {k}") for s, k in (("s1", 1), ("s2", 3))]
            o = c.process(b, records(syms, ts, off), rules if b == 0 else [])
            off += len(ts)
            alerts += o.alerts
            changes += o.result_changes()
        runs[cap] = alerts, changes, c
    full, _, c0 = runs[0]
    capped, changes, c1 = runs[1]
    assert c0.current == c1.current
    assert sorted(a.id for a in changes) == sorted(a.id for a in full)
    groups: dict[tuple[str, int], list[Alert]] = {}
    for a in full:
        groups.setdefault((a.subscription_id, a.as_of), []).append(a)
    expect: list[Alert] = []
    for (sid, tau), grp in groups.items():
        expect.append(grp[0])
        if len(grp) > 1:
            n_enter = sum(a.kind == "ENTER" for a in grp[1:])
            rec = Alert(sid, sid, "trades", "", CAPPED, tau)
            expect.append(rec)
            assert next(a for a in capped if a.id == rec.id).values == {
                "withheld": len(grp) - 1, "withheld_enter": n_enter, "withheld_exit": len(grp) - 1 - n_enter, "cap": 1,
            }  # fmt: skip
    assert sorted(a.id for a in capped) == sorted(a.id for a in expect)
    assert any(a.kind == CAPPED for a in capped)


def test_a_new_rule_with_a_big_result_is_capped() -> None:
    """PSoup: a rule subscribed later has its whole result diffed at once (the classic storm)."""
    c = core(2)
    syms = [f"K{i}" for i in range(6) for _ in range(3)]
    c.process(0, records(syms, [10_100 + 10 * i for i in range(len(syms))], 0), [])
    c.process(1, records(["Z"], [14_000], len(syms)), [])
    out = c.process(2, records([], [], 19), [SubscriptionChange("s", "upsert", "n", f"{5 * G} 1")])
    assert [(a.key, a.kind) for a in out.alerts] == [("K0", "ENTER"), ("K1", "ENTER"), ("", CAPPED)]
    assert out.alerts[2].values == {"withheld": 4, "withheld_enter": 4, "withheld_exit": 0, "cap": 2}
    assert [a.key for a in out.withheld] == ["K2", "K3", "K4", "K5"]
    assert c.current["s"] == {f"K{i}" for i in range(6)}


def test_the_cap_is_a_setting_the_snapshot_does_not_decide() -> None:
    c = core(2)
    c.process(0, records(["A"], [10_000], 0), [])
    again = EngineCore.from_bytes(c.to_bytes(), compile_rule, alert_cap=7)
    assert again.alert_cap == 7
    assert EngineCore.from_bytes(c.to_bytes(), compile_rule).alert_cap == 0


def test_republished_results_come_from_current_results_for_the_withheld_keys() -> None:
    rows = [
        {"id": "s|a|ENTER|5", "subscription_id": "s", "key": "a", "kind": "ENTER", "as_of": 5, "values": {"v": 1}},
        {"id": "s||CAPPED|5", "subscription_id": "s", "key": "", "kind": CAPPED, "as_of": 5, "values": {"cap": 1}},
    ]  # fmt: skip
    assert republished_results(rows, {}, {}) is None
    got = republished_results(rows, {"s": ["b", "c"]}, {("s", "b"): (4, {"v": 2})})
    assert got is not None
    assert [(r["key"], r["kind"], r["as_of"], r["values"]) for r in got] == [
        ("a", "ENTER", 5, {"v": 1}), ("b", "ENTER", 4, {"v": 2}), ("c", "EXIT", 5, {}),
    ]  # fmt: skip
