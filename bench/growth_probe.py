"""Probe: what a per-key row buffer's growth costs the batch that grows it, with and without spares.

The pooled structures (:mod:`engine.algorithms._pool`) grow their row columns by ~1.5x when the
pool runs out of room: fresh arrays, whose first write faults in all their memory.  Live, on this
machine, the batches that grew a 93-146 MB structure took 0.3-0.7 s of kernel time
(docs/measurements/engine.md, "What the slow batches do, in the kernel").  This probe builds the
engine core of the live benchmark's mix (``--rules`` rules over ``--keys`` keys, the driver's
decode path, no Spark, no I/O), feeds it ``--batches`` batches of ``--batch`` events ``--pace``
seconds apart (the live trigger), and prints every batch that grew a structure or took longer
than ``--slow`` ms: its time, its kernel time and page faults (:mod:`engine.runtime.thread_usage`)
and the columns made.  ``--spares off``: no columns made ahead (as ``tidewatch backtest``);
``on`` (the engine's default): the columns made ahead are faulted in by the engine's
:class:`engine.runtime.prefault.SpareWarmer` thread while the batches go on.

    .venv/bin/python bench/growth_probe.py --spares on
    .venv/bin/python bench/growth_probe.py --spares off
    .venv/bin/python bench/growth_probe.py --spares on --spare-min-mb 4    # spares for smaller structures too
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.core_probe import add_workload_args, build_core  # noqa: E402
from bench.engine_bench import record_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(ap, keys=5_000, stream="trades")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--pace", type=float, default=0.5, help="seconds from one batch's start to the next's")
    ap.add_argument("--slow", type=float, default=120.0, help="print batches slower than this (ms)")
    ap.add_argument("--spares", choices=["on", "off"], default="on")
    ap.add_argument(
        "--spare-min-mb",
        type=float,
        default=None,
        help="structures whose row columns hold less make no spare (default: the engine's SPARE_MIN_BYTES)",
    )
    a = ap.parse_args()

    from engine.algorithms import _base, _spare
    from engine.algorithms._spare import make_spares
    from engine.runtime.prefault import SpareWarmer
    from engine.runtime.thread_usage import thread_usage

    make_spares(a.spares == "on")  # as the engine does at its start
    if a.spare_min_mb is not None:
        _spare.SPARE_MIN_BYTES = int(a.spare_min_mb * (1 << 20))
    made: list[tuple[str, int, bool]] = []
    new_col = _base.PooledStructure._new_col

    def counted(self: Any, name: str, old: np.ndarray, n: int, keep: int = 0) -> np.ndarray:
        out = new_col(self, name, old, n, keep)
        made.append((type(self).__name__, out.nbytes, keep > 0))
        return out

    _base.PooledStructure._new_col = counted  # type: ignore[method-assign]
    core, msgs = build_core(a, a.batch * (a.batches + 1))
    warmer = SpareWarmer()
    kafka_ts = int(time.time() * 1000)
    grown_ms: list[float] = []
    start = time.perf_counter()
    try:
        for b in range(1, a.batches + 1):
            while time.perf_counter() < start + a.pace * (b - 1):
                time.sleep(0.005)
            tbl = record_table(msgs, (b - 1) * a.batch, b * a.batch, kafka_ts)
            made.clear()
            u0 = thread_usage()
            t = time.perf_counter()
            out = core.process(b, {a.stream: tbl}, [])
            ms = (time.perf_counter() - t) * 1000
            u = thread_usage() - u0
            warmer.after_batch(core.evaluator)
            grew = [m for m in made if m[2]]
            if grew:
                grown_ms.append(ms)
            if grew or ms > a.slow:
                kinds = sorted({m[0] for m in grew})
                print(
                    f"batch {b}: {ms:.0f} ms (kernel {u.kernel_s * 1000:.0f} ms, {u.faults:,} page faults), "
                    f"{len(out.lookups)} lookups; grew {len(grew)} columns, {sum(m[1] for m in grew) / 1e6:.0f} MB "
                    f"{','.join(kinds)}",
                    flush=True,
                )
    finally:
        warmer.close()
    warmed = sum(w[1] for w in warmer.warmed) / 1e6
    print(
        f"spares {a.spares} (from {_spare.SPARE_MIN_BYTES / (1 << 20):g} MB): {len(grown_ms)} batches grew a structure, median {np.median(grown_ms or [0]):.0f} ms, "
        f"max {max(grown_ms or [0]):.0f} ms; state {core.state_nbytes() / 1e6:.0f} MB; spares faulted in ahead "
        f"(last {len(warmer.warmed)}): {warmed:.0f} MB"
    )


if __name__ == "__main__":
    main()
