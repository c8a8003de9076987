"""``Evaluator.step(now, skip)``: each rule looked up only at its own schedule of lookup times gives
exactly the brute force's changes at those times (the overload policy's contract, engine/overload.py).

The reference is test_property's brute force (written from RULES.md alone), looked up per rule at
that rule's times only and diffed against that rule's own previous lookup.  Schedules are random
bit masks over the lookup times, so groups are looked up whole, partly skipped (the skipped
members' pairs carried over) and skipped whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.evaluation.backtest import EventFile, iter_alerts
from engine.evaluation.evaluator import Evaluator
from engine.evaluation.scan import ScanEvaluator
from subscriptions.compiler import compile_rule
from tests.engine.evaluation.test_property import (
    Reference,
    extra_atoms,
    packet_events,
    rules,
    to_file,
    trade_events,
)
from tidewatch.settings import get_settings

Skip = Callable[[int], frozenset[str]]


def lookup_taus(events: dict[str, list[dict[str, Any]]], every: int) -> list[int]:
    all_ts = [e["ts"] for evs in events.values() for e in evs]
    if not all_ts:
        return []
    taus = [min(all_ts) // every * every]
    while taus[-1] < max(all_ts):
        taus.append(taus[-1] + every)
    return taus


def masks_schedule(names: list[str], masks: list[int], taus: list[int]) -> Skip:
    """Rule ``names[i]`` skipped at the ``j``-th lookup time when bit ``j`` of ``masks[i]`` is set."""
    index = {tau: j for j, tau in enumerate(taus)}

    def skip(tau: int) -> frozenset[str]:
        j = index[tau]
        return frozenset(n for n, m in zip(names, masks, strict=True) if m >> j & 1)

    return skip


def reference_scheduled(
    rules_: list[tuple[str, str]], events: dict[str, list[dict[str, Any]]], every: int, skip: Skip
) -> list[tuple[int, str, str, str]]:
    """Brute force: each rule looked up at the lookup times ``skip`` leaves it, its changes since
    its own previous lookup."""
    refs = [(name, Reference(text)) for name, text in rules_]
    prev: dict[str, set[str]] = {name: set() for name, _ in rules_}
    out: list[tuple[int, str, str, str]] = []
    for tau in lookup_taus(events, every):
        off = skip(tau)
        rows = []
        for name, ref in refs:
            if name in off:
                continue
            cur = ref.result(events[ref.rule.stream], tau)
            rows += [(tau, name, k, "ENTER") for k in cur - prev[name]]
            rows += [(tau, name, k, "EXIT") for k in prev[name] - cur]
            prev[name] = cur
        out += sorted(rows, key=lambda r: (r[1], r[2]))
    return out


def run(
    ev: Any, rules_: list[tuple[str, str]], files: list[EventFile], every: int, skip: Skip
) -> list[tuple]:
    plans = [(n, t, compile_rule(t, get_settings())) for n, t in rules_]
    return list(iter_alerts(plans, files, every, evaluator=ev, skip=skip))


MASKS = st.integers(0, 2**40 - 1)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    rule_texts=st.lists(rules(), min_size=1, max_size=4),
    masks=st.lists(MASKS, min_size=4, max_size=4),
    trades=trade_events(),
    packets=packet_events(),
    every=st.sampled_from([500, 1000]),
    p=st.sampled_from([1, 2, 8]),
)
def test_scheduled_lookups_equal_brute_force(
    rule_texts: list[str],
    masks: list[int],
    trades: list[dict[str, Any]],
    packets: list[dict[str, Any]],
    every: int,
    p: int,
) -> None:
    named = [(f"r{i}", t) for i, t in enumerate(rule_texts)]
    events = {"trades": trades, "packets": packets}
    skip = masks_schedule([n for n, _ in named], masks[: len(named)], lookup_taus(events, every))
    files = [to_file("trades", trades), to_file("packets", packets)]
    expect = reference_scheduled(named, events, every, skip)
    assert run(Evaluator("shared", ci_p=p), named, files, every, skip) == expect
    assert run(Evaluator("naive", ci_p=p), named, files, every, skip) == expect
    assert run(ScanEvaluator(ci_p=p), named, files, every, skip) == expect


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    thresholds=st.lists(st.sampled_from([0, 1, 2, 3, 6, 15, 40]), min_size=2, max_size=8),
    extras=st.lists(st.lists(extra_atoms(), min_size=0, max_size=2), min_size=8, max_size=8),
    masks=st.lists(st.one_of(st.just(0), st.just(2**40 - 1), MASKS), min_size=8, max_size=8),
    trades=trade_events(),
)
def test_scheduled_group_lookups_equal_brute_force(
    thresholds: list[int], extras: list[list[str]], masks: list[int], trades: list[dict[str, Any]]
) -> None:
    """Grouped rules (single thresholds, and ``driver AND more atoms``) on one (index, window):
    whole groups skipped, partly skipped, looked up whole."""
    named = []
    for i, thr in enumerate(thresholds):
        agg = "COUNT(*)" if i % 2 else "SUM(size)"
        cond = " AND ".join([f"{agg} OVER LAST 4 SECONDS > {thr}", *(extras[i] if i % 3 else [])])
        named.append((f"c{i:02d}", f"SELECT symbol FROM trades GROUP BY symbol HAVING {cond}"))
    events = {"trades": trades, "packets": []}
    skip = masks_schedule([n for n, _ in named], masks[: len(named)], lookup_taus(events, 1000))
    files = [to_file("trades", trades)]
    expect = reference_scheduled(named, events, 1000, skip)
    ev = Evaluator("shared", ci_p=2)
    assert run(ev, named, files, 1000, skip) == expect
    assert sum(len(g.members) for g in ev.groups.values()) == len(named)  # the group path under test
    assert run(Evaluator("naive", ci_p=2), named, files, 1000, skip) == expect
