"""Health: engine status from ``engine_metrics`` and the engine's run record, with a banner when
it is behind or down (its cause and what to do: :func:`engine.liveness.verdict`, the rule
``tidewatch status`` uses too), and a warning during an alert storm (:mod:`dashboard.storm`: the
rate, the subscription behind it -- its name only when the user owns it -- and whether the
engine keeps up), and the subscriptions the engine looks up less often under overload, within
their staleness budgets (:mod:`dashboard.degraded`; named only for their owner)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, queries
from dashboard.degraded import Degradation
from dashboard.driver_load import DriverLoad
from dashboard.per_engine import Newest
from dashboard.timefmt import as_utc, utc_text
from dashboard.ui import current_user, plain, sessions
from tidewatch.settings import Settings


def render(settings: Settings) -> None:
    h = queries.health(sessions(settings), settings, username=current_user().username)
    {"ok": st.success, "behind": st.warning, "down": st.error}.get(h.status, st.info)(h.banner)
    if h.storm is not None:
        name = None if h.storm.subscription_name is None else plain(h.storm.subscription_name)
        st.warning(h.storm.banner(name, h.status, h.lag_ms), icon="⚡")
        st.caption(f"Alert storm rule: {h.storm.rule}.")
    _degraded(h.degraded)
    if h.lost_banner:
        st.error(h.lost_banner)
    if h.restarts:
        st.warning(
            f"The engine was started again {h.restarts:,} time(s) after it failed or was killed "
            "(`tidewatch status` shows its supervisor's restarts and log)."
        )
    # two rows of four: eight figures in one row cut the wider values short ("16:37…")
    top, bottom = st.columns(4), st.columns(4)
    top[0].metric(
        "events/s",
        "-" if h.events_per_s is None else f"{h.events_per_s:,.0f}",
        help=f"events taken in per second, over the last {queries.RATE_WINDOW_S:g} s of batches",
    )
    top[1].metric(
        "alerts/s",
        "-" if h.alerts_per_s is None else f"{h.alerts_per_s:,.{1 if h.alerts_per_s < 10 else 0}f}",
        help=f"alerts committed per second, over the last {queries.RATE_WINDOW_S:g} s of batches; "
        f"an alert storm: {h.storm_rule}",
    )
    worst = _of_engines(h, "largest")
    top[2].metric(
        "lag",
        "-" if h.lag_ms is None else f"{h.lag_ms / 1000:,.1f} s",
        help="at the newest batch, how long ago (wall clock) the newest event taken in happened" + worst,
    )
    top[3].metric(
        "dead letters",
        f"{h.dead_letters_total:,}",
        delta=f"{h.dead_letters_recent:,} recent" if h.dead_letters_recent else None,
        delta_color="inverse",
    )
    bottom[0].metric(
        "batch duration",
        "-" if h.batch_ms is None else f"{h.batch_ms:,.0f} ms",
        help="the newest batch's evaluation time" + worst,
    )
    bottom[1].metric(
        "processing capacity",
        "-" if h.capacity_per_s is None else f"{h.capacity_per_s:,.0f}/s",
        help="the newest batch's events over its evaluation time: how fast the engine could go"
        + ("" if not h.engines else f"; the sum of the {len(h.engines)} engines' newest batches"),
    )
    bottom[2].metric(
        "last batch (UTC)",
        "-" if h.last_batch_at is None else as_utc(h.last_batch_at).strftime("%H:%M:%S"),
        help=None
        if not h.engines
        else f"the newest batch of the engine that committed least recently of {len(h.engines)}",
    )
    bottom[3].metric(
        "delivery",
        "-" if h.delivery_ms is None else f"{h.delivery_ms:,.0f} ms",
        help="the newest delivered batch, from the end of its evaluation until its alerts were "
        "committed to PostgreSQL and to Kafka (Kafka's consumers see them from then on); the "
        "alert log and current results shown here are written right behind that"
        + ("" if h.expansion_ms is None else f", in {h.expansion_ms:,.0f} ms the last time")
        + _of_engines(h, "slowest"),
    )
    if h.engines:
        st.caption("engines: " + "; ".join(_engine_line(e) for e in h.engines))
    _driver(h.drivers)
    if h.watermark is not None:
        st.caption(f"watermark {utc_text(h.watermark)}, batch {h.last_batch_id}")
    if h.series:
        df = pd.DataFrame(h.series)
        c = st.columns(4)
        for col, (field, title) in zip(
            c,
            [
                ("events_per_s", "processing capacity (events/s)"),
                ("batch_ms", "batch duration (ms)"),
                ("lag_ms", "lag (ms)"),
                ("alerts_per_s", "alerts/s (per batch)"),
            ],
            strict=True,
        ):
            col.altair_chart(charts.metric_chart(df, field, title), width="stretch")


def _of_engines(h: queries.Health, which: str) -> str:
    """A help text's tail saying a top figure is ``which`` of several engines' newest batches;
    empty with one engine."""
    return "" if not h.engines else f"; the {which} of the {len(h.engines)} engines' newest batches"


def _driver(drivers: dict[str, DriverLoad]) -> None:
    """The driver's share of a core and where it saturates one: the part more executors do not
    scale (:mod:`dashboard.driver_load`).  With several engines on the database, the busiest
    driver's figures, and every engine's in a line below."""
    row = st.columns(4)
    why = (
        "The engine's driver merges the executors' pane rows, evaluates the shared indexes and "
        "delivers the alerts: adding Spark executors does not spread that work."
    )
    if not drivers:
        row[0].metric("driver CPU", "-", help=f"{why} Shown once two batches have reported it.")
        return
    engine, d = next(iter(drivers.items()))
    whose = (
        "" if len(drivers) == 1 else f" Engine '{engine}', the busiest of {len(drivers)} engines' drivers."
    )
    row[0].metric(
        "driver CPU",
        f"{d.share:.0%} of a core",
        help=f"CPU of the engine's driver process, all its threads, over the last {d.seconds:,.0f} s "
        f"of batches. {why}{whose}",
    )
    several = "" if len(drivers) == 1 else "; each engine's is its own input's"
    shown = _ceiling(d)
    if d.fit_ceiling_per_s is not None:
        how = (
            f"From a line fitted to the CPU of the last {d.seconds:,.0f} s of batches against their "
            f"events: {max(d.fixed_ms_per_batch or 0.0, 0.0):,.1f} ms fixed per batch, "
            f"{d.marginal_us_per_event:,.3f} µs per event, at {d.batches_per_s:,.2f} batches per "
            "second; more rules or more alerts per event lower it. Counting the fixed costs as "
            f"per-event, the bound from below is {_si(d.ceiling_per_s or 0.0)}/s"
        )
    else:
        how = (
            "At its current CPU per event"
            + ("" if d.us_per_event is None else f" ({d.us_per_event:,.2f} µs)")
            + "; more rules or more alerts per event lower it. A lower bound: the driver's fixed "
            "costs (each batch's, the chart answers) count as per-event here, so while the input "
            "is light the real ceiling is well above it (too few batches, or their sizes too "
            "alike, for a line through their CPU to tell the two apart)"
        )
    row[1].metric(
        "driver ceiling",
        "-" if shown is None else f"{shown[0]} {_si(shown[1])}/s",
        help="the input rate, in events per second, one core of the driver carries: past it the "
        f"driver is the bottleneck, whatever the executors. {how}{several}",
    )
    if len(drivers) > 1:
        st.caption(
            "drivers: "
            + "; ".join(f"{e} {x.share:.0%} of a core" + _ceiling_words(x) for e, x in drivers.items())
        )


def _ceiling(d: DriverLoad) -> tuple[str, float] | None:
    """A driver's ceiling as shown: ("≈", the fit's) where there is a reliable fit, else ("≥",
    the bound); None without either."""
    if (fitted := d.fit_ceiling_per_s) is not None:
        return "≈", fitted
    return None if d.ceiling_per_s is None else ("≥", d.ceiling_per_s)


def _ceiling_words(d: DriverLoad) -> str:
    """A driver's ceiling in a few words, for the line of every engine's driver."""
    shown = _ceiling(d)
    return "" if shown is None else f", {shown[0]} {_si(shown[1])} events/s"


def _engine_line(e: Newest) -> str:
    """One engine's newest batch in a few words: its id, lag, batch time and when."""
    return (
        f"{e.engine} lag {'-' if e.lag_ms is None else f'{e.lag_ms / 1000:,.1f} s'}, "
        f"batch {'-' if e.batch_ms is None else f'{e.batch_ms:,.0f} ms'}, "
        f"last {as_utc(e.at).strftime('%H:%M:%S')}"
    )


def _si(x: float) -> str:
    """``x`` in a short form: 3.2 M, 850 k, 1.3 k, 900."""
    if x >= 1e6:
        return f"{x / 1e6:,.1f} M"
    if x >= 1e4:
        return f"{x / 1e3:,.0f} k"
    if x >= 1e3:
        return f"{x / 1e3:,.1f} k"
    return f"{x:,.0f}"


#: at most this many degraded subscriptions are listed one by one
LISTED = 50


def _degraded(d: Degradation) -> None:
    """The newest batch's degraded subscriptions, one line each; nothing when there is none."""
    if not d.items:
        return
    st.subheader("Degraded subscriptions")
    st.caption(
        f"As of the engine's batch at {utc_text(d.as_of)}: the input outruns the engine, so it keeps "
        "every event exact but looks these subscriptions up less often, each within its staleness "
        "budget (loosest budgets first). Subscriptions without a budget are never degraded."
    )
    lines = ["- " + plain(x.text(x.name)) for x in d.items[:LISTED]]
    if len(d.items) > LISTED:
        lines.append(f"- … and {len(d.items) - LISTED:,} more")
    st.markdown("\n".join(lines))
