"""The engine's run record and the one rule of its health (issue #21).

Two readers must say the same thing about the engine: the dashboard's Health page
(:func:`dashboard.queries.health`) and ``tidewatch status`` (:func:`check`).  Both call
:func:`verdict` on the same inputs: the time of the newest batch in PostgreSQL, the recent lag
series (:func:`observe`) and the engine's *run record* (:func:`read_record`).

Run record
    ``tidewatch engine run`` writes one small JSON file per engine id,
    ``<run_dir>/engine/<engine_id>.run.json``: ``started`` when it starts, then ``stopped`` (a
    SIGTERM / SIGINT, a clean stop) or ``failed`` (its fatal error: type, first line of the
    message, and a hint naming the setting to fix).  A file, not a table: the engine that cannot
    reach its database (a wrong password, the issue's proof) must still say why.  It is read by
    processes on the same host -- the embedded stack; a dashboard elsewhere sees no record and
    Health falls back to the age rule below.  A ``started`` record keeps the previous run's
    failure (``previous``), so a crash loop is explained while the engine restarts.

The rule (:func:`verdict`), first match wins; ``last`` is the newest committed batch:

1. the record is newer than ``last`` (or there is no batch) and says ``failed``: **down**, its
   error and hint;
2. ... says ``stopped``: **down**, stopped at that time;
3. ... says ``started``: **starting** within ``engine_down_after_s`` of the start, else **down**
   ("started, no batch since");
4. no batch and no record: **unknown**;
5. ``last`` older than ``engine_down_after_s``: **down** (not running, or no events arrive);
6. :func:`lag_behind` over the recent lag series: **behind**;
7. **ok**.

Several engines on one database (each its ``--engine-id``: shards by key, a second deployment)
are judged apart (:func:`judge`): each engine by the rule above, over its own batches and its own
run record, and the verdict is the worst of them, naming the engine -- one engine that stopped
is not hidden by another one's newer batches.  An engine counts while its newest batch is within
:data:`ENGINES_WITHIN_S` of the newest of any.  (A run record alone does not make an engine
count: the records of a run directory need not be of this database's engines.)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from engine.errors import CheckpointMismatch
from tidewatch.settings import Settings

Kind = Literal["started", "stopped", "failed"]
#: share of ``engine_behind_lag_ms`` the lag must fall below to leave "behind" (hysteresis)
LEAVE_BEHIND = 0.8
#: consecutive batches over (under) the threshold that enter (leave) "behind"
SUSTAIN = 3
#: "behind" is said "catching up" when the newest lag is below this share of the largest of the
#: last CATCH_UP_BATCHES batches' (a backlog being drained, e.g. a feed's history backfill)
CATCHING_UP, CATCH_UP_BATCHES = 0.9, 10
RESTART = "`tidewatch restart engine`"
#: an engine whose newest batch is more than this before the newest batch of any engine is no
#: longer judged: a retired shard, a deployment moved to another database
ENGINES_WITHIN_S = 3600.0
#: which verdict of several engines is named: the highest
_SEVERITY = {"ok": 0, "unknown": 1, "starting": 2, "behind": 3, "down": 4}
_SECRET_URL = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")


@dataclass(frozen=True)
class RunRecord:
    """The newest event of one engine's life: ``started``, ``stopped`` or ``failed``."""

    engine_id: str
    kind: Kind
    at: datetime
    error_type: str = ""
    message: str = ""
    hint: str = ""
    previous: str = ""  # a ``started`` record: the failure of the run before ("" for none)
    #: starts after a run that did not stop cleanly (it failed, or was killed: its record still
    #: said ``started``) -- the restarts a supervisor made, carried from record to record
    restarts: int = 0

    @property
    def failure(self) -> str:
        """``type: message`` of a ``failed`` record."""
        return f"{self.error_type}: {self.message}" if self.error_type else self.message

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"at": self.at.isoformat()})

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        d: dict[str, Any] = json.loads(text)
        d["at"] = datetime.fromisoformat(d["at"])
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class Verdict:
    """The engine's status (``ok``, ``behind``, ``starting``, ``down``, ``unknown``), one sentence
    of cause and what to do (``hint``, "" when nothing)."""

    status: str
    cause: str
    hint: str = ""

    @property
    def text(self) -> str:
        return f"{self.cause} {self.hint}".strip()


@dataclass(frozen=True)
class Observed:
    """What PostgreSQL says of the engine: newest batch time, lag series (oldest first), now."""

    last_at: datetime | None
    lags_ms: Sequence[float | None] = field(default_factory=list)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


# --- the run record -----------------------------------------------------------------------------


def record_dir(settings: Settings) -> Path:
    return settings.run_dir / "engine"


def record_path(settings: Settings, engine_id: str) -> Path:
    return record_dir(settings) / f"{engine_id}.run.json"


def write_record(settings: Settings, rec: RunRecord) -> None:
    """Write ``rec`` atomically (a temporary file renamed over the old one), with the restart
    count of the record before it (one more for a start after an unclean end)."""
    prev = read_record(settings, rec.engine_id)
    if prev is not None:
        crash = rec.kind == "started" and prev.kind in ("started", "failed")
        rec = replace(rec, restarts=prev.restarts + (1 if crash else 0))
    path = record_path(settings, rec.engine_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(rec.to_json())
    os.replace(tmp, path)


def read_record(settings: Settings, engine_id: str | None = None) -> RunRecord | None:
    """The record of ``engine_id``, or (None) the newest of every engine's; None when none can
    be read."""
    if engine_id is None:
        return newest_record(read_records(settings))
    return _read(record_path(settings, engine_id))


def read_records(settings: Settings) -> dict[str, RunRecord]:
    """Every engine's run record by engine id (one that cannot be read is left out)."""
    recs = (_read(p) for p in sorted(record_dir(settings).glob("*.run.json")))
    return {r.engine_id: r for r in recs if r is not None}


def newest_record(records: Mapping[str, RunRecord]) -> RunRecord | None:
    """The newest of ``records`` (None when there is none)."""
    return max(records.values(), key=lambda r: r.at, default=None)


def _read(path: Path) -> RunRecord | None:
    try:
        return RunRecord.from_json(path.read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None


def started(settings: Settings, engine_id: str, now: datetime | None = None) -> RunRecord:
    """The ``started`` record of a run, carrying the previous run's failure."""
    prev = read_record(settings, engine_id)
    failure = prev.failure if prev is not None and prev.kind == "failed" else ""
    if prev is not None and prev.kind == "started":
        failure = prev.previous  # it died without a record (SIGKILL): keep what was known
    return RunRecord(engine_id, "started", now or datetime.now(UTC), previous=failure)


def failed(engine_id: str, exc: BaseException, settings: Settings, now: datetime | None = None) -> RunRecord:
    """The ``failed`` record of ``exc`` (:func:`describe`)."""
    error_type, message, hint = describe(exc, settings)
    return RunRecord(engine_id, "failed", now or datetime.now(UTC), error_type, message, hint)


def _modules(exc: BaseException) -> set[str]:
    return {c.__module__.split(".")[0] for c in type(exc).__mro__}


def describe(exc: BaseException, settings: Settings) -> tuple[str, str, str]:
    """``(error type, message, hint)`` of the engine's fatal error: the message is the first
    non-empty line of the error (a password in a URL masked, at most 300 characters), the hint
    names the setting to check, by the error's type (never its text) and, for PostgreSQL, its
    SQLSTATE."""
    cause: BaseException = exc
    while cause.__cause__ is not None and type(cause).__name__ in ("Exit", "RetryError"):
        cause = cause.__cause__
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    message = _SECRET_URL.sub(r"\1***@", lines[0] if lines else type(cause).__name__)[:300]
    mods = _modules(cause)
    log = settings.run_dir / "logs" / "engine.log"
    if "sqlalchemy" in mods or "psycopg" in mods:
        orig = getattr(cause, "orig", cause)
        code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)  # psycopg 3, psycopg2
        what = "user and password" if code in ("28P01", "28000") else "host, port, user and password"
        hint = (
            f"Check `database_url` ({what}; TIDEWATCH_DATABASE_URL) in the settings and that "
            f"PostgreSQL runs, then {RESTART}."
        )
    elif "confluent_kafka" in mods:
        hint = (
            "Check `kafka_bootstrap` (TIDEWATCH_KAFKA_BOOTSTRAP) and the Kafka security settings, "
            f"and that Kafka runs, then {RESTART}."
        )
    elif isinstance(cause, CheckpointMismatch):
        hint = (
            "The checkpoint directory does not fit this engine or its settings: the message says "
            f"how to go on (the whole of it in the engine's log, {log}); then {RESTART}."
        )
    elif "pydantic" in mods or "pydantic_core" in mods:
        hint = f"Fix the setting named above (.env or TIDEWATCH_* variables), then {RESTART}."
    elif "py4j" in mods or "pyspark" in mods:
        hint = f"Spark failed: the cause is in the engine's log ({log}); then {RESTART}."
    else:
        hint = f"The engine's log has the details ({log}); fix the cause, then {RESTART}."
    return type(cause).__name__, message, hint


# --- the rule -----------------------------------------------------------------------------------


def lag_behind(
    lags_ms: Sequence[float | None], enter_ms: float, leave_ms: float, sustain: int = SUSTAIN
) -> bool:
    """Is the engine behind after the lag series ``lags_ms`` (oldest first)?  Hysteresis: it
    enters "behind" after ``sustain`` consecutive lags above ``enter_ms`` and leaves it only
    after ``sustain`` consecutive lags below ``leave_ms`` (< ``enter_ms``); a lag between the two
    keeps the state.  Missing values (None, NaN) are skipped.  A lag hovering at the threshold
    (9.8 s against 10 s) therefore gives one answer, not a flicker."""
    state, over, under = False, 0, 0
    for v in lags_ms:
        if v is None or v != v:
            continue
        over = over + 1 if v > enter_ms else 0
        under = under + 1 if v < leave_ms else 0
        if not state and over >= sustain:
            state = True
        elif state and under >= sustain:
            state = False
    return state


def ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def verdict(obs: Observed, settings: Settings, record: RunRecord | None) -> Verdict:
    """The engine's status by the rule of the module docstring (pure)."""
    now, last = obs.now, obs.last_at
    down_s = settings.engine_down_after_s
    log = settings.run_dir / "logs" / "engine.log"
    if record is not None and (last is None or record.at >= last):
        at = f"{record.at.astimezone(UTC):%H:%M:%S} UTC"
        if record.kind == "failed":
            return Verdict(
                "down", f"The engine is down: it stopped on an error at {at}: {record.failure}", record.hint
            )
        if record.kind == "stopped":
            return Verdict(
                "down",
                f"The engine is down: it was stopped at {at} (a clean stop).",
                f"Start it with {RESTART} (or `tidewatch up`).",
            )
        since = (now - record.at).total_seconds()
        before = f" Its previous run failed: {record.previous}" if record.previous else ""
        if since <= down_s:
            return Verdict(
                "starting", f"The engine started at {at} and has not committed a batch yet.{before}"
            )
        return Verdict(
            "down",
            f"The engine looks down: it started {ago(since)} ago and has committed no batch since "
            f"(more than {down_s:g} s): it is stuck, or no events arrive.{before}",
            f"Its log: {log}; `tidewatch status` shows whether it runs.",
        )
    if last is None:
        return Verdict(
            "unknown", "The engine has not reported any batch yet: it is not running, or has just started."
        )
    age = (now - last).total_seconds()
    if age > down_s:
        return Verdict(
            "down",
            f"The engine looks down: its last batch was {ago(age)} ago (more than {down_s:g} s): "
            "it is not running, or no events arrive. Alerts and results are not current.",
            f"`tidewatch status` shows whether it runs; its log: {log}.",
        )
    enter = settings.engine_behind_lag_ms
    if lag_behind(obs.lags_ms, enter, enter * LEAVE_BEHIND):
        lags = [v for v in obs.lags_ms if v is not None and v == v]
        lag = lags[-1] if lags else None
        shown = "" if lag is None else f"lag {lag / 1000:.1f} s, "
        recent = lags[-CATCH_UP_BATCHES:]
        if lag is not None and len(recent) >= SUSTAIN and lag < CATCHING_UP * max(recent):
            return Verdict(
                "behind",
                f"The engine is behind and catching up: {shown}down from {max(recent) / 1000:.0f} s "
                f"over its last {len(recent)} batches. It is reading a backlog at full speed -- "
                "e.g. a feed's history backfill at start, or events that piled up while it was "
                "stopped; alerts from the backlog arrive late, live ones once it has caught up.",
            )
        return Verdict(
            "behind",
            f"The engine is behind: {shown}over {enter / 1000:g} s for {SUSTAIN}+ batches "
            f"(clears below {enter * LEAVE_BEHIND / 1000:g} s). Alerts arrive late.",
        )
    return Verdict("ok", f"The engine is running: last batch {ago(age)} ago.")


def judge(
    obs: Observed, engines: Mapping[str, Observed], settings: Settings, records: Mapping[str, RunRecord]
) -> Verdict:
    """The verdict over every engine (pure): ``obs`` is all the batches together (:func:`observe`),
    ``engines`` each engine's own (:func:`observe_engines`), ``records`` each engine's run record.

    One engine with batches, or none: :func:`verdict` of ``obs`` and the newest record, the rule
    above (an engine that failed before its first batch is told by its record).  Several: each
    by :func:`verdict` over its own batches and its own record, at ``obs.now``: **ok** when all
    are ("All N engines are running"), else the worst one's verdict, its cause prefixed with the
    engine's id and followed by how many others are not ok."""
    if len(engines) <= 1:
        return verdict(obs, settings, newest_record(records))
    newest = max((o.last_at for o in engines.values() if o.last_at is not None), default=None)
    per = {e: verdict(replace(o, now=obs.now), settings, records.get(e)) for e, o in sorted(engines.items())}
    bad = [e for e, v in per.items() if v.status != "ok"]
    if not bad:
        age = (obs.now - newest).total_seconds() if newest is not None else 0.0
        return Verdict("ok", f"All {len(per)} engines are running: last batch {ago(age)} ago.")
    worst = max(bad, key=lambda e: _SEVERITY.get(per[e].status, 0))
    v = per[worst]
    more = "" if len(bad) == 1 else f" ({len(bad)} of the {len(per)} engines are not ok: {', '.join(bad)}.)"
    return Verdict(v.status, f"Engine '{worst}' (of {len(per)}): {v.cause}{more}", v.hint)


# --- reading PostgreSQL -------------------------------------------------------------------------


def observe(session: Any, recent: int = 30) -> Observed:
    """The newest batch time (``engine_metrics``, else ``engine_batches``), the last ``recent``
    lags (oldest first) and the database's ``now()``, in an open SQLAlchemy ``session``:
    :func:`overall` of what it reads."""
    from sqlalchemy import func, select

    from tidewatch.db.models import EngineBatch, EngineMetric

    now = session.scalar(select(func.now()))
    rows = session.execute(
        select(EngineMetric.ts, EngineMetric.lag_ms).order_by(EngineMetric.id.desc()).limit(recent)
    ).all()
    committed = None if rows else session.scalar(select(func.max(EngineBatch.committed_at)))
    return overall(now if isinstance(now, datetime) else datetime.now(UTC), rows, committed, recent)


def overall(
    at: datetime, newest_first: Sequence[Any], last_committed: datetime | None, recent: int = 30
) -> Observed:
    """The :class:`Observed` of all engines together at ``at``: the newest of ``newest_first``
    (``engine_metrics`` rows, each with ``ts`` and ``lag_ms``, newest first) and the lags of its
    first ``recent``, oldest first; with no rows, ``last_committed`` (the newest
    ``engine_batches.committed_at``) as the newest batch time."""
    head = newest_first[:recent]
    return Observed(head[0].ts if head else last_committed, [r.lag_ms for r in reversed(head)], at)


def observe_engines(session: Any, recent: int = 30) -> dict[str, Observed]:
    """Each engine's :class:`Observed` from ``engine_metrics`` (its newest batch time and last
    ``recent`` lags, oldest first, at the database's ``now()``), for the engines with a batch
    within :data:`ENGINES_WITHIN_S` of the newest batch of any: :func:`observed` of
    :func:`recent_engine_rows`."""
    return observed(*recent_engine_rows(session, recent))


def recent_engine_rows(session: Any, recent: int = 30) -> tuple[datetime, dict[str, list[Any]]]:
    """The database's ``now()`` and each engine's last ``recent`` ``engine_metrics`` rows (oldest
    first; engines in the order of their ids), for the engines with a batch within
    :data:`ENGINES_WITHIN_S` of the newest batch of any; one query, ranked in PostgreSQL.  The
    Health view reads the engines' newest rows from the same answer."""
    from sqlalchemy import func, select

    from tidewatch.db.models import EngineMetric

    m = EngineMetric
    newest = select(func.max(m.ts)).scalar_subquery()
    rank = func.row_number().over(partition_by=m.engine_id, order_by=m.id.desc()).label("rank")
    ranked = select(m.id, rank).where(m.ts >= newest - timedelta(seconds=ENGINES_WITHIN_S)).subquery()
    now = session.scalar(select(func.now()))
    at = now if isinstance(now, datetime) else datetime.now(UTC)
    rows = session.execute(
        select(m)
        .join(ranked, ranked.c.id == m.id)
        .where(ranked.c.rank <= recent)
        .order_by(m.engine_id, ranked.c.rank.desc())
    ).scalars()
    by_engine: dict[str, list[Any]] = {}
    for r in rows:  # a few rows per engine
        by_engine.setdefault(r.engine_id, []).append(r)
    return at, by_engine


def observed(at: datetime, rows_by_engine: Mapping[str, Sequence[Any]]) -> dict[str, Observed]:
    """Each engine's :class:`Observed` at ``at`` from its metric rows (oldest first, each with
    ``ts`` and ``lag_ms``): its newest batch time and the rows' lags."""
    return {e: Observed(r[-1].ts, [x.lag_ms for x in r], at) for e, r in rows_by_engine.items() if r}


def check(settings: Settings) -> Verdict:
    """The verdict ``tidewatch status`` prints: :func:`judge` over ``settings.sqlalchemy_url``'s
    batches and the run records (a database that does not answer: ``unknown``, why -- or the
    newest record's failure)."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import Session
    from sqlalchemy.pool import NullPool

    records = read_records(settings)
    record = newest_record(records)
    eng = create_engine(settings.sqlalchemy_url, poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        with Session(eng) as s:
            obs = observe(s)
            engines = observe_engines(s)
    except SQLAlchemyError as exc:
        if record is not None and record.kind == "failed":
            return verdict(Observed(None), settings, record)
        return Verdict("unknown", f"Cannot read the engine's batches from PostgreSQL ({type(exc).__name__}).")
    finally:
        eng.dispose()
    return judge(obs, engines, settings, records)
