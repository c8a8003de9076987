"""The engine's run record and the rule of its health (:mod:`engine.liveness`): no services."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine import liveness
from engine.liveness import Observed, RunRecord, lag_behind, verdict
from tidewatch.settings import Settings

NOW = datetime(2026, 11, 25, 12, tzinfo=UTC)


@pytest.fixture
def s(tmp_path: Path) -> Settings:
    return Settings(run_dir=tmp_path, engine_behind_lag_ms=10_000, engine_down_after_s=60)


def test_lag_at_the_threshold_does_not_flicker() -> None:
    # the steady state: lag around 9.8 s against 10 s, now and then just over
    hovering = [9_800.0, 10_100.0, 9_700.0, 10_050.0, 9_900.0, 10_200.0, 9_800.0] * 10
    assert lag_behind(hovering, 10_000, 8_000) is False
    states = [lag_behind(hovering[:n], 10_000, 8_000) for n in range(1, len(hovering) + 1)]
    assert not any(states)  # no point of the series shows "behind"
    # truly behind: three over the threshold enter; values between 8 s and 10 s keep it
    behind = [12_000.0] * 3 + [9_500.0, 8_500.0, 9_900.0] * 5
    assert all(lag_behind(behind[:n], 10_000, 8_000) for n in range(3, len(behind) + 1))
    # three under 80 % leave it; NaN and None are skipped
    assert lag_behind([*behind, 7_000.0, None, float("nan"), 7_500.0, 6_000.0], 10_000, 8_000) is False
    assert lag_behind([*behind, 7_000.0, 7_500.0, 9_000.0], 10_000, 8_000) is True


def test_verdict_by_age_and_lag(s: Settings) -> None:
    assert verdict(Observed(None, [], NOW), s, None).status == "unknown"
    ok = verdict(Observed(NOW - timedelta(seconds=2), [9_800.0] * 30, NOW), s, None)
    assert ok.status == "ok" and ok.hint == ""
    behind = verdict(Observed(NOW - timedelta(seconds=2), [30_000.0] * 3, NOW), s, None)
    assert behind.status == "behind" and "lag 30.0 s" in behind.cause
    assert "catching up" not in behind.cause
    # a backlog drained (a feed's history backfill): behind, and said to be catching up
    falling = [400_000.0, 380_000.0, 350_000.0, 320_000.0, 300_000.0]
    up = verdict(Observed(NOW - timedelta(seconds=2), falling, NOW), s, None)
    assert up.status == "behind" and "catching up: lag 300.0 s, down from 400 s" in up.cause
    assert "backfill" in up.cause
    growing = verdict(Observed(NOW - timedelta(seconds=2), falling[::-1], NOW), s, None)
    assert growing.status == "behind" and "catching up" not in growing.cause
    down = verdict(Observed(NOW - timedelta(minutes=5), [100.0], NOW), s, None)
    assert down.status == "down" and "5 min" in down.cause and "tidewatch status" in down.hint


def test_verdict_from_the_run_record(s: Settings) -> None:
    last = NOW - timedelta(minutes=5)
    fail = RunRecord(
        "e1", "failed", NOW - timedelta(minutes=1), "OperationalError", "password failed", "fix it"
    )
    v = verdict(Observed(last, [], NOW), s, fail)
    assert v.status == "down" and "OperationalError: password failed" in v.cause and v.hint == "fix it"
    assert v.text.endswith("fix it")
    # a batch after the failure: the record is history, the batches speak
    assert verdict(Observed(NOW - timedelta(seconds=1), [], NOW), s, fail).status == "ok"
    stopped = RunRecord("e1", "stopped", NOW - timedelta(seconds=10))
    v = verdict(Observed(last, [], NOW), s, stopped)
    assert v.status == "down" and "stopped" in v.cause and "tidewatch restart engine" in v.hint
    start = RunRecord("e1", "started", NOW - timedelta(seconds=10), previous="ValueError: bad pane")
    v = verdict(Observed(last, [], NOW), s, start)
    assert v.status == "starting" and "previous run failed: ValueError: bad pane" in v.cause
    v = verdict(Observed(last, [], NOW + timedelta(minutes=2)), s, start)
    assert v.status == "down" and "no batch since" in v.cause


def test_run_record_round_trip_and_crash_loop(s: Settings) -> None:
    assert liveness.read_record(s) is None
    liveness.write_record(s, liveness.failed("e1", ValueError("bad pane_ms\nmore"), s, NOW))
    rec = liveness.read_record(s, "e1")
    assert rec is not None and rec.kind == "failed" and rec.failure == "ValueError: bad pane_ms"
    assert "tidewatch restart engine" in rec.hint
    # the next start keeps the failure (a crash loop stays explained while it restarts)
    liveness.write_record(s, liveness.started(s, "e1", NOW + timedelta(seconds=5)))
    assert liveness.read_record(s, "e1") == RunRecord(
        "e1", "started", NOW + timedelta(seconds=5), previous="ValueError: bad pane_ms", restarts=1
    )
    liveness.write_record(s, RunRecord("e2", "stopped", NOW + timedelta(seconds=9)))
    newest = liveness.read_record(s)
    assert newest is not None and newest.engine_id == "e2"
    liveness.record_path(s, "e3").write_text("{not json")  # a damaged file is skipped
    assert liveness.read_record(s) == newest


def test_restarts_count_only_starts_after_an_unclean_end(s: Settings) -> None:
    def start(t: int) -> None:
        liveness.write_record(s, liveness.started(s, "e", NOW + timedelta(seconds=t)))

    start(0)  # the first start
    liveness.write_record(s, RunRecord("e", "stopped", NOW + timedelta(seconds=1)))
    start(2)  # after a clean stop: not a restart
    start(3)  # after a kill (the record still said started)
    liveness.write_record(s, liveness.failed("e", OSError("disk"), s, NOW + timedelta(seconds=4)))
    start(5)  # after a failure
    rec = liveness.read_record(s, "e")
    assert rec is not None and rec.restarts == 2


def test_describe_masks_passwords_and_names_the_setting(s: Settings) -> None:
    from sqlalchemy.exc import OperationalError

    class Orig(Exception):
        sqlstate = "28P01"

    exc = OperationalError("connect", {}, Orig('FATAL: password authentication failed for user "tw"'))
    kind, message, hint = liveness.describe(exc, s)
    assert kind == "OperationalError" and "password authentication failed" in message
    assert "database_url" in hint and "user and password" in hint
    kind, message, _ = liveness.describe(RuntimeError("cannot reach postgresql://tw:s3cret@db:5432/x"), s)
    assert "s3cret" not in message and "postgresql://tw:***@db" in message


def test_describe_sends_a_checkpoint_refusal_to_its_message(s: Settings) -> None:
    """A checkpoint refused at start (engine.errors.CheckpointMismatch, by its type): the message
    keeps what to do ahead of the path; the hint points to it and to the log."""
    from engine.errors import CheckpointMismatch

    exc = CheckpointMismatch(
        "the checkpoint was made by the driver's engine (engine_shards=0), whose state shards do not "
        "read: run with engine_shards=0, or start with a new checkpoint directory and a new "
        "--engine-id (the topics are read again into the shards). Checkpoint: " + "/x" * 200
    )
    kind, message, hint = liveness.describe(exc, s)
    assert kind == "CheckpointMismatch" and "run with engine_shards=0" in message and len(message) == 300
    assert "checkpoint directory does not fit" in hint and "engine.log" in hint


def test_several_engines_are_judged_apart_and_the_worst_is_named(s: Settings) -> None:
    """Two engines on one database (``--engine-id``): one of them stopped committing five minutes
    ago while the other runs -- the verdict is "down" and names it, not "ok" from the other's
    newer batches (:func:`engine.liveness.judge`)."""
    fresh = Observed(NOW - timedelta(seconds=1), [300.0] * 5, NOW)
    stale = Observed(NOW - timedelta(minutes=5), [300.0] * 5, NOW)
    together = Observed(fresh.last_at, [300.0] * 10, NOW)  # all the batches: the newest is a's
    assert verdict(together, s, None).status == "ok"  # what one rule over every batch said
    v = liveness.judge(together, {"a": fresh, "b": stale}, s, {})
    assert v.status == "down" and v.cause.startswith("Engine 'b' (of 2): The engine looks down")
    assert liveness.judge(together, {"a": fresh, "b": fresh}, s, {}) == liveness.Verdict(
        "ok", "All 2 engines are running: last batch 1 s ago."
    )
    # down beats behind; the others not ok are counted
    behind = Observed(NOW - timedelta(seconds=1), [30_000.0] * 3, NOW)
    v = liveness.judge(together, {"a": fresh, "b": behind, "c": stale}, s, {})
    assert v.status == "down" and v.cause.startswith("Engine 'c' (of 3)")
    assert v.cause.endswith("(2 of the 3 engines are not ok: b, c.)")


def test_one_engine_is_judged_by_the_rule_and_each_of_several_by_its_own_record(s: Settings) -> None:
    fresh = Observed(NOW - timedelta(seconds=1), [300.0] * 5, NOW)
    failed = RunRecord(
        "b", "failed", NOW - timedelta(seconds=30), "KafkaException", "no broker", "start Kafka"
    )
    # one engine with batches: exactly verdict() with the newest record -- a record alone (of
    # another database's engine, in a shared run directory) does not make a second engine
    assert liveness.judge(fresh, {"a": fresh}, s, {}) == verdict(fresh, s, None)
    assert liveness.judge(fresh, {"a": fresh}, s, {"b": failed}) == verdict(fresh, s, failed)
    assert liveness.judge(fresh, {"a": fresh}, s, {"b": failed}).status == "ok"
    # no batch at all, one record: the rule's "starting" / "down" as before
    start = RunRecord("a", "started", NOW - timedelta(seconds=5))
    assert liveness.judge(Observed(None, [], NOW), {}, s, {"a": start}).status == "starting"
    # two engines with batches: b failed after its last batch -- down, named, its error and hint
    b = Observed(NOW - timedelta(minutes=2), [300.0] * 5, NOW)
    v = liveness.judge(fresh, {"a": fresh, "b": b}, s, {"b": failed, "a": start})
    assert v.status == "down" and v.cause.startswith("Engine 'b' (of 2)") and "no broker" in v.cause
    assert v.hint == "start Kafka"


def test_read_records_gives_every_engines_record(s: Settings) -> None:
    liveness.write_record(s, RunRecord("a", "started", NOW))
    liveness.write_record(s, RunRecord("b", "stopped", NOW + timedelta(seconds=1)))
    (liveness.record_dir(s) / "broken.run.json").write_text("{")
    recs = liveness.read_records(s)
    assert sorted(recs) == ["a", "b"] and recs["b"].kind == "stopped"


def test_overall_reads_the_newest_rows_and_falls_back_to_the_batches() -> None:
    """All engines together: the newest row's time and the first ``recent`` lags, oldest first;
    with no metric rows, the newest committed batch."""
    t0 = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
    at = t0 + timedelta(minutes=1)
    newest_first = [SimpleNamespace(ts=t0 - timedelta(seconds=i), lag_ms=float(i)) for i in range(5)]
    o = liveness.overall(at, newest_first, last_committed=t0 - timedelta(hours=1), recent=3)
    assert o == Observed(t0, [2.0, 1.0, 0.0], at)
    assert liveness.overall(at, [], t0 - timedelta(hours=1)) == Observed(t0 - timedelta(hours=1), [], at)
    assert liveness.overall(at, [], None).last_at is None
