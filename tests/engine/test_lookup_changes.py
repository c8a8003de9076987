"""A lookup's changes checked against the rules' result sets (:func:`engine.lookup_changes.accepted`):
the same alerts, in the same order, and the same result sets as a brute force that takes the
changes one at a time -- on random blocks with rules added since the last lookup, rules no
longer held, rules with no result set yet, keys already held (or not held), a (rule, key)
twice in one lookup, and a key entering and exiting in one lookup."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.evaluation.alert_values import KeysByRule
from engine.lookup_changes import ENTER, EXIT, accepted

RULES = ["a", "b", "c", "d", "e"]
KEYS = [f"k{i}" for i in range(8)]


def brute_force(
    parts: list[tuple[np.ndarray, np.ndarray, str]],
    fresh: set[str],
    rules: set[str],
    current: dict[str, set[str]],
) -> list[tuple[str, str, str]]:
    """Every change on its own, in order: an alert where the rule's set changes; then sorted by
    (rule, key, kind)."""
    out = []
    for names, keys, kind in parts:
        for sid, key in zip(names.tolist(), keys.tolist(), strict=True):
            if sid in fresh or sid not in rules:
                continue
            cur = current.setdefault(sid, set())
            if kind == ENTER and key not in cur:
                cur.add(key)
                out.append((sid, key, kind))
            elif kind == EXIT and key in cur:
                cur.discard(key)
                out.append((sid, key, kind))
    return sorted(out)


block = st.tuples(
    st.lists(st.tuples(st.sampled_from(RULES), st.sampled_from(KEYS)), max_size=12),
    st.sampled_from([ENTER, EXIT]),
)


@settings(max_examples=400, deadline=None)
@given(
    blocks=st.lists(block, max_size=6),
    current=st.dictionaries(st.sampled_from(RULES), st.sets(st.sampled_from(KEYS))),
    fresh=st.sets(st.sampled_from(RULES), max_size=2),
    gone=st.sets(st.sampled_from(RULES), max_size=2),
    sort=st.booleans(),
)
def test_accepted_equals_taking_the_changes_one_by_one(
    blocks: list[tuple[list[tuple[str, str]], str]],
    current: dict[str, set[str]],
    fresh: set[str],
    gone: set[str],
    sort: bool,
) -> None:
    parts = []
    for pairs, kind in blocks:
        if sort:  # as a group's pass gives them: by rule, then key
            pairs = sorted(set(pairs))
        names = np.array([n for n, _ in pairs], dtype=object)
        parts.append((names, np.array([k for _, k in pairs], dtype=object), kind))
    rules = set(RULES) - gone
    mine = {k: set(v) for k, v in current.items()}
    want = brute_force(parts, fresh, rules, current)
    got = accepted(parts, fresh, rules, mine)
    assert mine == current
    assert list(mine) == list(current)  # a rule's first set made in the order rules come
    flat = [
        (s, k, kind) for s, (ks, kinds) in got.by_rule().items() for k, kind in zip(ks, kinds, strict=True)
    ]
    assert flat == want
    assert got.sids == sorted({s for s, _, _ in want}) and all(n > 0 for n in got.sizes.tolist())
    assert int(got.sizes.sum()) == len(got.keys) == len(got.kinds)


def test_accepted_orders_rules_then_keys_then_enter_before_exit() -> None:
    parts = [
        (np.array(["b", "b", "a"], dtype=object), np.array(["k2", "k1", "k9"], dtype=object), ENTER),
        (np.array(["b", "a"], dtype=object), np.array(["k0", "k1"], dtype=object), EXIT),
    ]
    current: dict[str, set[str]] = {"a": {"k1"}, "b": {"k0"}}
    got = accepted(parts, set(), {"a", "b"}, current)
    assert got.sids == ["a", "b"] and got.sizes.tolist() == [2, 3]
    assert got.keys == ["k1", "k9", "k0", "k1", "k2"]
    assert got.kinds == [EXIT, ENTER, EXIT, ENTER, ENTER]
    assert current == {"a": {"k9"}, "b": {"k1", "k2"}}
    assert accepted([], set(), {"a"}, current).sids == []


def test_keys_by_rule_is_the_mapping_of_its_columns() -> None:
    m: Any = KeysByRule(["r", "s", "t"], np.array([2, 0, 1]), ["x", "y", "z"])
    assert dict(m) == {"r": ["x", "y"], "s": [], "t": ["z"]}
    assert list(m) == ["r", "s", "t"] and len(m) == 3 and "s" in m and "u" not in m
