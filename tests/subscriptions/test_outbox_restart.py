"""The outbox relay rides out a Kafka broker restart: the real ``tidewatch subscriptions relay``
keeps running while subscription changes are made through the service before, during and after
the broker is stopped (by PID) and started again on the same port and data; every change
reaches the topic exactly once (``read_committed``), in version order per subscription, and
every outbox row is marked with its record's offset.

Uses the ``restartable_kafka`` / ``restartable_pg`` fixtures (embedded services of their own);
``TIDEWATCH_TEST_FAULT_DOWN_S`` sets the outage (default 4 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from subscriptions.outbox import pending_count
from subscriptions.service import SubscriptionService
from tests.subscriptions.test_outbox import RULE, _assert_exactly_once, _read_topic, _rows
from tidewatch.kafka.topics import create_topics, spec_for
from tidewatch.settings import Settings, get_settings
from tidewatch.stack import kafka_broker as kafka

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DOWN_S = float(os.environ.get("TIDEWATCH_TEST_FAULT_DOWN_S", "4"))
N_SUBS = 6
USER = "relay-faults"


class Changer(threading.Thread):
    """Changes subscriptions through the service every ``pause_s`` until stopped: creates
    ``N_SUBS``, then pauses, resumes and updates them in turn (each call one committed change)."""

    def __init__(self, svc: SubscriptionService, pause_s: float = 0.1) -> None:
        super().__init__(name="changer", daemon=True)
        self.svc, self.pause_s = svc, pause_s
        self.stop = threading.Event()
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            ids = [
                self.svc.create(USER, RULE.format(n=100 + i), name=f"s{i}-{uuid.uuid4().hex[:4]}").id
                for i in range(N_SUBS)
            ]
            self.done = N_SUBS
            step = 0
            while not self.stop.wait(self.pause_s):
                sid = ids[step % N_SUBS]
                kind = (step // N_SUBS) % 3
                if kind == 0:
                    self.svc.pause(USER, sid)
                elif kind == 1:
                    self.svc.resume(USER, sid)
                else:
                    self.svc.update(USER, sid, rule_text=RULE.format(n=1000 + step))
                step += 1
                self.done += 1
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc


def _wait(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _setup(kafka_s: Settings, db: str) -> tuple[str, SubscriptionService, dict[str, str]]:
    """A fresh compacted subscriptions topic, the service writing to it, the relay's environment."""
    bootstrap = kafka_s.kafka_bootstrap
    assert bootstrap is not None
    topic = f"subscriptions-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # the subscriptions topic's spec (one partition, compacted) under a scratch name
    create_topics(admin, [spec_for(topic, Settings(topic_subscriptions=topic))])
    svc = SubscriptionService(settings=get_settings(), url=db, topic=topic)
    svc.ensure_user(USER)
    env = {
        **os.environ,
        "TIDEWATCH_KAFKA_SECURITY": "plaintext",
        "TIDEWATCH_KAFKA_BOOTSTRAP": bootstrap,
        "TIDEWATCH_DATABASE_URL": db,
        "TIDEWATCH_TOPIC_SUBSCRIPTIONS": topic,
        "TIDEWATCH_RELAY_KAFKA_STALL_S": "10",
    }
    return topic, svc, env


def _relay(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """The real ``tidewatch subscriptions relay`` (what ``tidewatch up`` runs), stderr to ``log``."""
    cmd = [sys.executable, "-m", "tidewatch.cli", "subscriptions", "relay", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log.open("wb"))


def test_relay_rides_out_a_kafka_broker_restart(
    restartable_kafka: Settings, restartable_db: str, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    bootstrap = restartable_kafka.kafka_bootstrap
    assert bootstrap is not None
    topic, svc, env = _setup(restartable_kafka, restartable_db)
    rlog = tmp_path / "relay.log"
    relay = _relay(env, rlog)
    changer = Changer(svc)
    try:
        _wait(lambda: "outbox relay publishing" in rlog.read_text(), 60, "the relay to start")
        changer.start()
        # before: changes are being published while they are made
        _wait(lambda: len(_read_topic(bootstrap, topic)) >= 10, 30, "changes on the topic before the fault")
        before = changer.done
        t_fault = time.monotonic()
        kafka.stop(restartable_kafka)
        during_from = changer.done
        time.sleep(DOWN_S)
        kafka.start(restartable_kafka)
        outage = time.monotonic() - t_fault
        during = changer.done - during_from
        time.sleep(3)  # after: more changes with the broker back
        changer.stop.set()
        changer.join(30)
        assert changer.error is None, repr(changer.error)
        total = changer.done
        assert relay.poll() is None, "the relay died:\n" + rlog.read_text()[-3000:]
        t_back = time.monotonic()
        _wait(lambda: pending_count(restartable_db, [topic]) == 0, 120, "every change to be published")
        catch_up = time.monotonic() - t_back
        assert relay.poll() is None, "the relay died:\n" + rlog.read_text()[-3000:]
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=60) == 0, rlog.read_text()[-3000:]
    finally:
        changer.stop.set()
        if relay.poll() is None:
            relay.kill()
            relay.wait()
    log_text = rlog.read_text(errors="replace")
    rows = _rows(restartable_db, topic)
    assert len(rows) == total and during > 0 and total > during + before
    _assert_exactly_once(restartable_db, bootstrap, topic, total)
    # every change of each subscription, versions 1..n in order, and each row marked with its record
    records = _read_topic(bootstrap, topic)
    by_key: dict[str, list[int]] = {}
    for key, version, _ in records:
        by_key.setdefault(key, []).append(version)
    assert len(by_key) == N_SUBS
    assert all(v == list(range(1, len(v) + 1)) for v in by_key.values()), by_key
    assert [oid for _, _, oid in records] == [r.id for r in rows], "records not in outbox order"
    assert [r.kafka_offset for r in rows] == sorted({r.kafka_offset for r in rows})
    print(
        f"\n{total} changes ({before} before the fault, {during} while the broker was down); "
        f"outage {outage:.1f} s; all published {catch_up:.1f} s after the last change; "
        f"{log_text.count('Kafka transaction failed')} relay transactions retried, "
        f"{log_text.count('giving up')} retry budgets exhausted; test {time.monotonic() - t0:.0f} s"
    )


def test_relay_stops_on_sigterm_while_the_broker_is_down(
    restartable_kafka: Settings, restartable_db: str, tmp_path: Path
) -> None:
    """SIGTERM to a relay stuck on a broker that is down: it exits 0 promptly (``run`` does not
    wait out ``relay_kafka_retry_s``); once the broker is back, ``relay --once`` publishes what
    was left, exactly once."""
    bootstrap = restartable_kafka.kafka_bootstrap
    assert bootstrap is not None
    topic, svc, env = _setup(restartable_kafka, restartable_db)
    rlog = tmp_path / "relay.log"
    relay = _relay(env, rlog)
    ids = []
    try:
        _wait(lambda: "outbox relay publishing" in rlog.read_text(), 60, "the relay to start")
        ids = [svc.create(USER, RULE.format(n=i), name=f"t{i}-{uuid.uuid4().hex[:4]}").id for i in range(3)]
        _wait(lambda: pending_count(restartable_db, [topic]) == 0, 30, "the first changes to be published")
        kafka.stop(restartable_kafka)
        for sid in ids:
            svc.pause(USER, sid)
        time.sleep(3)  # the relay is inside a transaction that cannot complete
        t = time.monotonic()
        relay.send_signal(signal.SIGTERM)
        rc = relay.wait(timeout=60)
        stop_s = time.monotonic() - t
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
        kafka.start(restartable_kafka)
    assert rc == 0, rlog.read_text()[-3000:]
    assert stop_s < 30, stop_s  # the stall bound (10 s here) and the producer's close, not 300 s
    assert pending_count(restartable_db, [topic]) == len(ids)
    once = subprocess.run(
        [sys.executable, "-m", "tidewatch.cli", "subscriptions", "relay", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert once.returncode == 0, once.stderr[-3000:]
    assert f"published {len(ids)} change(s)" in once.stdout
    _assert_exactly_once(restartable_db, bootstrap, topic, 2 * len(ids))
    print(f"\nrelay stopped {stop_s:.1f} s after SIGTERM with the broker down; --once published the rest")
