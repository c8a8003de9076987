"""``AlertSeq``: the core's alerts as blocks of columns behave as the list of their Alert objects
under every list operation the engine and its tests use, against a plain list as the model
(hypothesis); ``AlertBlock`` and ``LookupBlock`` make the Alerts their columns say. No services."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.messages import Alert, AlertBlock, AlertSeq, BatchOutput, LookupBlock, typed_objects, typed_values

LABELS = ["COUNT(*) OVER LAST 10 SECONDS", "SUM(size) OVER LAST 5 SECONDS"]


def _block(i: int, n: int, labelled: bool) -> AlertBlock:
    keys = [f"K{i}-{j}" for j in range(n)]
    kinds = ["ENTER" if (i + j) % 3 else "EXIT" for j in range(n)]
    if not labelled:
        return AlertBlock(f"s{i % 3}", f"r{i % 3}", "trades", 1000 * i, keys, kinds)
    cols: list[list[Any]] = [list(range(n)), [None if j % 2 else j / 4 for j in range(n)]]
    return AlertBlock(f"s{i % 3}", f"r{i % 3}", "trades", 1000 * i, keys, kinds, LABELS, cols)


def test_a_block_makes_the_alerts_its_columns_say() -> None:
    b = _block(4, 3, True)
    assert b.alerts() == [
        Alert("s1", "r1", "trades", "K4-0", "ENTER", 4000, {LABELS[0]: 0, LABELS[1]: 0.0}),
        Alert("s1", "r1", "trades", "K4-1", "ENTER", 4000, {LABELS[0]: 1, LABELS[1]: None}),
        Alert("s1", "r1", "trades", "K4-2", "EXIT", 4000, {LABELS[0]: 2, LABELS[1]: 0.5}),
    ]
    assert [a.values for a in b.alerts()][1] == {LABELS[0]: 1, LABELS[1]: None}
    assert [a.values for a in _block(4, 2, False).alerts()] == [{}, {}]
    assert len(AlertBlock("s", "r", "trades", 0, [], [])) == 0


OPS = st.lists(
    st.tuples(
        st.sampled_from(["block", "lookup", "append", "extend", "extend_seq", "iadd", "get", "slice", "set",
                         "set_slice", "del", "sort", "sort_as_of", "eq", "insert", "pop"]),
        st.integers(0, 40),
        st.integers(0, 5),
        st.booleans(),
    ),
    max_size=25,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_an_alert_seq_is_the_list_of_its_alerts(ops: list[tuple[str, int, int, bool]]) -> None:
    seq, model = AlertSeq(), []
    for op, i, n, flag in ops:
        one = Alert("x", "rx", "trades", f"A{i}", "ENTER", i)
        if op == "block":
            seq.add_block(_block(i, n, flag))
            model += _block(i, n, flag).alerts()
        elif op == "lookup":  # a lookup's block of several subscriptions
            blocks = [_block(i, n, flag), _block(i, (n + 2) % 5, not flag)]
            for b in blocks:
                b.subscription_id, b.as_of = f"{b.subscription_id}-{len(b)}", 1000 * i + 7
            seq.add_block(LookupBlock.of_blocks(blocks))
            model += [a for b in blocks for a in b.alerts()]
        elif op == "append":
            seq.append(one)
            model.append(one)
        elif op == "extend":
            seq.extend([one] * n)
            model.extend([one] * n)
        elif op == "extend_seq":
            other = AlertSeq([one])
            other.add_block(_block(i, n, flag))
            seq.extend(other)
            model.extend(list(other))
        elif op == "iadd":
            seq += [one]
            model += [one]
            if flag:  # itself, as a list can
                seq.extend(seq)
                model.extend(model)
        elif op == "get":
            if model:
                assert seq[i % len(model)] == model[i % len(model)]
            else:
                with pytest.raises(IndexError):
                    seq[i]
        elif op == "slice":
            assert seq[i % 7 : i % 7 + n] == model[i % 7 : i % 7 + n]
        elif op == "set" and model:
            seq[i % len(model)] = one
            model[i % len(model)] = one
        elif op == "set_slice":
            seq[n:] = model[n:][::-1]
            model[n:] = model[n:][::-1]
        elif op == "del" and model:
            del seq[i % len(model)]
            del model[i % len(model)]
        elif op == "insert":
            seq.insert(i, one)
            model.insert(i, one)
        elif op == "pop" and model:
            assert seq.pop(i % len(model)) == model.pop(i % len(model))
        elif op == "sort":
            seq.sort(key=lambda a: a.as_of, reverse=flag)
            model.sort(key=lambda a: a.as_of, reverse=flag)
        elif op == "sort_as_of":  # the shards' merge: blocks move whole, stably
            seq.sort_by_as_of()
            model.sort(key=lambda a: a.as_of)
        elif op == "eq":
            assert seq == model and model == seq and seq == AlertSeq(model)
        assert len(seq) == len(model) and bool(seq) == bool(model)
        assert list(seq) == model
        assert [a.values for a in seq] == [a.values for a in model]  # (not in Alert's ==)
    assert seq == model


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 9), st.integers(0, 8), st.booleans(), st.lists(st.booleans(), min_size=8, max_size=8))
def test_a_compressed_block_is_the_alerts_the_mask_keeps(
    i: int, n: int, labelled: bool, mask: list[bool]
) -> None:
    b = _block(i, n, labelled)
    got = b.compress(mask[:n])
    want = [a for a, m in zip(b.alerts(), mask, strict=False) if m]
    assert got.alerts() == want and [a.values for a in got.alerts()] == [a.values for a in want]
    assert len(b) == n and b.compress(mask[:n]) is not b  # the block itself is left as it was


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=6),
    st.lists(st.booleans(), min_size=30, max_size=30),
)
def test_a_lookup_block_is_its_subscriptions_blocks_one_after_another(
    shapes: list[tuple[int, bool]], mask: list[bool]
) -> None:
    """A lookup's one block of many subscriptions makes the Alert objects (values included) of
    its subscriptions' blocks in order; compressed, the alerts the mask keeps (rules left with
    none dropped)."""
    blocks = []
    for i, (n, labelled) in enumerate(shapes):
        b = _block(i, n, labelled)
        b.subscription_id, b.as_of = f"s{i}", 5000
        blocks.append(b)
    lb = LookupBlock.of_blocks(blocks)
    want = [a for b in blocks for a in b.alerts()]
    assert len(lb) == len(want) and lb.alerts() == want
    assert [a.values for a in lb.alerts()] == [a.values for a in want]
    got = lb.compress(mask[: len(lb)])
    kept = [a for a, m in zip(want, mask, strict=False) if m]
    assert got.alerts() == kept and [a.values for a in got.alerts()] == [a.values for a in kept]
    assert got.subscription_ids == list(dict.fromkeys(a.subscription_id for a in kept))


def test_a_lookup_block_whose_columns_do_not_add_up_is_refused() -> None:
    b = LookupBlock.of_blocks([_block(1, 2, True)])
    with pytest.raises(ValueError, match="alerts or labels"):
        LookupBlock(b.as_of, b.subscription_ids, b.rule_names, b.streams, b.sizes, b.keys[:1],
                    b.kinds[:1], b.label_counts, b.labels, b.doubles, b.tags)  # fmt: skip
    with pytest.raises(ValueError, match="values"):
        LookupBlock(b.as_of, b.subscription_ids, b.rule_names, b.streams, b.sizes, b.keys, b.kinds,
                    b.label_counts, b.labels, b.doubles[:-1], b.tags[:-1])  # fmt: skip
    with pytest.raises(ValueError, match="values"):
        LookupBlock(b.as_of, b.subscription_ids, b.rule_names, b.streams, b.sizes, b.keys, b.kinds,
                    b.label_counts, b.labels, b.doubles, b.tags[:-1])  # fmt: skip
    with pytest.raises(ValueError, match="per-rule"):
        LookupBlock(b.as_of, b.subscription_ids, [], b.streams, b.sizes, b.keys, b.kinds,
                    b.label_counts, b.labels, b.doubles, b.tags)  # fmt: skip
    with pytest.raises(ValueError, match="one lookup time"):
        LookupBlock.of_blocks([_block(1, 2, True), _block(2, 2, True)])


def test_a_batch_output_keeps_its_alerts_as_a_seq() -> None:
    out = BatchOutput(3, alerts=[Alert("s", "r", "trades", "k", "ENTER", 1)])
    assert isinstance(out.alerts, AlertSeq) and out.alerts == [Alert("s", "r", "trades", "k", "ENTER", 1)]
    assert isinstance(BatchOutput(4).alerts, AlertSeq) and not BatchOutput(4).alerts
    assert out.result_changes() is out.alerts


TYPED = st.one_of(st.none(), st.integers(-(2**53) + 1, 2**53 - 1), st.floats(allow_nan=True, width=64))


@settings(max_examples=200, deadline=None)
@given(st.lists(TYPED, max_size=30))
def test_typed_values_give_back_the_python_numbers_they_were(values: list[Any]) -> None:
    """A lookup's values as typed doubles and back: the same numbers, of the same Python types
    (None, int, float; -0.0 and NaN included)."""
    doubles, tags = typed_values(values)
    back = typed_objects(doubles, tags).tolist()
    assert list(map(type, back)) == list(map(type, values))
    for x, y in zip(back, values, strict=True):
        assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
        assert not isinstance(x, float) or math.copysign(1, x) == math.copysign(1, y)


@pytest.mark.parametrize("value", [True, 2**53, -(2**53), np.float64(1.5), "1", 10**30, 10**400, -(10**400)])
def test_a_value_typed_doubles_cannot_say_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="None, int or float|2\\*\\*53"):
        typed_values([1, value])
    with pytest.raises(ValueError):
        LookupBlock.of_blocks([AlertBlock("s", "r", "trades", 1, ["k"], ["ENTER"], ["n"], [[value]])])
