"""``Evaluator.values_many``: the values alerts carry, for many rules in one pass, equal to
``values`` one rule at a time and to sums written out by hand; NULL as None, COUNT as int."""

from __future__ import annotations

import numpy as np

from engine.evaluation.evaluator import Evaluator
from subscriptions.compiler import compile_rule
from tidewatch.settings import get_settings

RULES = {
    "a": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 10 SECONDS > 1 "
    "AND AVG(price) OVER 3 SECONDS TO 2 SECONDS AGO > 0",
    "b": "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 10 SECONDS > 5",
    "c": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 10 SECONDS > 0",
}


def _evaluator(pane_ms: int | None) -> Evaluator:
    ev = Evaluator("shared", ci_p=2, pane_ms=pane_ms)
    for name, text in RULES.items():
        ev.add_rule(name, compile_rule(text, get_settings()))
    ev.apply(
        "trades",
        {
            "symbol": np.array(["A", "A", "B", "A"], dtype=object),
            "ts": np.array([1_000, 2_000, 3_000, 9_000], np.int64),
            "price": np.array([10.0, 20.0, 5.0, 30.0]),
            "size": np.array([1, 2, 3, 4], np.int64),
            "side": np.array(["BID"] * 4, dtype=object),
            "exchange": np.array(["X"] * 4, dtype=object),
        },
    )
    return ev


def test_values_many_equals_values_and_the_hand_sums() -> None:
    for pane_ms in (None, 1000):
        ev = _evaluator(pane_ms)
        now = 10_000
        wanted = {"a": ["A", "B", "Z"], "b": ["B", "A"], "c": ["A"]}
        many = ev.values_many(wanted, now)
        assert many == {name: ev.values(name, keys, now) for name, keys in wanted.items()}
        count_a, avg_a = "COUNT(*) OVER LAST 10 SECONDS", "AVG(price) OVER 3 SECONDS TO 2 SECONDS AGO"
        assert many["a"]["A"][count_a] == 3 and isinstance(many["a"]["A"][count_a], int)
        assert many["a"]["A"][avg_a] is None  # no trade of A in (7 s, 8 s]: NULL
        assert many["a"]["B"] == {count_a: 1, avg_a: None}
        assert many["a"]["Z"] == {count_a: 0, avg_a: None}  # a key never seen: an empty window
        assert many["b"] == {
            "B": {"SUM(size) OVER LAST 10 SECONDS": 3.0},
            "A": {"SUM(size) OVER LAST 10 SECONDS": 7.0},
        }
        assert list(many["b"]) == ["B", "A"]  # the keys in the order asked
        assert ev.values_many({}, now) == {}


def test_value_columns_are_values_many_as_columns() -> None:
    """``value_columns``: per rule its distinct labels and a column per label, row i for the i-th
    key asked; an aggregate twice in a rule is one label, at its first place."""
    ev = _evaluator(1000)
    twice = "COUNT(*) OVER LAST 10 SECONDS"
    ev.add_rule(
        "d",
        compile_rule(
            f"SELECT symbol FROM trades GROUP BY symbol HAVING {twice} > 0 AND SUM(size) OVER LAST 10 SECONDS > 0 "
            f"AND {twice} < 9",
            get_settings(),
        ),
    )
    now = 10_000
    wanted = {"a": ["A", "B", "Z"], "b": ["B", "A"], "d": ["A", "B"]}
    cols = ev.value_columns(wanted, now)
    many = ev.values_many(wanted, now)
    assert set(cols) == set(wanted)
    for name, keys in wanted.items():
        labels, columns = cols[name]
        assert len(labels) == len(set(labels)) == len(columns)
        assert all(len(c) == len(keys) for c in columns)
        rows = zip(*columns, strict=True)
        assert {k: dict(zip(labels, row, strict=True)) for k, row in zip(keys, rows, strict=True)} == many[
            name
        ]
        assert [list(v) for v in many[name].values()] == [labels] * len(keys)
    assert cols["d"][0] == [twice, "SUM(size) OVER LAST 10 SECONDS"]
    assert cols["d"][1] == [[3, 1], [7.0, 3.0]]
