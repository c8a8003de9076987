"""engine.runtime.prefault: the pages of a batch's appends, and making them this process's own
after a fork (copy on write) without changing a byte."""

from __future__ import annotations

import os
import resource
import signal
import threading
import time

import numpy as np
import pytest

from engine.algorithms import RInt
from engine.runtime.prefault import PAGE, ahead_of_next_batch, make_private, page_runs


def _pages_brute(targets: list[tuple[np.ndarray, np.ndarray | None]]) -> set[int]:
    """Every page address holding a byte of the targets' rows (or arrays), byte by byte."""
    out: set[int] = set()
    for arr, rows in targets:
        base = arr.ctypes.data
        row = arr[0].nbytes if arr.ndim and arr.shape[0] else 0
        spans = (
            [(base, arr.nbytes)]
            if rows is None
            else [(base + int(r) * arr.strides[0], row) for r in rows if 0 <= r < arr.shape[0]]
        )
        for lo, n in spans:
            for b in range(lo, lo + n):
                out.add(b // PAGE * PAGE)
    return out


def _runs_pages(runs: np.ndarray) -> set[int]:
    return {a + i * PAGE for a, n in runs.tolist() for i in range(n // PAGE)}


def test_page_runs_match_the_pages_byte_by_byte() -> None:
    rng = np.random.default_rng(7)
    for _ in range(60):
        targets: list[tuple[np.ndarray, np.ndarray | None]] = []
        for _ in range(int(rng.integers(1, 5))):
            rows_n = int(rng.integers(0, 3000))
            width = int(rng.integers(1, 4))
            dtype = rng.choice([np.int64, np.float64, np.bool_, np.int32])
            arr = np.zeros((rows_n, width) if rng.random() < 0.5 else (rows_n,), dtype)
            pick = None if rng.random() < 0.2 else rng.integers(-5, rows_n + 5, int(rng.integers(0, 40)))
            targets.append((arr, pick))
        if rng.random() < 0.3 and targets[0][0].size:  # a view of an array already listed
            arr = targets[0][0]
            targets.append((arr[arr.shape[0] // 2 :], np.arange(3)))
        runs = page_runs(targets)
        assert (runs[:, 0] % PAGE == 0).all() and (runs[:, 1] % PAGE == 0).all() and (runs[:, 1] > 0).all()
        assert (runs[1:, 0] > runs[:-1, 0] + runs[:-1, 1]).all()  # in order, apart (else one run)
        assert _runs_pages(runs) == _pages_brute(targets)


def test_nothing_to_make_private() -> None:
    assert page_runs([]).shape == (0, 2)
    assert page_runs([(np.zeros(0), None), (np.zeros(10), np.array([], np.int64))]).shape == (0, 2)
    assert make_private([]) == 0


def _faults(fn) -> int:  # type: ignore[no-untyped-def]
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_after_a_fork_the_pages_made_private_take_writes_without_faults() -> None:
    n_pages = 4096
    a = np.arange(n_pages * PAGE // 8, dtype=np.int64)  # 16 MiB, every page written
    want = a.copy()
    per_page = PAGE // 8
    rows = np.arange(0, a.shape[0] // 2, per_page)  # one row in each page of the first half
    pid = os.fork()
    if pid == 0:  # the child keeps the pages shared until killed
        time.sleep(60)
        os._exit(0)
    try:
        asked = make_private([(a, rows)])
        if asked == 0:
            pytest.skip("the kernel has no MADV_POPULATE_WRITE")
        assert asked >= n_pages // 2
        assert np.array_equal(a, want)  # nothing written
        first = _faults(lambda: a.__setitem__(rows, a[rows] + 1))
        second = _faults(lambda: a.__setitem__(rows + a.shape[0] // 2, a[rows + a.shape[0] // 2] + 1))
        assert first < n_pages // 20, first  # made private: no copy left to make
        assert second > n_pages // 2 * 0.9, second  # still shared: a copy-on-write fault per page
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_rint_write_targets_are_where_the_next_appends_write() -> None:
    """The contract :func:`make_private` relies on: a batch of rows of keys with room writes the
    row columns at the keys' ``end`` positions, which :meth:`write_targets` names, and nothing
    changes by asking."""
    rng = np.random.default_rng(3)
    r = RInt(1)
    keys = np.repeat(np.arange(50), 3)
    r.append(keys, np.repeat(np.arange(3)[None, :], 50, 0).reshape(-1) + 1, rng.random((150, 1)))
    before = {k: v.copy() for k, v in r._cols.items()}
    targets = r.write_targets()
    assert all(np.array_equal(r._cols[k], v) for k, v in before.items())
    tails = {id(arr): rows for arr, rows in targets if rows is not None}
    assert set(tails) == {id(c) for c in r._cols.values()}
    room = r._pool.end < r._pool.off + r._pool.cap  # keys that take a row without a move
    some = np.flatnonzero(room)[:20]
    assert some.size
    r.append(some, np.full(some.size, 10), rng.random((some.size, 1)))
    for name, old in before.items():
        new = r._cols[name][: old.shape[0]]
        changed = np.flatnonzero((new != old).reshape(old.shape[0], -1).any(axis=1))
        assert set(changed.tolist()) <= set(tails[id(r._cols[name])].tolist()), name
    ts_changed = np.flatnonzero(r._cols["ts"][: before["ts"].shape[0]] != before["ts"])
    assert ts_changed.size == some.size  # each appended row landed on a named tail


def test_ahead_of_next_batch_reads_the_targets_now_and_lets_them_go(caplog: pytest.LogCaptureFixture) -> None:
    class Stand:
        calls = 0

        def __init__(self) -> None:
            self.arr = np.zeros(10 * PAGE // 8, np.int64)

        def write_targets(self) -> list[tuple[np.ndarray, np.ndarray | None]]:
            Stand.calls += 1
            return [(self.arr, np.array([0, 600], np.int64))]

    assert ahead_of_next_batch(object()) is None  # no write_targets: nothing to do
    assert ahead_of_next_batch(None) is None  # no evaluator (the snapshot writer asks for any)
    ev = Stand()
    run = ahead_of_next_batch(ev)
    assert run is not None and Stand.calls == 1  # read when made, between batches
    ev.arr = np.zeros(1)  # the state changes after: the targets read before are the ones used
    with caplog.at_level("INFO", logger="tidewatch.engine"):
        run()
    assert Stand.calls == 1
    supported = make_private([(np.zeros(PAGE // 8, np.int64), None)]) > 0
    msg = [r.getMessage() for r in caplog.records if "after the snapshot's fork" in r.getMessage()]
    assert msg and msg[0].split(": ")[1].startswith("2 pages" if supported else "0 pages")
    assert run.__closure__ is not None
    held = [c.cell_contents for c in run.__closure__ if isinstance(c.cell_contents, list)]
    assert held == [[]]  # the arrays let go once done


class _Spares:
    """An evaluator's stand-in: hands out its spare columns once."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays

    def take_spares(self) -> list[np.ndarray]:
        out, self.arrays = self.arrays, []
        return out


def test_the_spare_warmer_faults_spares_in_off_the_batch() -> None:
    """Spare columns handed over after a batch are faulted in by the warmer's thread: the batch
    that then writes them takes (nearly) no page faults; each spare is handed over once."""
    from engine.algorithms._spare import spare_array
    from engine.runtime.prefault import WARM_NICENESS, SpareWarmer
    from engine.runtime.thread_usage import thread_usage

    spares = [spare_array((1 << 20,), np.float64), spare_array((1 << 19, 2), np.int64)]
    pages = sum(a.nbytes for a in spares) // PAGE
    evaluator = _Spares(list(spares))
    warmer = SpareWarmer()
    try:
        assert warmer.after_batch(evaluator) == 2
        assert warmer.after_batch(evaluator) == 0
        # the warming thread yields to the batches (a nice value of its own); this thread keeps its
        niceness = warmer._pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        assert niceness.result() == min(19, mine + WARM_NICENESS)
    finally:
        warmer.close()
    if not warmer.warmed or warmer.warmed[-1][1] == 0:
        pytest.skip("this kernel cannot fault pages in ahead (MADV_POPULATE_WRITE)")
    assert warmer.warmed[-1][:2] == (2, pages * PAGE)
    before = thread_usage()
    for a in spares:
        a[...] = 7
    assert (thread_usage() - before).faults < pages // 20


def test_the_spare_warmer_with_an_evaluator_without_spares() -> None:
    from engine.runtime.prefault import SpareWarmer

    warmer = SpareWarmer()
    assert warmer.after_batch(object()) == 0
    warmer.close()
    assert warmer.warmed == []
