"""The extra atoms' check of a conjunctive group (``ExtraChecks.check``, every table of the
group in one pass): it drops exactly the pairs the per-pair, per-table reference it replaced
(kept here) drops, on random groups of tables and pairs -- several tables reading one aggregate
and several aggregates, a rule in several tables, sorted pairs as a group's pass gives them,
unsorted ones, every operator, negation, both sides, NULL values, members without pairs -- and
reads each aggregate once, for distinct ascending keys; ``unique_ids`` equals ``np.unique``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine.evaluation.batches import compare
from engine.evaluation.rules import ExtraChecks, _ExtraTable, unique_ids

OPS = np.array(["<", "<=", ">", ">=", "=", "!="], dtype=object)


class _Ctx:
    """A lookup whose aggregate ``spec`` of key id k is ``values[spec.idx, k]`` (NaN: NULL)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.calls: list[tuple[int, np.ndarray]] = []

    def _agg(self, spec: Any, struct: Any, keys: np.ndarray) -> np.ndarray:
        assert bool((np.diff(keys) > 0).all()), "keys are distinct and ascending"
        self.calls.append((spec.idx, keys))
        out: np.ndarray = self.values[spec.idx, keys]
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


def _case(rng: np.random.Generator, sort: bool) -> tuple[list[_ExtraTable], _Ctx, np.ndarray, np.ndarray]:
    n_keys = int(rng.integers(1, 300))
    n_aggs = int(rng.integers(1, 4))
    values = rng.integers(0, 8, (n_aggs, n_keys)).astype(np.float64)
    values[rng.random((n_aggs, n_keys)) < 0.1] = np.nan
    specs = [SimpleNamespace(idx=a, func=f"F{a}", window=None) for a in range(n_aggs)]
    tables = []
    for _ in range(int(rng.integers(1, 6))):  # two tables may read one aggregate
        m = int(rng.integers(1, 40))
        tables.append(
            _ExtraTable(
                struct=None,  # type: ignore[arg-type]
                spec=specs[int(rng.integers(0, n_aggs))],  # type: ignore[arg-type]
                uids=np.sort(rng.choice(200, m, replace=False)).astype(np.int64),
                ops=OPS[rng.integers(0, len(OPS), m)],
                consts=rng.integers(0, 8, m).astype(np.float64),
                agg_left=rng.random(m) < 0.5,
                negated=rng.random(m) < 0.3,
            )
        )
    n = int(rng.integers(0, 2000))
    pair_uids = rng.integers(0, 200, n).astype(np.int64)  # members and non-members
    pairs = np.unique((pair_uids << 32) | rng.integers(0, n_keys, n).astype(np.int64))
    if not sort:
        pairs = rng.permutation(pairs)
    return tables, _Ctx(values), pairs >> 32, pairs & np.int64(0xFFFFFFFF)


@pytest.mark.parametrize("sort", [True, False])
def test_check_drops_what_the_per_table_reference_drops(sort: bool) -> None:
    rng = np.random.default_rng(7 if sort else 8)
    nonempty = shared = 0
    for _ in range(400):
        tables, ctx, uid_of, key_of = _case(rng, sort)
        wants = [w for t in tables if (w := reference(t, ctx, uid_of, key_of)) is not None]
        ctx.calls.clear()
        got = ExtraChecks.of(tables).check(ctx, uid_of, key_of)  # type: ignore[arg-type]  # a stand-in lookup
        if not wants:
            assert got is None
            continue
        assert got is not None
        want = np.unique(np.concatenate(wants))
        nonempty += int(want.shape[0] > 0)
        assert np.unique(got).tolist() == want.tolist()
        read = [a for a, _ in ctx.calls]
        assert len(read) == len(set(read)), "each aggregate is read once"
        shared += int(len({id(t.spec) for t in tables}) < len(tables))
    assert nonempty > 200  # the cases fail atoms, not just pass them
    assert shared > 50  # and tables share aggregates


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
