"""Durations as people write them on the command line and in the dashboard.

``'90s'``, ``'5m'``, ``'1.5h'``, ``'250ms'``, ``'2d'``, ``'45'`` (a bare number is seconds);
units are case-insensitive.  One parser for every command and page that reads a duration
(``tidewatch feed --history``, a subscription's staleness budget, ...).
"""

from __future__ import annotations

import re

__all__ = ["parse_duration_ms"]

_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "sec": 1000, None: 1000, "m": 60_000, "min": 60_000}
_UNIT_MS |= {"h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """The duration ``text`` in milliseconds (rounded); ValueError when it is not a duration."""
    m = _DUR.match(text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 5m, 1h)")
    unit = m.group(2).lower() if m.group(2) else None
    return int(round(float(m.group(1)) * _UNIT_MS[unit]))
