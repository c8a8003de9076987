"""Serializing the pooled structures (engine.algorithms._base.PooledStructure.to_bytes): the rows
written as a full compaction lays them out, without changing the structure serialized."""

import numpy as np
import pytest

from engine.algorithms import DistinctCount, MinMax, RInt


def _append(s, rng: np.random.Generator, keys: np.ndarray, ts: np.ndarray) -> None:
    """Rows of random values in the shape ``s`` takes."""
    n = keys.shape[0]
    if isinstance(s, RInt):
        s.append(keys, ts, rng.normal(size=(n, 2)))
    elif isinstance(s, MinMax):
        s.append(keys, ts, rng.normal(size=n))
    else:
        s.append(keys, ts, rng.integers(0, 20, n))


def _feed(cls, seed: int):
    """A structure with holes in its pool: many keys of uneven rates, expired twice."""
    rng = np.random.default_rng(seed)
    s = cls(2) if cls is RInt else cls()
    t = 0
    for step in range(30):
        n = int(rng.integers(50, 400))
        keys = (rng.pareto(1.2, n) * 5).astype(np.int64) % 300
        ts = t + np.sort(rng.integers(0, 50, n))
        t = int(ts[-1]) + 1
        _append(s, rng, keys, ts)
        if step in (10, 20):
            s.expire(t - 300)
    return s, t


def _state(s) -> list[np.ndarray]:
    p = s._pool
    return [*(c.copy() for c in s._cols.values()), *(c.copy() for c in s._kcols.values()),
            p.off.copy(), p.cap.copy(), p.head.copy(), p.end.copy(), np.array([p.top])]  # fmt: skip


@pytest.mark.parametrize("cls", [RInt, MinMax, DistinctCount])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_to_bytes_leaves_the_structure_as_it_was(cls, seed: int) -> None:
    s, _ = _feed(cls, seed)
    cols = dict(s._cols)
    before = _state(s)
    data = s.to_bytes()
    assert all(s._cols[k] is v for k, v in cols.items()), "a column was replaced"
    for a, b in zip(before, _state(s), strict=True):
        np.testing.assert_array_equal(a, b)
    back = cls.from_bytes(data)
    assert back.to_bytes() == data  # a restored structure is compact already: the same bytes
    assert s.to_bytes() == data


@pytest.mark.parametrize("cls", [RInt, MinMax, DistinctCount])
def test_a_capture_writes_the_rows_of_its_time(cls) -> None:
    s, t = _feed(cls, 7)
    want = s.to_bytes()
    later = s.capture_bytes()
    rng = np.random.default_rng(8)
    keys = rng.integers(0, 400, 2_000)
    ts = t + np.sort(rng.integers(0, 100, 2_000))
    _append(s, rng, keys, ts)
    s.expire(t)
    assert later() == want
    assert s.to_bytes() != want


def test_restored_answers_equal_the_original() -> None:
    s, t = _feed(RInt, 11)
    back = RInt.from_bytes(s.to_bytes())
    keys = np.arange(301)
    for lo in (t - 200, t - 50, t - 5):
        for got, want in zip(back.window(keys, lo, t), s.window(keys, lo, t), strict=True):
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(back.rows(keys, 5)[0], s.rows(keys, 5)[0])


def test_a_prefix_is_written_in_the_same_buffer_and_changes_no_byte_after_it() -> None:
    from engine.algorithms._pool import pack, unpack

    arrays = {"x": np.arange(10_000), "y": np.ones((50, 3))}
    meta: dict[str, int | float] = {"top": 7, "unit": 0.5}
    alone = pack(arrays, meta)
    with_prefix = pack(arrays, meta, b"rint\x00")
    assert with_prefix == b"rint\x00" + alone
    got, m = unpack(with_prefix[5:])
    np.testing.assert_array_equal(got["x"], arrays["x"])
    assert int(m["top"]) == 7 and float(m["unit"]) == 0.5
