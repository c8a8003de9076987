"""Shared sliding-window structures and collective indexes (Arasu & Widom 2004).

Pure NumPy/Numba, no I/O: the Spark engine, the backtest and the benchmarks run this code.

- :class:`KeyInterner` -- key values <-> dense int64 ids.
- :class:`RInt` -- R-INT (section 3.2): COUNT/SUM/AVG, FIRST/LAST, k-th newest timestamp.
- :class:`MinMax` -- exact MIN/MAX (B-INT-style base intervals, section 3.1.1).
- :class:`DistinctCount` -- COUNT DISTINCT (Golab et al. 2003).
- :class:`CICount`, :class:`CISum` -- collective indexes CI-COUNT / CI-SUM (section 4) with
  :func:`exact_count` / :func:`exact_sum` (candidates, the unproven ones post-checked with R-INT)
  for exact answers.
- :func:`make_spares`, :func:`spares_on`, :func:`numpy_advises_huge_pages` -- the per-process
  switch for row columns made ahead of a pool's growth (``_spare``), and NumPy's huge-page switch
  that their advice follows.
"""

from ._spare import make_spares, numpy_advises_huge_pages, spares_on
from .ci_count import CICount, exact_count, post_check_count
from .ci_sum import CISum, exact_sum, post_check_sum
from .distinct import DistinctCount
from .keys import KeyInterner
from .minmax import MinMax
from .rint import RInt

__all__ = [
    "CICount",
    "CISum",
    "DistinctCount",
    "KeyInterner",
    "MinMax",
    "RInt",
    "exact_count",
    "exact_sum",
    "make_spares",
    "numpy_advises_huge_pages",
    "post_check_count",
    "post_check_sum",
    "spares_on",
]
