"""The extra atoms' check of a conjunctive group (``_ExtraTable.check``): the run-per-member
version equals the per-pair reference it replaced (kept here) on random tables and pairs --
sorted pairs as a group's pass gives them, unsorted ones, every operator, negation, both sides,
NULL values, members without pairs -- and ``unique_ids`` equals ``np.unique``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.evaluation.batches import compare
from engine.evaluation.rules import _ExtraTable, unique_ids

OPS = np.array(["<", "<=", ">", ">=", "=", "!="], dtype=object)


class _Ctx:
    """A lookup whose aggregate of key id k is ``values[k]`` (NaN: NULL)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.calls: list[np.ndarray] = []

    def _agg(self, spec: Any, struct: Any, keys: np.ndarray) -> np.ndarray:
        assert bool((np.diff(keys) > 0).all()), "keys are distinct and ascending"
        self.calls.append(keys)
        out: np.ndarray = self.values[keys]
        return out


def reference(t: _ExtraTable, ctx: _Ctx, uid_of: np.ndarray, key_of: np.ndarray) -> np.ndarray | None:
    """The check before Nov 27: a binary search per pair, operators compared as strings."""
    pos = np.minimum(np.searchsorted(t.uids, uid_of), t.uids.shape[0] - 1)
    sel = np.flatnonzero(t.uids[pos] == uid_of)
    if sel.shape[0] == 0:
        return None
    keys, inv = np.unique(key_of[sel], return_inverse=True)
    v = ctx._agg(t.spec, t.struct, keys)[inv]
    j = pos[sel]
    ok = np.empty(sel.shape[0], bool)
    ops, c, left = t.ops[j], t.consts[j], t.agg_left[j]
    for op in np.unique(ops):
        m = ops == op
        a = np.where(left[m], v[m], c[m])
        b = np.where(left[m], c[m], v[m])
        with np.errstate(invalid="ignore"):
            r = np.asarray(compare(a, str(op), b), dtype=bool)
            if op == "!=":
                r = r & ~np.isnan(a) & ~np.isnan(b)
        ok[m] = r
    ok ^= t.negated[j]
    out: np.ndarray = sel[~ok]
    return out


def _case(rng: np.random.Generator, sort: bool) -> tuple[_ExtraTable, _Ctx, np.ndarray, np.ndarray]:
    n_keys = int(rng.integers(1, 300))
    values = rng.integers(0, 8, n_keys).astype(np.float64)
    values[rng.random(n_keys) < 0.1] = np.nan
    m = int(rng.integers(1, 40))
    uids = np.sort(rng.choice(200, m, replace=False)).astype(np.int64)
    t = _ExtraTable(
        struct=None,  # type: ignore[arg-type]
        spec=None,  # type: ignore[arg-type]
        uids=uids,
        ops=OPS[rng.integers(0, len(OPS), m)],
        consts=rng.integers(0, 8, m).astype(np.float64),
        agg_left=rng.random(m) < 0.5,
        negated=rng.random(m) < 0.3,
    )
    n = int(rng.integers(0, 2000))
    pair_uids = rng.integers(0, 200, n).astype(np.int64)  # members and non-members
    pairs = np.unique((pair_uids << 32) | rng.integers(0, n_keys, n).astype(np.int64))
    if not sort:
        pairs = rng.permutation(pairs)
    return t, _Ctx(values), pairs >> 32, pairs & np.int64(0xFFFFFFFF)


@pytest.mark.parametrize("sort", [True, False])
def test_check_equals_the_per_pair_reference(sort: bool) -> None:
    rng = np.random.default_rng(7 if sort else 8)
    nonempty = 0
    for _ in range(400):
        t, ctx, uid_of, key_of = _case(rng, sort)
        want = reference(t, ctx, uid_of, key_of)
        got = t.check(ctx, uid_of, key_of)  # type: ignore[arg-type]  # a stand-in lookup
        if want is None:
            assert got is None
            continue
        assert got is not None
        nonempty += int(want.shape[0] > 0)
        assert got.tolist() == want.tolist()
    assert nonempty > 200  # the cases fail atoms, not just pass them


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
