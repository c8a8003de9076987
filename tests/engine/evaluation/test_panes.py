"""panes.py against a plain pandas reference (no services)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engine.evaluation.panes import ColumnSet, PaneSpec, aggregate, pane_of

G = 1000


def _events(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "symbol": rng.choice(np.array(["A", "B", "C", "D"], dtype=object), n),
        "ts": rng.integers(0, 6 * G, n).astype(np.int64),  # many ts ties and pane edges
        "price": rng.integers(1, 50, n).astype(np.float64),
        "size": rng.integers(0, 20, n).astype(np.int64),
        "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n),
    }


SPEC = PaneSpec(
    key="symbol",
    column_sets=(
        ColumnSet("all", None, sums=("size",), minmax=("price",), firstlast=("price",), distinct=("size",)),
        ColumnSet(
            "ask",
            lambda c: c["side"] == "ASK",
            sums=("size", "price"),
            minmax=("price",),
            firstlast=("price",),
            distinct=("size",),
        ),
    ),
)


def test_pane_of_is_ceiling() -> None:
    assert pane_of(np.array([0, 1, 999, 1000, 1001, -1, -1000]), G).tolist() == [
        0,
        1000,
        1000,
        1000,
        2000,
        0,
        -1000,
    ]


@pytest.mark.parametrize("seed", range(8))
def test_matches_pandas_reference(seed: int) -> None:
    ev = _events(400, seed)
    rows = aggregate(ev, SPEC, G)
    df = pd.DataFrame(ev)
    df["arrival"] = np.arange(len(df))
    df["pane"] = np.ceil(df.ts / G).astype(np.int64) * G
    assert rows.n_events == len(df)
    got_index = list(zip(rows.keys, rows.pane, strict=True))
    assert len(set(got_index)) == len(got_index)
    ref_total = df.groupby(["symbol", "pane"]).size()
    assert {k: int(v) for k, v in ref_total.items()} == dict(zip(got_index, rows.total.tolist(), strict=True))
    for name, sub in (("all", df), ("ask", df[df.side == "ASK"])):
        agg = rows.sets[name]
        srt = sub.sort_values(["ts", "arrival"])
        grp = srt.groupby(["symbol", "pane"])
        ref = pd.DataFrame(
            {
                "count": grp.size(),
                "sum_size": grp["size"].sum(),
                "min": grp["price"].min(),
                "max": grp["price"].max(),
                "first": grp["price"].first(),
                "last": grp["price"].last(),
                "nd": grp["size"].nunique(),
            }
        )
        for i, k in enumerate(got_index):
            if k in ref.index:
                r = ref.loc[k]
                assert agg.count[i] == r["count"]
                assert agg.sums["size"][i] == r["sum_size"]
                assert agg.mins["price"][i] == r["min"] and agg.maxs["price"][i] == r["max"]
                assert agg.first["price"][i] == r["first"] and agg.last["price"][i] == r["last"]
            else:
                assert agg.count[i] == 0 and agg.sums["size"][i] == 0
                assert np.isnan(agg.mins["price"][i]) and np.isnan(agg.first["price"][i])
        drow, dval, dmult = agg.distinct["size"]
        got = pd.DataFrame({"row": drow, "v": dval.astype(np.int64), "m": dmult})
        assert got.groupby("row").size().to_dict() == {
            i: int(ref.loc[k, "nd"]) for i, k in enumerate(got_index) if k in ref.index
        }
        assert int(got.m.sum()) == len(sub)
        ref_pairs = sub.groupby(["symbol", "pane", "size"]).size().to_dict()
        for r, v, m in zip(drow, dval, dmult, strict=True):
            assert ref_pairs[(*got_index[r], int(v))] == m


def test_window_is_union_of_whole_panes() -> None:
    ev = _events(1000, 42)
    rows = aggregate(ev, SPEC, G)
    now, T = 5 * G, 3 * G
    for key in ("A", "B"):
        m = (rows.keys == key) & (rows.pane > now - T) & (rows.pane <= now)
        direct = (ev["symbol"] == key) & (ev["ts"] > now - T) & (ev["ts"] <= now)
        assert rows.total[m].sum() == direct.sum()
        assert rows.sets["all"].sums["size"][m].sum() == ev["size"][direct].sum()


def test_empty_batch() -> None:
    ev = {k: v[:0] for k, v in _events(3, 0).items()}
    rows = aggregate(ev, SPEC, G)
    assert len(rows) == 0 and rows.sets["ask"].count.shape == (0,)
