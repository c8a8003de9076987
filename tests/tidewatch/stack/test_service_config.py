"""Generated configs of the embedded services and the topic layout (no services needed)."""

from __future__ import annotations

from tidewatch.kafka.topics import topic_specs
from tidewatch.settings import Settings
from tidewatch.stack import kafka_broker as kafka
from tidewatch.stack import postgres_server as postgres


def test_kafka_binds_loopback_on_the_configured_ports(tmp_path):
    s = Settings(run_dir=tmp_path, kafka_port=29092, kafka_controller_port=29093)
    props = dict(
        line.split("=", 1)
        for line in kafka.server_properties(s).splitlines()
        if line and not line.startswith("#")
    )
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29093"
    assert props["log.dirs"] == str(tmp_path / "kafka" / "data")
    assert props["auto.create.topics.enable"] == "false"


def test_cluster_id_is_a_kafka_uuid():
    cid = kafka._cluster_id()
    assert len(cid) == 22 and "=" not in cid and cid != kafka._cluster_id()


def test_topics_compacted_where_the_design_says():
    specs = {t.name: t for t in topic_specs(Settings())}
    assert set(specs) == {"trades", "packets", "subscriptions", "alerts", "results", "dead-letter"}
    compacted = {n for n, t in specs.items() if t.config.get("cleanup.policy") == "compact"}
    assert compacted == {"subscriptions", "results"}
    assert specs["subscriptions"].partitions == 1  # one total order of subscription changes


def test_postgres_layout_lives_under_run_dir(tmp_path):
    lay = postgres.layout(Settings(run_dir=tmp_path))
    assert lay.data == tmp_path / "postgres" / "data" and lay.sock.parent == lay.root
