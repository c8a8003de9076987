"""KeyInterner (engine.algorithms.keys)."""

import numpy as np

from engine.algorithms import KeyInterner


def test_ids_are_dense_in_first_seen_order_and_stable():
    ki = KeyInterner()
    ids = ki.ids(np.array(["MSFT", "AAPL", "MSFT", "IBM", "AAPL"], dtype=object))
    assert ids.tolist() == [0, 1, 0, 2, 1]
    assert ki.ids(["IBM", "ZZZ"]).tolist() == [2, 3]
    assert len(ki) == 4 and ki.key(3) == "ZZZ" and ki.keys([1, 0]) == ["AAPL", "MSFT"]
    assert ki.get("nope") is None and "IBM" in ki
    assert ki.ids(np.array([], dtype=object)).shape == (0,)


def test_round_trip_including_empty_string_key():
    ki = KeyInterner(["", "10.0.0.1", "é"])
    back = KeyInterner.from_bytes(ki.to_bytes())
    assert [back.key(i) for i in range(3)] == ["", "10.0.0.1", "é"]
    assert back.ids(["é", "new"]).tolist() == [2, 3]
    assert len(KeyInterner.from_bytes(KeyInterner().to_bytes())) == 0
