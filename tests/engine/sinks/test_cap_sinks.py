"""The alert cap in the sinks, on real services: batches capped by :func:`engine.cap.cap_alerts`
leave ``current_results`` (real PostgreSQL) and the compacted ``results`` topic (real Kafka) as
the same batches uncapped do, while the alert log and the ``alerts`` topic hold the kept alerts
and the CAPPED records only; a capped batch re-published from PostgreSQL after a crash
(:meth:`engine.app.EngineApp.recover`'s reads: ``Store.withheld_of_batch``, ``Store.current_of``,
:func:`engine.cap.republished_results`) leaves the results topic as the live publication does."""

from __future__ import annotations

import copy
import random
import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from engine.cap import CAPPED, cap_alerts, republished_results
from engine.messages import Alert, BatchOutput
from engine.sinks import publish
from engine.sinks.alert_columns import uuid_text
from engine.sinks.store import Store
from tests.engine.sinks.test_publish_batch import _records
from tests.engine.sinks.test_store_copy import KEYS, METRICS, SUBS, T0, VALUES
from tests.engine.support import own_topics
from tidewatch.settings import Settings
from tidewatch.wire.avro import decode

pytestmark = pytest.mark.integration


def _batches(subs: list[str] | None = None) -> list[BatchOutput]:
    """Three batches of three lookups each, four subscriptions (``subs``; by default one id not a
    UUID) flipping many of 44 keys (every awkward key of test_store_copy) at each lookup, in the
    core's order (per subscription, by key); the last batch repeats the first alert of the second
    (logged already)."""
    subs = subs or [*SUBS[:3], "not-a-uuid"]
    keys = sorted(f"{k}{j}" for k in KEYS for j in range(4))
    present: set[tuple[str, str]] = set()
    rng = random.Random(5)
    out = []
    n = 0
    for b in range(3):
        alerts = []
        for t in range(3):
            tau = T0 + 1000 * (3 * b + t)
            for sid in subs:
                for key in keys:
                    if rng.random() < 0.4:
                        continue
                    kind = "EXIT" if (sid, key) in present else "ENTER"
                    present ^= {(sid, key)}
                    alerts.append(
                        Alert(sid, f"rule {sid}", "trades", key, kind, tau, VALUES[n % len(VALUES)])
                    )
                    n += 1
        out.append(BatchOutput(batch_id=b + 1, alerts=alerts, events={"trades": 10}))
    out[2].alerts.insert(0, out[1].alerts[0])
    return out


def _capped(batches: list[BatchOutput], cap: int) -> list[BatchOutput]:
    out = copy.deepcopy(batches)
    for b in out:
        cap_alerts(b, 0, cap)
    return out


def _keys_of(withheld: list[Alert]) -> dict[str, list[str]]:
    got: dict[str, set[str]] = {}
    for a in withheld:
        got.setdefault(uuid_text(a.subscription_id), set()).add(a.key)
    return {sid: sorted(keys) for sid, keys in got.items()}


def _state(changes: list[Any]) -> dict[tuple[str, str], Any]:
    """(subscription UUID text, key) -> values of the keys present after ``changes`` (Alerts or rows)."""
    got: dict[tuple[str, str], Any] = {}
    for a in changes:
        sid, key, kind, vals = (
            (a.subscription_id, a.key, a.kind, a.values)
            if isinstance(a, Alert)
            else (a["subscription_id"], a["key"], a["kind"], a["values"])
        )
        assert kind != CAPPED
        if kind == "ENTER":
            got[(uuid_text(sid), key)] = vals
        else:
            got.pop((uuid_text(sid), key), None)
    return got


def test_capped_batches_leave_current_results_exact_and_log_kept_and_capped(restartable_pg: Settings) -> None:
    from tests.engine.test_engine_integration import fresh_database

    plain = _batches()
    capped = _capped(plain, 3)
    assert all(b.withheld for b in capped) and sum(len(b.withheld) for b in capped) > 500
    got = {}
    for name, batches in (("plain", plain), ("capped", capped)):
        eng = create_engine(fresh_database(restartable_pg.sqlalchemy_url))
        store = Store(eng)
        try:
            for out in batches:
                assert store.commit(out, watermark=T0, metrics=METRICS)
            # expanded behind the commits, from their engine_outputs rows read back (withheld too)
            assert store.project_pending() == len(batches)
            with eng.connect() as conn:
                got[name] = {
                    "current": conn.execute(
                        text(
                            "SELECT subscription_id, key, since, values::text FROM current_results ORDER BY 1, 2"
                        )
                    ).all(),
                    "log": conn.execute(text("SELECT alert_id, kind, values FROM alerts ORDER BY seq")).all(),
                }
            if name == "capped":
                last = batches[-1]
                withheld = store.withheld_of_batch(last.batch_id)
                assert withheld == _keys_of(last.withheld)
                assert store.withheld_of_batch(1) == _keys_of(batches[0].withheld)
                assert store.withheld_of_batch(99) == {}
                # what recover() publishes for the last batch: the results after it are exact
                rows = store.alerts_of_batch(last.batch_id)
                results = republished_results(rows, withheld, store.current_of(withheld))
                assert results is not None and all(r["kind"] != CAPPED for r in results)
                before = [a for b in batches[:-1] for a in b.result_changes()]
                assert _state(before + results) == _state([a for b in plain for a in b.alerts])
                assert {(r[0], r[1]) for r in got[name]["current"]} == {
                    (uuid.UUID(s), k) for s, k in _state(before + results)
                }
        finally:
            eng.dispose()
    assert got["capped"]["current"] == got["plain"]["current"] and got["plain"]["current"]
    ids = {a.id for b in capped for a in b.alerts}
    log = got["capped"]["log"]
    assert {r[0] for r in log} == ids and len(log) == len(ids) < len(got["plain"]["log"])
    capped_rows = [r for r in log if r[1] == CAPPED]
    assert capped_rows and all(
        set(r[2]) == {"withheld", "withheld_enter", "withheld_exit", "cap"} for r in capped_rows
    )


def test_capped_batches_publish_exact_results_and_kept_and_capped_alerts(restartable_kafka: Settings) -> None:
    bootstrap = restartable_kafka.kafka_bootstrap
    # UUID ids only: a re-published batch names its subscriptions by their UUID text, as its alerts
    plain = _batches(SUBS[:4])[:2]
    capped = _capped(plain, 3)
    got = {}
    for name, batches in (("plain", plain), ("capped", capped), ("republished", capped)):
        run = uuid.uuid4().hex[:6]
        s = own_topics(restartable_kafka, f"cap-{name}")
        publish.ensure_topics(bootstrap, s)
        pub = publish.Publisher(bootstrap, s, f"cap-test-{name}-{run}")
        try:
            for out in batches:
                if name == "republished" and out is batches[-1]:  # as recover() does, from rows
                    rows = [
                        {"id": a.id, "subscription_id": a.subscription_id, "key": a.key, "kind": a.kind,
                         "as_of": a.as_of, "values": a.values}
                        for a in out.alerts
                    ]  # fmt: skip
                    st = _state([a for b in plain for a in b.alerts])
                    withheld = _keys_of(out.withheld)
                    current = {k: (T0, v) for k, v in st.items()}
                    pub.publish(out.batch_id, rows, None, out.removed_keys,
                                republished_results(rows, withheld, current))  # fmt: skip
                else:
                    results = out.result_changes() if out.withheld else None
                    pub.publish(out.batch_id, out.alerts, None, out.removed_keys, results)
        finally:
            pub.close()
        got[name] = (_records(bootstrap, s.topic_alerts), _records(bootstrap, s.topic_results))

    def final(recs: dict[int, list[tuple[Any, Any]]]) -> dict[bytes, Any]:
        """The compacted topic's view: each key's last record (a tombstone: the key dropped)."""
        last: dict[bytes, Any] = {}
        for r in recs.values():
            for k, v in r:
                last[k] = None if v is None else decode(v, "results")
        return {k: (v["present"], v["values"]) for k, v in last.items() if v is not None}

    assert final(got["capped"][1]) == final(got["plain"][1]) and final(got["plain"][1])
    assert final(got["republished"][1]) == final(got["plain"][1])
    for name in ("capped", "republished"):
        alerts = [decode(v, "alerts") for r in got[name][0].values() for _, v in r]
        assert sorted(a["id"] for a in alerts) == sorted(a.id for b in capped for a in b.alerts), name
        assert any(a["kind"] == CAPPED for a in alerts)
        # no results record for a CAPPED one (its key would be 'subscription|': no key is empty here)
        assert all(not k.endswith(b"|") for r in got[name][1].values() for k, _ in r)
