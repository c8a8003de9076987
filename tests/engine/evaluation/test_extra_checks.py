"""The extra atoms' check of a conjunctive group (``ExtraChecks.check``, every extra atom of the
group in one pass): it drops exactly the pairs a brute force drops -- each (rule, key) pair's
rule's atoms compared one by one in Python -- on random groups: several atoms reading one
aggregate and several aggregates, a rule with two atoms on one aggregate, sorted pairs as a
group's pass gives them, unsorted ones, every operator, negation, both sides, NULL values,
members without pairs, pairs of non-members; and it reads each aggregate once, for distinct
ascending keys -- those of one structure and function apart only in their window (time or ROWS)
in one read, for distinct (aggregate, key) pairs.  ``unique_ids`` equals ``np.unique``."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine.evaluation.rules import ExtraChecks, unique_ids
from subscriptions import rule_ast as A

OPS = ("<", "<=", ">", ">=", "=", "!=")


def _read_of(struct: Any, spec: Any) -> tuple[int, str, bool]:
    """What one read may cover: a structure, a function, time or ROWS windows."""
    return id(struct), spec.func, isinstance(spec.window, A.RowsWindow)


class _Ctx:
    """A lookup whose aggregate ``spec`` of key id k is ``values[spec.idx, k]`` (NaN: NULL);
    it records each read: (structure, function, window kind) and the aggregates it covered."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.calls: list[tuple[tuple[int, str, bool], list[int]]] = []

    def _agg(self, spec: Any, struct: Any, keys: np.ndarray) -> np.ndarray:
        assert bool((np.diff(keys) > 0).all()), "keys are distinct and ascending"
        self.calls.append((_read_of(struct, spec), [spec.idx]))
        out: np.ndarray = self.values[spec.idx, keys]
        return out

    def read_over(self, struct: Any, specs: list[Any], which: np.ndarray, keys: np.ndarray) -> np.ndarray:
        assert len(specs) > 1 and len({_read_of(struct, sp) for sp in specs}) == 1, "one read's aggregates"
        assert len(set(zip(which.tolist(), keys.tolist(), strict=True))) == len(keys), "distinct pairs"
        self.calls.append((_read_of(struct, specs[0]), [sp.idx for sp in specs]))
        idx = np.array([sp.idx for sp in specs], np.int64)[which]
        out: np.ndarray = self.values[idx, keys]
        return out


def _holds(v: float, op: str, c: float, agg_left: bool) -> bool:
    """One comparison as SQL does it: anything with NULL (NaN) is false."""
    if math.isnan(v):
        return False
    x, y = (v, c) if agg_left else (c, v)
    return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y, "=": x == y, "!=": x != y}[op]


def brute_force(extras: dict[str, list[Any]], uids: dict[str, int], values: np.ndarray,
                uid_of: np.ndarray, key_of: np.ndarray) -> list[int]:  # fmt: skip
    """The pairs whose rule has an extra atom that does not hold, pair by pair in Python."""
    name_of = {u: n for n, u in uids.items()}
    out = []
    for i, (u, k) in enumerate(zip(uid_of.tolist(), key_of.tolist(), strict=True)):
        for _, spec, atom in extras.get(name_of.get(u, ""), []):
            left = isinstance(atom.right, A.Num)
            c = atom.right.value if left else atom.left.value
            if _holds(float(values[spec.idx, k]), atom.op, float(c), left) == atom.negated:
                out.append(i)
                break
    return out


def _case(
    rng: np.random.Generator, sort: bool
) -> tuple[dict[str, list[Any]], dict[str, int], _Ctx, np.ndarray, np.ndarray]:
    n_keys = int(rng.integers(1, 300))
    n_aggs = int(rng.integers(1, 7))
    values = rng.integers(0, 8, (n_aggs, n_keys)).astype(np.float64)
    values[rng.random((n_aggs, n_keys)) < 0.1] = np.nan
    structs = [object(), object()]  # aggregates of one structure and function, windows apart
    specs = [
        SimpleNamespace(
            idx=a,
            func=("F0", "F1")[int(rng.integers(0, 2))],
            window=A.RowsWindow(a + 1) if rng.random() < 0.3 else A.TimeWindow(1000 * (a + 1)),
            struct=structs[int(rng.integers(0, 2))],
        )
        for a in range(n_aggs)
    ]
    agg = A.Agg("COUNT", None, False, None, None)  # type: ignore[arg-type]  # the side's type only
    extras: dict[str, list[Any]] = {}
    uids: dict[str, int] = {}
    for u in rng.choice(200, int(rng.integers(1, 60)), replace=False).tolist():
        name = f"r{u}"
        uids[name] = int(u)
        if rng.random() < 0.15:
            continue  # a member without extra atoms
        items = []
        for _ in range(int(rng.integers(1, 4))):  # two atoms may read one aggregate
            c = A.Num(float(rng.integers(0, 8)))
            left = bool(rng.random() < 0.5)
            atom = SimpleNamespace(op=OPS[int(rng.integers(0, len(OPS)))], left=agg if left else c,
                                   right=c if left else agg, negated=bool(rng.random() < 0.3))  # fmt: skip
            spec = specs[int(rng.integers(0, n_aggs))]
            items.append((spec.struct, spec, atom))
        extras[name] = items
    n = int(rng.integers(0, 2000))
    pair_uids = rng.integers(0, 200, n).astype(np.int64)  # members and non-members
    pairs = np.unique((pair_uids << 32) | rng.integers(0, n_keys, n).astype(np.int64))
    if not sort:
        pairs = rng.permutation(pairs)
    return extras, uids, _Ctx(values), pairs >> 32, pairs & np.int64(0xFFFFFFFF)


@pytest.mark.parametrize("sort", [True, False])
def test_check_drops_what_the_brute_force_drops(sort: bool) -> None:
    rng = np.random.default_rng(7 if sort else 8)
    nonempty = shared = twice = merged = 0
    for _ in range(300):
        extras, uids, ctx, uid_of, key_of = _case(rng, sort)
        want = brute_force(extras, uids, ctx.values, uid_of, key_of)
        got = ExtraChecks.of(extras, uids).check(ctx, uid_of, key_of)  # type: ignore[arg-type]  # a stand-in lookup
        selected = np.isin(uid_of, [uids[n] for n in extras]).any()
        if not selected:
            assert got is None
            continue
        assert got is not None
        assert np.unique(got).tolist() == want
        nonempty += int(len(want) > 0)
        reads = [r for r, _ in ctx.calls]
        assert len(reads) == len(set(reads)), "one read per structure, function and window kind"
        covered = [a for _, aggs in ctx.calls for a in aggs]
        assert len(covered) == len(set(covered)), "each aggregate is read once"
        merged += int(any(len(aggs) > 1 for _, aggs in ctx.calls))
        shared += int(len({id(s) for v in extras.values() for _, s, _ in v}) < sum(map(len, extras.values())))
        twice += int(any(len({id(s) for _, s, _ in v}) < len(v) for v in extras.values()))
    assert nonempty > 150  # the cases fail atoms, not just pass them
    assert shared > 50 and twice > 50  # atoms share aggregates, within a rule too
    assert merged > 50  # aggregates apart only in their window are read together


def test_unique_ids_equals_numpy() -> None:
    rng = np.random.default_rng(3)
    for ids in (
        np.zeros(0, np.int64),
        np.array([5], np.int64),
        rng.integers(0, 50, 1000),
        rng.integers(0, 10**9, 100),  # sparse: by sorting
        np.array([0, 0, 0], np.int64),
    ):
        u, inv = unique_ids(ids)
        wu, winv = np.unique(ids, return_inverse=True)
        assert u.tolist() == wu.tolist() and inv.tolist() == winv.reshape(-1).tolist()
