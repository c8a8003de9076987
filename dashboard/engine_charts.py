"""Key detail's charts computed by the engine: a request through PostgreSQL, polled for its answer.

The dashboard never talks to Spark.  :func:`request` inserts one row per (subscription, key)
into ``chart_requests`` (:class:`tidewatch.db.models.ChartRequest`); the engine answers it from
the state it holds (:mod:`engine.sinks.charts`, :func:`engine.evaluation.key_series.key_series`:
every aggregate of the rule at each pane boundary of the rule's window, points whose window
reaches before the engine's retained history marked partial); :func:`wait` polls the rows until
all are answered or ``settings.dashboard_chart_wait_s`` is spent.  :func:`frames` turns an answer
into the frames :func:`dashboard.charts.aggregate_chart` draws; :func:`no_answer_text` says
plainly, for a request left unanswered or answered with an error code, what happened and what to
do.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import insert, select
from sqlalchemy.orm import Session, sessionmaker

from dashboard.timefmt import span_text, utc_text
from tidewatch.db.models import ChartRequest

#: error codes of the engine's answers (:data:`engine.sinks.charts.ERRORS`), what to say
_ERROR_TEXT = {
    "unknown_subscription": "The engine does not hold this subscription (yet): a new or changed rule "
    "reaches it within seconds through the outbox relay; a rule the engine refused is logged by it. "
    "Try again in a moment; if it stays, check `tidewatch status`.",
    "no_state": "The engine has not evaluated any data yet (starting or replaying). Try again in a moment.",
    "expired": "The engine took too long to pick up the request (it is behind). Try again in a moment.",
    "failed": "The engine could not compute this chart (its log says why).",
}


@dataclass(frozen=True)
class Answer:
    """A request's state: ``answer`` (the engine's JSON) or ``error`` (a code), both None when
    the engine did not answer within the wait."""

    request_id: int
    answer: dict[str, Any] | None
    error: str | None

    @property
    def answered(self) -> bool:
        return self.answer is not None or self.error is not None


def request(sessions: sessionmaker[Session], wanted: list[tuple[uuid.UUID, str]]) -> list[int]:
    """Insert one chart request per (subscription id, key); their ids, in order.  The caller has
    checked that the subscriptions are the user's."""
    if not wanted:
        return []
    with sessions() as s, s.begin():
        rows = s.execute(
            insert(ChartRequest).returning(ChartRequest.id),
            [{"subscription_id": sid, "key": key} for sid, key in wanted],
        ).all()
    return [int(r[0]) for r in rows]


def poll(sessions: sessionmaker[Session], ids: list[int]) -> dict[int, Answer]:
    """The requests' current state."""
    with sessions() as s:
        rows = s.execute(
            select(ChartRequest.id, ChartRequest.answer, ChartRequest.error).where(ChartRequest.id.in_(ids))
        ).all()
    return {int(r[0]): Answer(int(r[0]), r[1], r[2]) for r in rows}


def wait(
    sessions: sessionmaker[Session], ids: list[int], wait_s: float, poll_s: float = 0.25
) -> dict[int, Answer]:
    """Poll until every request is answered or ``wait_s`` is spent; the state of each."""
    deadline = time.monotonic() + wait_s
    got = poll(sessions, ids)
    while not all(a.answered for a in got.values()) and time.monotonic() < deadline:
        time.sleep(poll_s)
        got = poll(sessions, ids)
    return {i: got.get(i, Answer(i, None, None)) for i in ids}


def no_answer_text(a: Answer, wait_s: float) -> str:
    """What to tell the user when the engine gave no chart."""
    if a.error is not None:
        return _ERROR_TEXT.get(a.error, f"The engine answered with error {a.error!r}.")
    return (
        f"The engine did not answer within {wait_s:g} s: it is not running or is behind. "
        "Check Health (or `tidewatch status`; `tidewatch restart engine` restarts it), or use the "
        "Kafka fallback below."
    )


def frames(answer: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """Per aggregate text: a (time, value, kind, window) frame of the engine's series
    (``window``: ``whole`` or ``partial``); aggregates the engine did not chart are left out
    (:func:`not_charted` lists them)."""
    when = pd.to_datetime(np.asarray(answer.get("times", []), np.int64), unit="ms", utc=True)
    out: dict[str, pd.DataFrame] = {}
    for a in answer.get("aggregates", []):
        if a.get("reason"):
            continue
        vals = np.array([np.nan if v is None else v for v in a["values"]], np.float64)
        window = np.where(np.asarray(a["partial"], bool), "partial", "whole")
        out[a["text"]] = pd.DataFrame({"time": when, "value": vals, "kind": "engine", "window": window})
    return out


def not_charted(answer: dict[str, Any]) -> list[str]:
    """The aggregates the engine could not chart (e.g. ROWS windows without raw events held)."""
    return [a["text"] for a in answer.get("aggregates", []) if a.get("reason")]


def caption(answer: dict[str, Any]) -> str:
    """One line under the charts: as of when, and what is partial and why."""
    parts = [f"Computed by the engine from its state, as of {utc_text(int(answer['until']))}."]
    held = answer.get("held_from")
    if held is not None and any(any(a.get("partial", [])) for a in answer.get("aggregates", [])):
        kept = answer.get("history_ms")
        keep = f" (engine_history_ms = {span_text(int(kept) // 1000)})" if kept else ""
        parts.append(
            f"The engine holds this stream's events after {utc_text(int(held))}{keep}: points whose window "
            "reaches further back are drawn faint (computed from part of their window). A history of twice "
            "the rule's window makes every point whole (docs/engine.md, 'Key-page charts')."
        )
    return " ".join(parts)
