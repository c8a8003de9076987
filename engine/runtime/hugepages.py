"""NumPy's transparent huge pages in the engine's processes: on (NumPy's default) or off.

NumPy asks the kernel for transparent huge pages on every array of 4 MB or more
(``madvise(MADV_HUGEPAGE)``).  The engine grows its per-key row columns by ~1.5x
(:mod:`engine.algorithms._pool`), each growth a fresh array of up to hundreds of MB written whole
at once: on this project's benchmark machine the first write of 64-256 MB took 0.3-1.4 s with the
advice and 0.04-0.15 s without, and live runs at 10,000 rules had 1-4 lookup batches of 0.3-1.1 s
each away from any snapshot with the advice, none without.  That is not the kernel compacting
memory (``compact_stall`` in ``/proc/vmstat`` stayed 0 through such runs) but the cost of faulting
fresh 2 MB pages in on that machine, a nested virtual machine whose free memory goes back to the
host (docs/measurements/engine.md, "What the slow batches do, in the kernel"); the growths now
take columns made and faulted in ahead, off the batch (:mod:`engine.algorithms._spare`).  Without
the advice the driver took ≈ 6 % more CPU in the same runs (4 KB pages for the state's arrays) and
the p99 latency did not improve beyond the runs' spread, so the advice stays on by default
(docs/measurements/engine.md, "Huge pages, measured again").

:func:`numpy_hugepages` applies the setting in the driver at the engine's start (NumPy reads
its ``NUMPY_MADVISE_HUGEPAGE`` variable at import only; this uses its runtime switch);
:data:`ENV` is the variable Spark's Python workers get (``spark.executorEnv``,
:func:`engine.spark_session.spark_conf`).  ``engine_numpy_hugepages = true`` (the default) leaves
NumPy's own choice alone -- what NumPy decided at import, from the user's ``NUMPY_MADVISE_HUGEPAGE``
or the kernel's version -- and ``false`` turns the advice off.
"""

from __future__ import annotations

import logging

log = logging.getLogger("tidewatch.engine")

#: NumPy's variable, read when NumPy is imported ("0": no advice, "1": advice)
ENV = "NUMPY_MADVISE_HUGEPAGE"


def numpy_hugepages(allowed: bool) -> bool:
    """Apply ``engine_numpy_hugepages``: ``allowed`` leaves NumPy's own choice as it is, not
    ``allowed`` stops its huge-page advice on large arrays from now on.  Returns whether NumPy
    advised huge pages before the call.  Arrays already made keep what they were given."""
    from numpy._core import multiarray

    from engine.algorithms import numpy_advises_huge_pages

    before = numpy_advises_huge_pages()
    switch = getattr(multiarray, "_set_madvise_hugepage", None)
    if before is None or switch is None:  # a NumPy without the switch: its import-time choice stands
        if not allowed:
            log.warning("NumPy has no huge-page switch; %s decides at import", ENV)
        return allowed
    if not allowed and before:
        switch(False)
        log.info("NumPy's huge-page advice on large arrays: off (engine_numpy_hugepages = false)")
    return before
