"""engine.runtime.thread_usage: the calling thread's kernel time and page faults (no services)."""

from __future__ import annotations

import mmap
import threading

from engine.runtime.thread_usage import ThreadUsage, thread_usage

PAGES = 2_000


def _touch_fresh_pages() -> None:
    """Write one byte of each of ``PAGES`` fresh pages: a page fault each."""
    with mmap.mmap(-1, PAGES * mmap.PAGESIZE) as m:
        for i in range(PAGES):
            m[i * mmap.PAGESIZE] = 1


def test_a_threads_own_page_faults_are_counted() -> None:
    before = thread_usage()
    _touch_fresh_pages()
    step = thread_usage() - before
    assert step.faults >= PAGES
    assert step.kernel_s >= 0.0


def test_another_threads_faults_are_not() -> None:
    before = thread_usage()
    t = threading.Thread(target=_touch_fresh_pages)
    t.start()
    t.join()
    assert (thread_usage() - before).faults < PAGES // 2


def test_a_reading_minus_a_reading() -> None:
    assert ThreadUsage(0.5, 30) - ThreadUsage(0.25, 10) == ThreadUsage(0.25, 20)
