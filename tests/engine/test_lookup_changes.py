"""A lookup's changes checked against a rule's result set (:mod:`engine.lookup_changes`):
:func:`entered` and :func:`exited` equal the set operations they stand for -- on any result set
and any run of keys, duplicates and keys already held (or not held) included -- and
:func:`runs` cuts a block into the runs of one rule."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.lookup_changes import ENTER, EXIT, entered, exited, in_order, runs

KEYS = st.sampled_from([f"k{i}" for i in range(12)])


@given(cur=st.sets(KEYS), ks=st.lists(KEYS, max_size=10), enter=st.booleans())
def test_entered_and_exited_are_the_set_operations(cur: set[str], ks: list[str], enter: bool) -> None:
    before = set(cur)
    got = entered(cur, ks) if enter else exited(cur, ks)
    want = set(ks) - before if enter else set(ks) & before
    assert sorted(got) == sorted(want)  # each key once
    assert cur == (before | want if enter else before - want)


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), KEYS), max_size=20))
def test_runs_cut_a_block_into_one_rule_each(pairs: list[tuple[str, str]]) -> None:
    names = np.array([n for n, _ in pairs], dtype=object)
    keys = np.array([k for _, k in pairs], dtype=object)
    got = runs(names, keys)
    assert [(n, k) for n, ks in got for k in ks] == pairs
    assert all(a[0] != b[0] for a, b in zip(got, got[1:], strict=False))


def test_in_order_puts_a_rules_alerts_in_key_then_kind_order() -> None:
    assert in_order(["b", "a"], ["c", "a"]) == (["a", "a", "b", "c"], [ENTER, EXIT, ENTER, EXIT])
    assert in_order([], ["b", "a"]) == (["a", "b"], [EXIT, EXIT])
