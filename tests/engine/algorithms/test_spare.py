"""Row columns made ahead of a pool's growth (engine.algorithms._spare): the same answers, the
spare's memory taken by the growth, a forked child sees what became state (no services)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

import numpy as np
import pytest

from engine.algorithms import CICount, CISum, RInt, make_spares
from engine.algorithms._spare import mapping_of, spare_array
from tests.engine.algorithms.test_minmax_distinct import (
    test_distinct_matches_brute_force,
    test_minmax_matches_brute_force,
)
from tests.engine.algorithms.test_rint import test_rint_matches_brute_force


@contextmanager
def spares(on: bool) -> Iterator[None]:
    """The process's spare switch set to ``on`` (:func:`make_spares`, as the engine sets it) and
    structures of any size making spares; the switch as it was afterwards."""
    before = make_spares(on)
    try:
        with patch("engine.algorithms._spare.SPARE_MIN_BYTES", 0):
            yield
    finally:
        make_spares(before)


@pytest.fixture
def spares_always() -> Iterator[None]:
    """Every structure makes its spare, however small its columns."""
    with spares(True):
        yield


@pytest.fixture
def spares_never() -> Iterator[None]:
    with patch("engine.algorithms._base.SPARE_AT", 2.0):
        yield


@pytest.mark.usefixtures("spares_always")
@pytest.mark.parametrize(
    "brute_force_test",
    [test_rint_matches_brute_force, test_minmax_matches_brute_force, test_distinct_matches_brute_force],
    ids=["rint", "minmax", "distinct"],
)
def test_structures_with_spares_match_brute_force(brute_force_test) -> None:
    brute_force_test()


def _grow(r: RInt, batches: int, seed: int = 5) -> list[np.ndarray]:
    """Feed ``r`` growing batches; the spares it made, in order."""
    rng = np.random.default_rng(seed)
    made: list[np.ndarray] = []
    t = 0
    for _ in range(batches):
        n = int(rng.integers(200, 2_000))
        keys = rng.integers(0, 50, n)
        ts = t + np.sort(rng.integers(0, 1_000, n))
        t = int(ts[-1]) + 1
        r.append(keys, ts, rng.normal(size=(n, 1)))
        made += r.take_spares()
    return made


def _answers(r: RInt) -> tuple[np.ndarray, np.ndarray]:
    return r.window(np.arange(50), 0, 10**9)


def test_a_growth_takes_the_spare_and_answers_do_not_change() -> None:
    with spares(True):
        with_spares = RInt(1)
        made = _grow(with_spares, 40)
    with patch("engine.algorithms._base.SPARE_AT", 2.0):
        without = RInt(1)
        assert _grow(without, 40) == []
    assert made, "no spare was made"
    taken = [a for a in made if any(np.shares_memory(a, c) for c in with_spares._cols.values())]
    assert taken or with_spares._spares, "the growths took none of the spares"
    cnt, sums = _answers(with_spares)
    cnt0, sums0 = _answers(without)
    np.testing.assert_array_equal(cnt, cnt0)
    np.testing.assert_array_equal(sums, sums0)
    assert with_spares.take_spares() == []  # each spare handed out once


@pytest.mark.usefixtures("spares_always")
def test_a_forked_child_reads_the_columns_a_spare_became() -> None:
    r = RInt(1)
    _grow(r, 40)
    assert any(mapping_of(c) is not None for c in r._cols.values()), "no spare was taken"
    want = [bytes(c.view(np.uint8).reshape(-1)[::997]) for c in r._cols.values()]
    pid = os.fork()
    if pid == 0:  # the child: every column of the state readable, as in the parent (MADV_DOFORK)
        got = [bytes(c.view(np.uint8).reshape(-1)[::997]) for c in r._cols.values()]
        os._exit(0 if got == want else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"the child was killed by signal {os.WTERMSIG(status)}"
    assert os.WEXITSTATUS(status) == 0, "the child read other bytes"


def test_a_spare_is_its_own_private_mapping_not_yet_written() -> None:
    a = spare_array((1000, 3), np.float64)
    assert a.shape == (1000, 3) and a.dtype == np.float64 and a.flags.writeable
    assert a.ctypes.data % os.sysconf("SC_PAGE_SIZE") == 0
    assert not a.any()  # fresh anonymous memory reads as zeroes
    assert mapping_of(a) is not None and mapping_of(np.zeros(3)) is None


def test_no_spares_unless_turned_on() -> None:
    """Off by default (``tidewatch backtest``, the executors): nothing faults spares in there."""
    with spares(False):
        r = RInt(1)
        assert _grow(r, 40) == [] and not r._spares


@pytest.mark.parametrize("cls", [CICount, CISum])
def test_a_collective_index_grows_into_its_spare_tables_and_answers_do_not_change(cls) -> None:
    """CI-COUNT / CI-SUM (Arasu & Widom 2004, section 4): the slot tables of the next key growth
    made ahead; the growth takes them, and every lookup, every key's units and a snapshot's
    round trip are those of an index that made none."""
    rng = np.random.default_rng(11)
    n, top = 60_000, 20_000
    keys = (np.arange(n) * top // n + rng.integers(0, 40, n)).astype(np.int64)  # new ids keep coming
    ts = np.sort(rng.integers(0, 200_000, n))
    vals = rng.integers(0, 30, n)
    with spares(True):
        ahead = cls(4)
        taken: list[np.ndarray] = []
        handed = 0
        for i in range(0, n, 3_000):
            sl = slice(i, i + 3_000)
            ahead.update(keys[sl], ts[sl], vals[sl])
            handed += len(ahead.take_spares())
            held = ahead._spares.get("TS")
            if held is not None:
                taken.append(held)
    with spares(False):
        plain = cls(4)
        for i in range(0, n, 3_000):
            sl = slice(i, i + 3_000)
            plain.update(keys[sl], ts[sl], vals[sl])
        assert plain.take_spares() == [] and not plain._spares
    assert handed >= 3, "no spare tables were handed out to be faulted in"
    assert any(np.shares_memory(ahead.TS, t) for t in taken), "no key growth took its spare tables"
    assert mapping_of(ahead.TS) is not None
    now = int(ts[-1])
    k = np.arange(top + 64)
    np.testing.assert_array_equal(ahead.units(k), plain.units(k))
    for T, v in ((5_000, 3), (50_000, 20), (200_000, 0)):
        ca, sa = ahead.lookup(T, now, v, None)
        cp, sp = plain.lookup(T, now, v, None)
        assert ca.tolist() == cp.tolist() and sa.tolist() == sp.tolist()
        cb, sb = ahead.lookup(T, now, None, v + 1)
        cq, sq = plain.lookup(T, now, None, v + 1)
        assert cb.tolist() == cq.tolist() and sb.tolist() == sq.tolist()
    back = cls.from_bytes(ahead.to_bytes())
    assert back.to_bytes() == plain.to_bytes()
    assert ahead.nbytes == plain.nbytes  # a spare is not state


def test_a_growth_of_the_groups_lets_the_spare_tables_go() -> None:
    """Spare tables are for the groups allocated when they were made: a count that needs more
    groups reallocates fresh, drops them, and the answers are still exact."""
    with spares(True):
        ci = CICount(2)
        ids = np.arange(60)
        ci.update(ids, np.full(60, 1), np.ones(60, np.int64))
        assert ci._spares  # 60 of 64 positions: the next key growth made ahead
        la = ci.La
        ci.update(np.array([0]), np.array([2]), np.array([2**20]))  # many more groups
        assert ci.La > la and not ci._spares and ci.take_spares() == []
        assert ci.units(np.array([0, 1])).tolist() == [2**20 + 1, 1]
