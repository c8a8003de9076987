"""How a CAPPED record reads wherever alerts are listed (Alerts, "While you were away",
``tidewatch alerts tail``).

With ``engine_alert_cap_per_lookup`` set, a subscription whose result changes by more keys at one
lookup than the cap gets the first ``cap`` alerts and ONE record of kind ``CAPPED`` (key ``''``,
values ``withheld``, ``withheld_enter``, ``withheld_exit``, ``cap``) instead of the rest; its
current results stay complete (docs/engine.md, "Alert cap").  ENTER / EXIT counts never count it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the kind of the alert cap's record (``engine.messages.CAPPED``)
CAPPED = "CAPPED"


def _count(values: Mapping[str, Any], name: str) -> int:
    v = values.get(name)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def capped_text(values: Mapping[str, Any], when: str | None = None) -> str:
    """``capped: 4,900 more changes withheld at 12:00:01 (2,300 ENTER, 2,600 EXIT; cap 100 per
    lookup) — the subscription's current results are complete`` (without `` at …`` when ``when``
    is None)."""
    n, e, x = (_count(values, k) for k in ("withheld", "withheld_enter", "withheld_exit"))
    at = f" at {when}" if when else ""
    cap = _count(values, "cap")
    per = f"; cap {cap:,} per lookup" if cap else ""
    return (
        f"capped: {n:,} more changes withheld{at} ({e:,} ENTER, {x:,} EXIT{per}) \u2014 "
        "the subscription's current results are complete"
    )
