"""Alert storms: the rule that says the engine's alert rate is far above usual, as pure functions.

The Health view (:func:`dashboard.queries.health`) reads the recent ``engine_metrics`` rows --
(commit time, the batch's alerts, its ``top_alerts``: ``{subscription id: alerts}`` of its top
subscriptions) -- and hands them to :func:`detect`.  The rule:

* **the rate**: :func:`rate_per_s` over the batches of the last :data:`WINDOW_S` seconds before
  the newest one (the span logic of :func:`dashboard.queries.input_rate`: the oldest batch of
  the window starts the span, the others' alerts over it; when the newest batch is the only one
  in the window -- batches slower than the window, as in a storm that holds the engine up --
  the span starts at the batch before it);
* **usual**: the median of the per-minute alert rates (alerts / 60 s) of the one-minute
  buckets of the :data:`BASELINE_S` seconds before the window that hold at least one batch
  (minutes without a batch -- the engine not running -- do not count); none such (the engine
  just started): no usual rate;
* **a storm** when the rate is at least ``storm_factor`` times the usual rate *and* at least
  ``storm_min_alerts_per_s`` (settings); with no usual rate, only the absolute floor applies.

The storm names the subscription with the most alerts in the window: ``top_alerts`` summed over
the window's counted batches (each batch lists its top three only, so its count -- and its share
of the window's alerts -- is a lower bound).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: the window of the current alert rate, seconds before the newest batch (the Health view's
#: rates, :data:`dashboard.queries.RATE_WINDOW_S`, are over the same window)
WINDOW_S = 60.0
#: the span before the window whose minutes give the usual rate
BASELINE_S = 900.0
#: the width of a baseline bucket
MINUTE_S = 60.0


@dataclass(frozen=True)
class Storm:
    """An alert storm found by :func:`detect`: the rate, the usual rate (None: no history), the
    threshold it crossed and the subscription with the most alerts in the window."""

    alerts_per_s: float
    usual_per_s: float | None
    threshold_per_s: float
    factor: float
    floor_per_s: float
    #: the window's alerts (those counted in the rate)
    alerts: int
    #: the subscription (UUID text) with the most alerts in the window, and at least how many
    subscription_id: str | None = None
    subscription_alerts: int = 0
    #: its name, when the logged-in user owns it (set by :func:`dashboard.queries.health`)
    subscription_name: str | None = None

    @property
    def share(self) -> float:
        """At least this share (0..1) of the window's alerts came from :attr:`subscription_id`."""
        return self.subscription_alerts / self.alerts if self.alerts else 0.0

    @property
    def rule(self) -> str:
        """The rule that fired, in words, with the usual rate it was measured against."""
        if self.usual_per_s is None:
            return (
                f"≥ {self.floor_per_s:,.0f} alerts/s over the last {WINDOW_S:g} s "
                "(no earlier minute to compare with)"
            )
        return (
            f"≥ {self.factor:g}× the median minute of the previous {BASELINE_S / 60:g} min "
            f"({self.usual_per_s:,.1f}/s) and ≥ {self.floor_per_s:,.0f} alerts/s over the last {WINDOW_S:g} s"
        )

    def banner(self, name_md: str | None, status: str, lag_ms: float | None) -> str:
        """The Health view's warning: the rate against the usual one, the subscription behind it
        (``name_md``: its name already made safe for Markdown, or None for another user's
        subscription) and whether the engine keeps up (``status`` and ``lag_ms`` of the engine's
        verdict)."""
        median = f"the median minute of the previous {BASELINE_S / 60:g} min"
        if self.usual_per_s is None:
            usual = "no usual rate yet (the engine has no earlier minute)"
        elif self.usual_per_s > 0:
            usual = (
                f"{self.alerts_per_s / self.usual_per_s:,.0f}× the usual {self.usual_per_s:,.1f}/s ({median})"
            )
        else:
            usual = f"where the usual rate is 0/s ({median})"
        text = f"Alert storm: {self.alerts_per_s:,.0f} alerts/s over the last {WINDOW_S:g} s, {usual}."
        if self.subscription_id is not None:
            who = f"'{name_md}'" if name_md is not None else "another user's subscription"
            text += (
                f" Most of it from {who} ({short_id(self.subscription_id)}): at least "
                f"{self.share:.0%} of the alerts."
            )
        lag = "" if lag_ms is None else f" (lag {lag_ms / 1000:,.1f} s)"
        if status == "ok":
            text += f" The engine is keeping up{lag}."
        elif status == "behind":
            text += f" The engine is not keeping up{lag}."
        else:  # the figures are those of its last batches, however old
            text += f" The engine is {status}: these are its last batches' figures (see the status above)."
        return text


def short_id(subscription_id: str) -> str:
    """The first 8 characters of a subscription's id (as the pages show it)."""
    return subscription_id[:8]


def rule_text(factor: float, floor_per_s: float) -> str:
    """The storm rule in words, for any time (the settings' factor and floor)."""
    return (
        f"alerts/s over the last {WINDOW_S:g} s ≥ {factor:g}× the median minute of the previous "
        f"{BASELINE_S / 60:g} min and ≥ {floor_per_s:,.0f} (only the latter without an earlier minute)"
    )


def rate_per_s(times_s: Sequence[float], counts: Sequence[float], window_s: float = WINDOW_S) -> float | None:
    """Counts per second (see the module docstring, "the rate") from batches committed at
    ``times_s`` (sorted or not); None with fewer than two batches or no span."""
    span = _span(np.asarray(times_s, np.float64), window_s)
    if span is None:
        return None
    t, order, first = span
    c = np.nan_to_num(np.asarray(counts, np.float64))[order]
    return float(c[first + 1 :].sum() / (t[-1] - t[first]))


def _span(t: np.ndarray, window_s: float) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(times sorted, their order, index of the batch starting the span), None without a span."""
    if len(t) < 2:
        return None
    order = np.argsort(t, kind="stable")
    t = t[order]
    first = int(np.searchsorted(t, t[-1] - window_s, side="left"))
    if first == len(t) - 1:
        first -= 1  # the newest batch alone in the window: the span starts at the one before
    first = int(np.searchsorted(t, t[first], side="left"))  # ties: the span starts at the first
    if t[-1] - t[first] <= 0:
        return None
    return t, order, first


def usual_rate(times_s: np.ndarray, counts: np.ndarray, end_s: float) -> float | None:
    """The median of the per-minute rates of the one-minute buckets of :data:`BASELINE_S` before
    ``end_s`` that hold a batch (batches at ``end_s`` or later are not counted); None when none."""
    back = end_s - times_s
    inside = (back > 0) & (back <= BASELINE_S)
    if not inside.any():
        return None
    bucket = np.floor((back[inside] - 1e-9) / MINUTE_S).astype(np.int64)
    n = int(BASELINE_S // MINUTE_S) + 1
    alerts = np.bincount(bucket, weights=counts[inside], minlength=n)
    held = np.bincount(bucket, minlength=n) > 0
    return float(np.median(alerts[held] / MINUTE_S))


def detect(
    times_s: Sequence[float],
    alerts: Sequence[float | None],
    top_alerts: Sequence[Mapping[str, int] | None],
    *,
    factor: float,
    floor_per_s: float,
) -> Storm | None:
    """The storm the batches show (the rule of the module docstring), or None: batches committed
    at ``times_s`` (epoch seconds, any order) with ``alerts`` each and their ``top_alerts``
    (``{subscription id: alerts}``, None or ``{}`` when unknown)."""
    t_all = np.asarray(times_s, np.float64)
    span = _span(t_all, WINDOW_S)
    if span is None:
        return None
    t, order, first = span
    a = np.nan_to_num(np.asarray([0 if x is None else x for x in alerts], np.float64))[order]
    rate = float(a[first + 1 :].sum() / (t[-1] - t[first]))
    usual = usual_rate(t, a, t[-1] - WINDOW_S)
    threshold = max(floor_per_s, factor * usual) if usual is not None else floor_per_s
    if rate < threshold:
        return None
    tops: Counter[str] = Counter()
    for i in order[first + 1 :].tolist():  # per batch (a few dozen a minute), not per alert
        tops.update(top_alerts[i] or {})
    top = min(tops.items(), key=lambda kv: (-kv[1], kv[0])) if tops else None
    return Storm(
        alerts_per_s=rate,
        usual_per_s=usual,
        threshold_per_s=threshold,
        factor=factor,
        floor_per_s=floor_per_s,
        alerts=int(a[first + 1 :].sum()),
        subscription_id=None if top is None else top[0],
        subscription_alerts=0 if top is None else int(top[1]),
    )
