"""``engine.evaluation.alert_values.value_columns`` (and ``value_table``, the same as one table):
the values alerts carry, for many rules in
one vectorized pass, against a brute force over the raw events (one rule, one key, one aggregate
at a time), for rules of two key states (src_ip, dst_ip), rules sharing aggregates, an
aggregate twice in one rule, one aggregate over several windows (time and ROWS: one read of a
structure serves them all), keys never seen and rules asked for no key."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.evaluation.alert_values import KeysByRule
from engine.evaluation.evaluator import Evaluator
from engine.messages import typed_objects
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings

AGGS = ["COUNT(*)", "SUM(length)", "AVG(length)", "MIN(length)", "MAX(length)", "COUNT(DISTINCT dst_port)"]
WINDOWS = ["2 SECONDS", "5 SECONDS", "10 SECONDS", "3 ROWS", "7 ROWS"]
SRC = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
DST = ["10.9.9.1", "10.9.9.2"]
NOW = 20_000


def _brute(agg: str, window: str, key_field: str, key: str, ev: dict[str, np.ndarray]) -> Any:
    """The aggregate over the raw events of ``key`` with ``NOW - window < ts <= NOW`` (no event
    lies on a window's edge: the events' times are never whole seconds), or over its last ``n``
    events for ``n ROWS`` (the events are in time order)."""
    n, unit = window.split()
    m = (ev[key_field] == key) & (ev["ts"] <= NOW)
    if unit == "SECONDS":
        m &= ev["ts"] > NOW - int(n) * 1000
    else:
        m[np.flatnonzero(m)[: -int(n)]] = False
    length = ev["length"][m].astype(np.float64)
    if agg == "COUNT(DISTINCT dst_port)":
        return len(set(ev["dst_port"][m].tolist()))
    if agg == "COUNT(*)":
        return int(m.sum())
    if agg == "SUM(length)":
        return float(length.sum())
    if not m.any():
        return None  # NULL: no row in the window
    return float({"AVG(length)": np.mean, "MIN(length)": np.min, "MAX(length)": np.max}[agg](length))


def _same(got: Any, want: Any) -> bool:
    if want is None or isinstance(want, int):
        return got == want and type(got) is type(want)
    return isinstance(got, float) and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)


rule_st = st.tuples(
    st.sampled_from(["src_ip", "dst_ip"]),
    st.lists(st.tuples(st.sampled_from(AGGS), st.sampled_from(WINDOWS)), min_size=1, max_size=4),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rules=st.lists(rule_st, min_size=1, max_size=8),
    swap=rule_st,
    n_events=st.integers(0, 80),
    seed=st.integers(0, 2**16),
    pane_ms=st.sampled_from([None, 1000]),
)
def test_value_columns_equal_a_brute_force_over_the_events(
    rules: list[tuple[str, list[tuple[str, str]]]],
    swap: tuple[str, list[tuple[str, str]]],
    n_events: int,
    seed: int,
    pane_ms: int | None,
) -> None:
    """The values against the brute force, as one table too; again after a rule was removed,
    and after another of its name was added (the evaluator's cached value plan made anew each
    time), asked for in another order."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, NOW // 1000, n_events) * 1000 + rng.integers(1, 1000, n_events))
    ev = {
        "src_ip": rng.choice(np.array(SRC, dtype=object), n_events),
        "dst_ip": rng.choice(np.array(DST, dtype=object), n_events),
        "ts": ts.astype(np.int64),
        "src_port": rng.integers(1024, 65000, n_events).astype(np.int64),
        "dst_port": rng.integers(1, 1024, n_events).astype(np.int64),
        "protocol": np.array(["TCP"] * n_events, dtype=object),
        "length": rng.integers(40, 1500, n_events).astype(np.int64),
        "tcp_flags": np.array(["S"] * n_events, dtype=object),
    }
    # history retained: the rule added after the events fills its new structures from it
    e = Evaluator("shared", ci_p=2, pane_ms=pane_ms, history_ms=NOW)
    texts: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for i, rule in enumerate(rules):
        _add(e, f"r{i}", rule)
        texts[f"r{i}"] = rule
    half = n_events // 2
    e.apply("packets", {k: v[:half] for k, v in ev.items()})
    e.apply("packets", {k: v[half:] for k, v in ev.items()})
    _check(e, texts, _wanted(texts, rng), ev)
    e.remove_rule("r0")
    del texts["r0"]
    _check(e, texts, _wanted(texts, rng), ev)
    _add(e, "r0", swap)
    texts["r0"] = swap
    _check(e, texts, _wanted(dict(reversed(texts.items())), rng), ev)
    assert e.value_columns({}, NOW) == {}
    empty = e.value_table({}, NOW)
    assert (
        empty.label_counts.tolist() == []
        and empty.labels == []
        and len(empty.doubles) == len(empty.tags) == 0
    )


def _add(e: Evaluator, name: str, rule: tuple[str, list[tuple[str, str]]]) -> None:
    field, aggs = rule
    having = " AND ".join(f"{a} OVER LAST {w} > -1" for a, w in aggs)
    e.add_rule(
        name, compile_rule(f"SELECT {field} FROM packets GROUP BY {field} HAVING {having}", get_settings())
    )


def _wanted(
    texts: dict[str, tuple[str, list[tuple[str, str]]]], rng: np.random.Generator
) -> dict[str, list[str]]:
    wanted: dict[str, list[str]] = {}
    for name, (field, _) in texts.items():
        domain = (SRC if field == "src_ip" else DST) + ["never-seen"]
        wanted[name] = [str(k) for k in rng.choice(domain, int(rng.integers(0, 4)), replace=False)]
    return wanted


def _check(
    e: Evaluator,
    texts: dict[str, tuple[str, list[tuple[str, str]]]],
    wanted: dict[str, list[str]],
    ev: dict[str, np.ndarray],
) -> None:
    got = e.value_columns(wanted, NOW)
    assert list(got) == list(wanted)
    for name, keys in wanted.items():
        field, aggs = texts[name]
        labels, columns = got[name]
        want_labels = list(dict.fromkeys(f"{a} OVER LAST {w}" for a, w in aggs))
        assert labels == want_labels
        assert len(columns) == len(labels) and all(len(c) == len(keys) for c in columns)
        for label, column in zip(labels, columns, strict=True):
            agg, window = label.split(" OVER LAST ")
            for key, value in zip(keys, column, strict=True):
                want = _brute(agg, window, field, key, ev)
                assert _same(value, want), (name, key, label, value, want)
    # the same values as one table (what a lookup's block carries): labels rule by rule, values
    # alert by alert in its rule's label order, of the same Python types
    table = e.value_table(wanted, NOW)
    assert table.label_counts.tolist() == [len(got[n][0]) for n in wanted]
    assert table.labels == [label for n in wanted for label in got[n][0]]
    want_values = [v for n in wanted for row in zip(*got[n][1], strict=True) for v in row]
    got_values = typed_objects(table.doubles, table.tags).tolist()
    assert len(got_values) == len(want_values)
    assert all(_same(a, b) for a, b in zip(got_values, want_values, strict=True))
    # the same asked for as flat columns (what the core hands on: KeysByRule), rules of two states
    flat = KeysByRule(
        list(wanted), np.array([len(v) for v in wanted.values()]), [k for v in wanted.values() for k in v]
    )
    again = e.value_table(flat, NOW)
    assert again.labels == table.labels and again.label_counts.tolist() == table.label_counts.tolist()
    assert again.tags.tolist() == table.tags.tolist()
    assert np.array_equal(again.doubles, table.doubles, equal_nan=True)
