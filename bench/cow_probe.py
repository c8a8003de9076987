"""Probe: which of the engine core's memory does a batch write while a forked snapshot child lives?

The engine snapshots its state from a forked child (:mod:`engine.runtime.snapshot_writer`).  Until
the child exits, every page the driver writes is copied first (copy-on-write): the batch after the
fork pays a page fault and a 4 KiB copy for each page it writes.  Live (10,000 rules, 100,000
source IPs) that batch took 40,000-73,000 minor faults and its evaluation 0.3-1.0 s instead of 0.1 s
(docs/measurements/engine.md, "The live p99 on a faster day, and the snapshot child's copies").
This probe finds which memory those pages are.

It builds an :class:`engine.core.EngineCore` of ``--rules`` rules of the live benchmark's mix over
``--keys`` keys (no Spark, no I/O: the driver's decode path, the same state), feeds it ``--warm``
batches of ``--batch`` events, then forks a child that only sleeps and processes ``--batches``
more batches in the parent.  After each, it reads ``/proc/self/pagemap``: a page of the parent's
that is mapped *exclusively* (bit 56) while the child lives was written since the fork (copied) or
allocated since.  Those pages are attributed to the NumPy arrays reachable from the core (by the
attribute that holds each array), the rest to "other" (Python objects, allocator arenas).  Printed:
each batch's time and minor faults before the fork (the reference) and while the child lives, and
the arrays with the most written pages.  ``--huge-pages off``: the state on 4 KiB pages (NumPy
asks for transparent huge pages for arrays of 4 MiB or more by default); ``--pretouch``: one byte
of every page of the core's arrays rewritten right after the fork, the copies paid there.

    .venv/bin/python bench/cow_probe.py --rules 10000 --keys 100000 --stream packets
    .venv/bin/python bench/cow_probe.py --rules 10000 --keys 100000 --stream packets --huge-pages off
    .venv/bin/python bench/cow_probe.py --rules 10000 --keys 5000 --stream trades --compare 4
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.core_probe import add_workload_args, build_core  # noqa: E402
from bench.engine_bench import record_table  # noqa: E402

PAGE = 4096


def _arrays(root: Any) -> dict[int, tuple[str, np.ndarray]]:
    """``{id: (path, array)}`` of the NumPy arrays owning their memory reachable from ``root``
    through instance ``__dict__``s, ``__slots__``, lists, tuples and dicts (first path found)."""
    out: dict[int, tuple[str, np.ndarray]] = {}
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("core", root)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            if base.nbytes >= PAGE and id(base) not in out:
                out[id(base)] = (path, base)
            continue
        if isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        if isinstance(obj, dict):
            for k, v in list(obj.items())[:100_000]:
                stack.append((f"{path}[{k!r}]" if isinstance(k, (str, int)) else f"{path}[]", v))
            continue
        if isinstance(obj, (list, tuple, set, frozenset)):
            for v in list(obj)[:100_000]:
                stack.append((f"{path}[]", v))
            continue
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            for k, v in d.items():
                stack.append((f"{path}.{k}", v))
        for cls in type(obj).__mro__:
            for k in getattr(cls, "__slots__", ()):
                if hasattr(obj, k):
                    stack.append((f"{path}.{k}", getattr(obj, k)))
    return out


def _pages(lo: int, hi: int, pagemap: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per page of ``[lo, hi)``: (written since the fork: mapped exclusively, bit 56, and present;
    present, bit 63)."""
    first, last = lo // PAGE, (hi + PAGE - 1) // PAGE
    pagemap.seek(first * 8)
    raw = np.frombuffer(pagemap.read((last - first) * 8), np.uint64)
    present = ((raw >> np.uint64(63)) & np.uint64(1)).astype(bool)
    return ((raw >> np.uint64(56)) & np.uint64(1)).astype(bool) & present, present


def _heap_exclusive(pagemap: Any) -> tuple[int, int]:
    """(exclusive, present) pages of the process's private writable anonymous mappings."""
    ex = pr = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) < 5 or "w" not in parts[1] or parts[1][3] != "p":
            continue
        if len(parts) >= 6 and parts[5] and not parts[5].startswith("[heap"):
            continue  # file-backed
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        written, present = _pages(lo, hi, pagemap)
        ex += int(written.sum())
        pr += int(present.sum())
    return ex, pr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(ap, keys=100_000, stream="packets")
    ap.add_argument("--warm", type=int, default=150, help="batches before the fork")
    ap.add_argument("--batches", type=int, default=4, help="batches while the child lives")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument(
        "--huge-pages",
        choices=["on", "off"],
        default="on",
        help="off: NumPy asks for no transparent huge pages for the arrays made after (as "
        "NUMPY_MADVISE_HUGEPAGE=0 does at import); on: NumPy's default (arrays of 4 MiB or more)",
    )
    ap.add_argument(
        "--compare",
        type=int,
        default=0,
        metavar="N",
        help="instead of the page census: N forks in turn without and with the engine's prefault "
        "(engine/runtime/prefault.py: the pages the next batch appends to faulted in right after the fork), "
        "each timed to its first lookup batch, side by side",
    )
    ap.add_argument(
        "--pretouch",
        action="store_true",
        help="after the fork, write one byte of every page of the core's arrays (its own value) before the "
        "next batch: the copies paid there instead of in the batch",
    )
    a = ap.parse_args()

    if a.huge_pages == "off":
        from numpy._core.multiarray import _set_madvise_hugepage  # type: ignore[attr-defined]

        _set_madvise_hugepage(False)
    n = a.batch * (a.warm + 2 * a.batches + 2 + 2 * a.compare * (_ROUND_BATCHES + _SETTLE))
    core, msgs = build_core(a, n)
    kafka_ts = int(time.time() * 1000)

    def batch(b: int) -> tuple[float, int, int, int]:
        tbl = record_table(msgs, (b - 1) * a.batch, b * a.batch, kafka_ts)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.perf_counter()
        out = core.process(b, {a.stream: tbl}, [])
        dt = time.perf_counter() - t
        return dt, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, len(out.lookups), len(out.alerts)

    t0 = time.perf_counter()
    for b in range(1, a.warm + 1):
        batch(b)
    print(f"{a.rules:,} rules, {a.keys:,} keys ({a.stream}): {a.warm} batches of {a.batch:,} in "
          f"{time.perf_counter() - t0:.1f} s; state {core.state_nbytes() / 1e6:.0f} MB, RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB", flush=True)  # fmt: skip
    b = a.warm
    print("no child:")
    for _ in range(a.batches):
        b += 1
        dt, flt, lk, al = batch(b)
        print(f"  batch {b}: {dt * 1000:.0f} ms, {flt:,} minor faults, {lk} lookups, {al:,} alerts")
    if a.compare:
        _compare(a.compare, core, batch, b)
        return
    arrays = _arrays(core)
    gc.collect()
    pid = os.fork()
    if pid == 0:  # the snapshot child's stand-in: holds the pages, does nothing
        time.sleep(600)
        os._exit(0)
    try:
        written: dict[str, int] = defaultdict(int)
        sizes: dict[str, int] = defaultdict(int)
        print("a child forked (it only sleeps):")
        if a.pretouch:
            t = time.perf_counter()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _, arr in arrays.values():
                if arr.flags.c_contiguous and arr.flags.writeable and not arr.dtype.hasobject:
                    v = arr.reshape(-1).view(np.uint8)[::PAGE]
                    np.bitwise_or(v, 0, out=v)
            print(f"  pre-touched the arrays' pages: {(time.perf_counter() - t) * 1000:.0f} ms, "
                  f"{resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0:,} minor faults")  # fmt: skip
        with open("/proc/self/pagemap", "rb") as pm:
            for _ in range(a.batches):
                b += 1
                dt, flt, lk, al = batch(b)
                heap_ex, heap_pr = _heap_exclusive(pm)
                print(f"  batch {b}: {dt * 1000:.0f} ms, {flt:,} minor faults, {lk} lookups, {al:,} alerts; "
                      f"pages exclusive since the fork {heap_ex:,} of {heap_pr:,} present", flush=True)  # fmt: skip
            in_arrays = 0
            for path, arr in arrays.values():
                lo = arr.ctypes.data
                ex = int(_pages(lo, lo + arr.nbytes, pm)[0].sum())
                key = path.replace("[]", "[*]")
                written[key] += ex
                sizes[key] += arr.nbytes
                in_arrays += ex
        print(f"written pages in the core's {len(arrays):,} arrays: {in_arrays:,} "
              f"({in_arrays * PAGE / 1e6:.0f} MB); elsewhere {heap_ex - in_arrays:,} "
              f"({(heap_ex - in_arrays) * PAGE / 1e6:.0f} MB: Python objects, allocator arenas, new allocations)")  # fmt: skip
        for key, pages in sorted(written.items(), key=lambda kv: -kv[1])[: a.top]:
            print(f"  {pages:8,} pages of {sizes[key] / 1e6:8.1f} MB  {key}")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


_ROUND_BATCHES = 4  # at most, after a fork, to reach its first lookup batch
_SETTLE = 2  # batches without a child between two forks


def _compare(rounds: int, core: Any, batch: Any, b: int) -> None:
    """``rounds`` pairs of forks, without then with :func:`engine.runtime.prefault.make_private`
    of the core's :meth:`write_targets` right after the fork: each fork's prefault (time, pages)
    and its first lookup batch (time, minor faults), the child killed after it."""
    from engine.runtime.prefault import make_private

    rows: dict[bool, list[tuple[float, int, float]]] = {False: [], True: []}
    print("side by side (a child that only sleeps; its first lookup batch after each fork):")
    for r in range(2 * rounds):
        prefault = r % 2 == 1
        gc.collect()
        targets = core.evaluator.write_targets() if prefault else []
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        try:
            t = time.perf_counter()
            pages = make_private(targets) if prefault else 0
            pre = time.perf_counter() - t
            del targets
            for _ in range(_ROUND_BATCHES):
                b += 1
                dt, flt, lk, _al = batch(b)
                if lk:
                    break
            rows[prefault].append((dt, flt, pre))
            print(f"  fork {r + 1} ({'prefault' if prefault else 'none'}): prefault {pre * 1000:.0f} ms for "
                  f"{pages:,} pages; first lookup batch (batch {b}) {dt * 1000:.0f} ms, {flt:,} minor faults",
                  flush=True)  # fmt: skip
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for _ in range(_SETTLE):
            b += 1
            batch(b)
    med = {k: np.median(np.array(v), axis=0) for k, v in rows.items()}
    print(f"medians: first lookup batch after a fork {med[False][0] * 1000:.0f} ms ({med[False][1]:,.0f} faults) "
          f"without, {med[True][0] * 1000:.0f} ms ({med[True][1]:,.0f} faults) with the prefault "
          f"(itself {med[True][2] * 1000:.0f} ms, on the fork's thread live): "
          f"{med[False][0] / med[True][0]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
