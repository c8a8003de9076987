"""``tidewatch up``/``down`` machinery on the real embedded services (Kafka jars, Debian PostgreSQL).

Starts PostgreSQL and Kafka in a temporary run dir on free ports, checks they answer, that
the schema is at head and the topics exist, then stops everything and checks that no
process it started is left.  Needs what ``scripts/setup.sh`` installs (java, PostgreSQL
binaries, the Kafka jars), no container engine.
"""

from __future__ import annotations

import psutil
import pytest

from tests.services import free_port
from tidewatch.db import migrate
from tidewatch.kafka.admin import admin_client
from tidewatch.settings import Settings, get_settings
from tidewatch.stack import embedded as stack
from tidewatch.stack import kafka_broker as kafka
from tidewatch.stack import postgres_server as postgres
from tidewatch.stack import processes as process

pytestmark = pytest.mark.integration


def test_services_up_then_down_leaves_nothing(run_root):
    base = get_settings()
    kp = free_port()
    s = Settings(
        run_dir=run_root / "run",
        cache_dir=base.cache_dir,
        kafka_port=kp,
        kafka_bootstrap=f"127.0.0.1:{kp}",
        kafka_controller_port=free_port(),
        pg_port=free_port(),
    )
    if postgres.find_bin_dir(s) is None:
        pytest.fail("PostgreSQL binaries missing: run scripts/setup.sh")
    pids: list[int] = []
    try:
        stack.start_services(s)
        pids = [r.pid for r in process.all_records(s.run_dir)]
        assert len(pids) == 2
        assert postgres.healthy(s) and kafka.healthy(s)
        assert migrate.current(s.sqlalchemy_url) == migrate.head()
        topics = set(admin_client(s.kafka_bootstrap, s).list_topics(timeout=10).topics)
        assert {"trades", "packets", "subscriptions", "alerts", "results", "dead-letter"} <= topics
        rows = {r["name"]: r for r in stack.status_rows(s)}
        assert rows["kafka"]["state"] == "running" and rows["kafka"]["health"] == "ok"
        assert rows["postgres"]["pid"] == str(postgres.postmaster_pid(s))
        # a second start is a no-op on running services
        stack.start_services(s, migrate=False, topics=False)
        assert sorted(r.pid for r in process.all_records(s.run_dir)) == sorted(pids)
    finally:
        stopped = stack.stop_all(s)
    assert set(stopped) == {"kafka", "postgres"}
    assert process.all_records(s.run_dir) == []
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # nothing of ours listens any more
    assert not process.port_open("127.0.0.1", s.kafka_port) and not process.port_open("127.0.0.1", s.pg_port)
    # and Kafka's formatted storage survives for the next start
    assert (s.run_dir / "kafka" / "data" / "meta.properties").exists()
