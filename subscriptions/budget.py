"""A subscription's staleness budget: how stale its results may get when the engine is overloaded.

When input outruns the engine, the engine keeps every event exact but looks the subscriptions
that have a budget up less often -- the loosest budget first, never more than its budget apart --
before latency grows for every subscription (docs/rules.md, "Staleness budget").  A
subscription without a budget (the default) is never degraded.

Lookups happen at multiples of the lookup period (``engine_lookup_every_ms``, default
``pane_ms``), so a budget shorter than one period would mean nothing: :func:`check_budget`
refuses it, as it refuses one longer than :data:`MAX_BUDGET_MS`.  Durations are written as the
rest of the CLI writes them: ``30s``, ``2m``, ``1.5h``, ``250ms``; a bare number is seconds;
``none`` (or an empty text) is no budget.
"""

from __future__ import annotations

from subscriptions.errors import InvalidBudget
from tidewatch.durations import parse_duration_ms
from tidewatch.settings import Settings

__all__ = [
    "HELP",
    "MAX_BUDGET_MS",
    "budget_input",
    "budget_text",
    "check_budget",
    "lookup_period_ms",
    "parse_budget",
]

#: the longest budget accepted (a day: beyond it a subscription is as good as paused)
MAX_BUDGET_MS = 24 * 3_600_000

#: what a budget means, in one line (the CLI's ``--staleness`` help and the dashboard's field)
HELP = (
    "How stale this subscription's results may get when the engine is overloaded: it is then "
    "looked up less often, never more than this apart, before latency grows for every "
    "subscription; every event still counts. Empty or 'none': never degraded."
)

_NONE = {"", "none", "off", "no"}


def lookup_period_ms(settings: Settings) -> int:
    """The engine's lookup period (:attr:`Settings.lookup_period_ms`)."""
    return settings.lookup_period_ms


def parse_budget(text: str | None) -> int | None:
    """``'30s'``, ``'2m'``, ``'1.5h'``, ``'250ms'``, ``'45'`` (seconds) -> milliseconds;
    ``'none'`` or empty -> None.  :class:`InvalidBudget` (``NOT_A_DURATION``) otherwise; the
    range is :func:`check_budget`'s."""
    if text is None or text.strip().lower() in _NONE:
        return None
    try:
        return parse_duration_ms(text)
    except ValueError:
        raise InvalidBudget(
            InvalidBudget.NOT_A_DURATION,
            f"the staleness budget {text.strip()[:40]!r} is not a duration: write e.g. 30s, 2m or 1h, "
            "or 'none' for no budget",
        ) from None


def check_budget(budget_ms: int | None, settings: Settings) -> int | None:
    """``budget_ms`` if it is a budget the engine can keep (None: no budget), else
    :class:`InvalidBudget` saying what to enter: a whole number of milliseconds, at least one
    lookup period (:func:`lookup_period_ms`) and at most :data:`MAX_BUDGET_MS`."""
    if budget_ms is None:
        return None
    if isinstance(budget_ms, bool) or not isinstance(budget_ms, int):
        raise InvalidBudget(
            InvalidBudget.NOT_A_DURATION,
            f"a staleness budget is a whole number of milliseconds, not {budget_ms!r}",
        )
    period = lookup_period_ms(settings)
    if budget_ms <= 0:
        raise InvalidBudget(
            InvalidBudget.NOT_POSITIVE,
            f"a staleness budget must be positive: enter at least {budget_text(period)}, "
            "or 'none' for no budget",
        )
    if budget_ms < period:
        raise InvalidBudget(
            InvalidBudget.BELOW_LOOKUP,
            f"a staleness budget of {budget_text(budget_ms)} is shorter than the engine's lookup "
            f"period ({budget_text(period)}), so it would change nothing: enter at least "
            f"{budget_text(period)}, or 'none' for no budget",
        )
    if budget_ms > MAX_BUDGET_MS:
        raise InvalidBudget(
            InvalidBudget.ABOVE_MAX,
            f"a staleness budget of {budget_text(budget_ms)} is longer than the most allowed "
            f"({budget_text(MAX_BUDGET_MS)}): enter a shorter one, or pause the subscription instead",
        )
    return budget_ms


def budget_text(budget_ms: int | float | None) -> str:
    """A budget (or a spacing) as a person reads it: ``none``, ``250 ms``, ``8 s``, ``1.5 s``,
    ``2 min``, ``2 min 30 s``, ``1 h``, ``1 h 30 min``, ``24 h``."""
    if budget_ms is None:
        return "none"
    ms = float(budget_ms)
    if ms < 1000:
        return f"{ms:,.0f} ms"
    if ms < 60_000:
        return f"{round(ms / 1000, 1):g} s"
    s = round(ms / 1000)
    if s < 3600:
        m, rest = divmod(s, 60)
        return f"{m} min" + (f" {rest} s" if rest else "")
    h, rest = divmod(round(s / 60), 60)
    return f"{h} h" + (f" {rest} min" if rest else "")


def budget_input(budget_ms: int | None) -> str:
    """A budget as text :func:`parse_budget` reads back exactly: ``''`` (none), ``2h``,
    ``30m``, ``45s``, ``1500ms``."""
    if budget_ms is None:
        return ""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if budget_ms % size == 0:
            return f"{budget_ms // size}{unit}"
    return f"{budget_ms}ms"
