"""One settings object for all of Tidewatch.

Every tunable lives here and is read from the environment (prefix ``TIDEWATCH_``)
or from a ``.env`` file; nothing else in the code base reads ``os.environ`` for
configuration.  Secrets (passwords) come from the environment or from files
outside the repository (``TIDEWATCH_SECRETS_DIR``: one file per variable, named like it,
e.g. ``TIDEWATCH_PG_PASSWORD``), never from code; the built-in defaults are demo passwords,
refused when ``TIDEWATCH_DEPLOYMENT=production``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

#: The repository / installation root (parent of the ``tidewatch`` package).
PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: the variable naming the directory of secret files (read by :class:`Settings` itself)
SECRETS_DIR_VARIABLE = "TIDEWATCH_SECRETS_DIR"

#: field -> its built-in demo password (defaults here and in docker-compose.yml), refused in production
DEMO_PASSWORDS = {
    "pg_password": "tidewatch",
    "demo_password": "tidewatch-demo",
    "pg_engine_password": "tidewatch-engine",
    "pg_dashboard_password": "tidewatch-dashboard",
    "pg_relay_password": "tidewatch-relay",
}


class Settings(BaseSettings):
    """Tidewatch configuration.  ``TIDEWATCH_<FIELD>`` overrides each field.

    Frozen: a changed copy is ``settings.model_copy(update={...})``."""

    model_config = SettingsConfigDict(env_prefix="TIDEWATCH_", env_file=".env", extra="ignore", frozen=True)

    deployment: Literal["demo", "production"] = Field(
        "demo",
        description="'production' refuses the built-in demo passwords (DEMO_PASSWORDS) at start-up",
    )

    # --- where things live -------------------------------------------------
    cache_dir: Path = Field(PROJECT_ROOT / ".cache", description="downloads: Kafka jars, Ivy cache")
    run_dir: Path = Field(
        PROJECT_ROOT / ".run", description="data dirs, logs and PID files of the embedded stack"
    )

    # --- Kafka ---------------------------------------------------------------
    kafka_version: str = "4.1.1"
    kafka_bootstrap: str = "127.0.0.1:19092"
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    topic_trades: str = "trades"
    topic_packets: str = "packets"
    topic_subscriptions: str = "subscriptions"
    topic_alerts: str = "alerts"
    topic_results: str = "results"
    topic_dead_letter: str = "dead-letter"
    topic_partitions: int = 2
    schema_registry_url: str | None = Field(
        None,
        description="a Confluent-compatible Schema Registry (e.g. http://host:8081, or Apicurio's "
        "http://host:8080/apis/ccompat/v7): records are framed with the ids it gives and read by them "
        "(tidewatch/wire/registry.py); None: the ids of tidewatch/wire/schemas/registry.json",
    )
    # --- feeds (ingest/) -------------------------------------------------------
    packets_key: str = Field("src_ip", description="packet field used as Kafka key (docs/feeds.md)")
    demo_user: str = Field(
        "demo", description="account `tidewatch up` creates with the example subscriptions"
    )
    demo_password: str = Field("tidewatch-demo", description="its password (embedded demo stack only)")
    demo_trade_rate: float = Field(1000.0, description="trades/s of `tidewatch feed trades --demo`")
    demo_packet_rate: float = Field(1000.0, description="packets/s of `tidewatch feed packets --demo`")
    demo_history_minutes: float = Field(31.0, description="history the demo feeds backfill before going live")
    demo_trade_size_median: float = Field(
        35.0,
        description="median trade size of `tidewatch feed trades --demo`: RULES.md's example thresholds "
        "(the demo subscriptions) then hold for a few dozen of its 5,000 symbols, not thousands",
    )
    kafka_heap: str = Field("768m", description="-Xmx of the embedded Kafka broker")
    kafka_start_timeout_s: float = 90.0

    # --- PostgreSQL ----------------------------------------------------------
    pg_host: str = "127.0.0.1"
    pg_port: int = 15432
    pg_user: str = "tidewatch"
    pg_password: str = "tidewatch"
    pg_database: str = "tidewatch"
    database_url: str | None = Field(None, description="overrides the pg_* fields when set")
    pg_bin_dir: Path | None = Field(
        None, description="dir of initdb/pg_ctl; default: newest /usr/lib/postgresql/*/bin"
    )

    # --- Spark / engine ------------------------------------------------------
    spark_master: str = "local[2]"
    spark_version: str = "4.3.0"
    spark_kafka_connector_version: str = Field(
        "4.2.0",
        description="spark-sql-kafka-0-10_2.13 from Maven Central (no 4.3.0 there yet; 4.2.0 runs on pyspark 4.3.0)",
    )
    spark_avro_version: str = Field(
        "4.0.0", description="spark-avro_2.13 and spark-token-provider-kafka (newest complete on Central)"
    )
    pane_ms: int = Field(1000, description="pane (basic window) width g in ms; divides every window")
    trigger_seconds: float = 1.0
    allowed_lateness_ms: int = 5000
    max_future_ms: int = 60_000
    checkpoint_dir: Path | None = None
    snapshot_every_batches: int = 50
    engine_snapshot_fork: bool = Field(
        True,
        description="write the state snapshot from a forked child process (a copy-on-write image of the "
        "state; the batches go on meanwhile); False: capture in the evaluation thread, write from a thread",
    )
    engine_snapshot_prefault: bool = Field(
        True,
        description="right after a snapshot's fork, fault in writable the pages the next batch appends to "
        "(madvise MADV_POPULATE_WRITE, Linux 5.14+), so that batch does not pay their copies",
    )
    engine_history_ms: int | None = Field(
        None,
        description="raw history the engine keeps so a new rule sees old data (PSoup), at least the longest "
        "time window in use (None: exactly that); ROWS windows add each key's newest n rows, so it stays bounded",
    )
    engine_max_offsets_per_trigger: int | None = Field(
        100_000, description="cap on Kafka records per micro-batch (bounds driver memory on a backlog)"
    )
    spark_driver_memory: str = Field(
        "3g", description="JVM heap of the Spark driver (local mode: all of Spark)"
    )
    # --- Spark on a cluster (docs/engine.md, "Running on a cluster") ----------
    spark_driver_host: str | None = Field(
        None,
        description="address the executors reach the driver at (spark.driver.host); None: 127.0.0.1 "
        "on a local master, Spark's default (this machine's address) on a cluster master",
    )
    spark_driver_bind_address: str | None = Field(
        None,
        description="address the driver's sockets bind to (spark.driver.bindAddress, e.g. 0.0.0.0 "
        "behind NAT); None: 127.0.0.1 on a local master, the driver host on a cluster master",
    )
    spark_driver_port: int | None = Field(
        None, description="the driver's RPC port (spark.driver.port, for a firewall); None: a free port"
    )
    spark_block_manager_port: int | None = Field(
        None,
        description="port of the block managers of the driver and the executors "
        "(spark.blockManager.port, for a firewall); None: a free port",
    )
    spark_python: str | None = Field(
        None,
        description="the Python the executors' Python workers run (spark.pyspark.python, "
        "PYSPARK_PYTHON); it must exist at this path on every worker host; None: this interpreter "
        "(the project's venv)",
    )
    spark_extra_conf: dict[str, str] = Field(
        default_factory=dict,
        description='more Spark configuration, set last (env: JSON, e.g. {"spark.executor.memory": '
        '"2g", "spark.cores.max": "4"})',
    )
    # --- `tidewatch up --workers N`: a standalone cluster on 127.0.0.1 (docs/engine.md) ------
    spark_master_port: int | None = Field(
        None,
        description="RPC port of the standalone master `tidewatch up --workers N` starts; None: a free port",
    )
    spark_master_webui_port: int | None = Field(
        None, description="port of that master's web UI (its /json status); None: a free port"
    )
    spark_worker_cores: int = Field(1, description="cores each worker of `tidewatch up --workers N` offers")
    spark_worker_memory: str = Field(
        "1g",
        description="memory each of those workers offers; also the engine's spark.executor.memory "
        "(one executor per worker) unless spark_extra_conf sets it",
    )

    # --- collective indexes --------------------------------------------------
    ci_p: int = Field(
        2,
        description="CI-COUNT / CI-SUM parameter p (epsilon ~ 2/p), section 4.1.2. Larger p: fewer "
        "candidates per lookup, costlier updates and more state (bytes/key ~ 150 p). The engine and "
        "the backtest look every rule up once a pane (1 s) against many updates, where p = 2 measured "
        "fastest (docs/rules.md); bench/ci_index_bench.py's paper workload (one lookup per update) "
        "peaks at p = 8",
    )

    # --- dashboard -----------------------------------------------------------
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 18501
    dashboard_refresh_s: float = Field(2.0, description="auto-refresh period of the live Alerts view")
    dashboard_client_id: str = Field(
        "web", description="default client name of a dashboard login (cursor per user+client)"
    )
    session_ttl_hours: float = Field(12.0, description="lifetime of a dashboard login session")
    login_max_failures: int = Field(5, description="failed logins per user name + client before refusing")
    login_window_s: int = Field(300, description="window of login_max_failures")
    engine_behind_lag_ms: float = Field(10_000.0, description="Health banner: engine behind above this lag")
    engine_down_after_s: float = Field(
        60.0, description="Health banner: engine down after this long without a batch"
    )
    storm_factor: float = Field(
        10.0,
        ge=1.0,
        description="Health: an alert storm when the last minute's alerts/s is at least this many times "
        "the median minute of the 15 before (and at least storm_min_alerts_per_s)",
    )
    storm_min_alerts_per_s: float = Field(
        100.0, ge=0.0, description="Health: no alert storm below this many alerts/s (the floor of the rule)"
    )
    dashboard_detail_minutes: float = Field(10.0, description="Key detail: span of the aggregate charts")
    dashboard_chart_wait_s: float = Field(
        8.0, description="Key detail: how long the page waits for the engine's answer to a chart request"
    )
    chart_answer_poll_s: float = Field(
        0.5,
        description="engine: how often it looks for chart requests of the key page (engine/sinks/charts.py)",
    )
    dashboard_detail_max_messages: int = Field(
        500_000, description="Key detail: most Kafka records read per chart"
    )

    # --- containers (tests/containers.py, docker-compose.yml; docs/containers.md) ---
    container_host: str | None = Field(
        None, description="Docker API URL for testcontainers; default: the Podman socket, else Docker's"
    )
    podman_socket: Path = Field(
        Path("/run/podman/podman.sock"), description="socket scripts/containers_setup.sh serves"
    )
    image_postgres: str = "localhost/tidewatch-postgres:latest"
    image_kafka: str = "localhost/tidewatch-kafka:latest"
    container_start_timeout_s: float = 120.0
    spark_log_level: str = "WARN"

    # --- rule language limits -----------------------------------------------
    max_rule_chars: int = 4000
    max_rule_depth: int = 32
    max_rule_aggregates: int = 32

    # --- engine: per-partition watermark (helper ENG) ---------------------------
    engine_idle_timeout_ms: int = Field(
        5_000,
        description="a Kafka partition with no records that is this far (event time) behind the newest "
        "one stops holding the engine's watermark back",
    )
    engine_db_retry_s: float = Field(
        300.0,
        description="how long the engine retries a batch commit while PostgreSQL is unreachable "
        "(a restart); the commit is idempotent by batch id",
    )
    engine_kafka_retry_s: float = Field(
        300.0,
        description="how long the engine retries a batch's Kafka transaction while the broker is "
        "unreachable (a restart); each retry re-creates the transactional producer",
    )
    engine_kafka_stall_s: float = Field(
        20.0,
        description="a batch's Kafka transaction that has not returned after this long is given up "
        "and retried with a new producer (librdkafka can hang past its own timeouts after a broker "
        "restart)",
    )
    relay_kafka_retry_s: float = Field(
        300.0,
        description="how long the outbox relay retries a batch's Kafka transaction before "
        "reporting failure (`relay --once` exits; the running relay keeps trying)",
    )
    relay_kafka_stall_s: float = Field(
        20.0,
        description="an outbox relay Kafka transaction that has not returned after this long is "
        "given up and retried with a new producer (as engine_kafka_stall_s)",
    )
    engine_pipeline: bool = Field(
        True,
        description="evaluate / commit a micro-batch in a worker thread while Spark reads the next one",
    )
    engine_preaggregate: Literal["driver", "executors"] = Field(
        "executors",
        description="where a micro-batch's records are decoded and pre-aggregated into (key, pane) rows: "
        "'driver' (toArrow of the records, decoded on the driver) or 'executors' (Spark tasks, "
        "engine/executors; pipelined: batch N+1's tasks run while batch N is evaluated; docs/engine.md "
        "'Executor pre-aggregation')",
    )
    engine_shards: int = Field(
        1,
        ge=0,
        le=64,
        description="sharded evaluation (docs/engine.md 'Sharded evaluation'): the collective indexes held "
        "in Spark's executors, N shards by hash(key) mod N, each a stateful Spark task over its keys "
        "(transformWithStateInPandas, RocksDB state), producing its own Kafka output; the default 1 "
        "(since Dec 8; on one machine more shards on one executor take its Python workers in turn and "
        "are caught up or rebuilt: docs/engine.md 'Where shards run'); 0: the driver holds them (the "
        "default before, engine_preaggregate applies). Fixed for a checkpoint: another N needs a new "
        "checkpoint and engine id",
    )
    engine_shard_input: Literal["panes", "records"] = Field(
        "panes",
        description="what the shards of the sharded mode evaluate (docs/engine.md 'Sharded evaluation'): "
        "'panes' (the routing tasks decode and pre-aggregate each batch into (key, pane) rows with the "
        "shards' parameters, the shards evaluate; engine/shards/panes.py) or 'records' (the routing tasks "
        "send each shard its keys' Kafka records, the shard decodes and pre-aggregates them alone). Fixed "
        "per checkpoint",
    )
    engine_shard_delivery: Literal["tasks", "driver"] = Field(
        "tasks",
        description="who produces the sharded mode's Kafka output (docs/engine.md 'Delivery from Spark "
        "tasks'): 'tasks' (each shard's task produces its alerts, results, tombstones and dead letters "
        "in a Kafka transaction of its own, then the driver commits the batch in PostgreSQL) or 'driver' "
        "(the driver produces the merged batch after PostgreSQL's commit, as the driver's engine does). "
        "The alert cap (engine_alert_cap_per_lookup > 0) needs the merged alerts: 'driver' then, "
        "whatever this says. Fixed per checkpoint",
    )
    engine_numpy_hugepages: bool = Field(
        True,
        description="true: NumPy's own choice of transparent-huge-page advice on its large arrays in the "
        "engine's driver and Spark's Python workers (NumPy's default: on); false: none -- where the kernel's "
        "transparent_hugepage/defrag is 'madvise' a state column's growth then no longer stalls on "
        "memory compaction, at some CPU (engine.runtime.hugepages)",
    )
    engine_gc_threshold: int = Field(
        100_000,
        description="allocations between collections of Python's youngest GC generation in the engine and "
        "the backtest (0: Python's default 700; docs/engine.md, 'Garbage collection')",
    )
    engine_lookup_every_ms: int | None = Field(
        None,
        description="the engine looks every rule up at each multiple of this (a multiple of pane_ms; "
        "default pane_ms); alerts equal `tidewatch backtest --every` this",
    )
    engine_alert_cap_per_lookup: int = Field(
        0,
        ge=0,
        description="at most this many alerts per subscription and lookup time in the alert log and the "
        "alerts topic, the rest withheld and said by one CAPPED record (current_results and the results "
        "topic stay exact); 0: no cap (docs/engine.md, 'Alert cap')",
    )
    engine_overload_high: float = Field(
        0.9,
        gt=0,
        description="overload policy: a batch whose evaluation took more than this fraction of the trigger "
        "interval raises the degradation one step (the lookups of subscriptions with a staleness budget "
        "spaced, loosest budget first; docs/engine.md, 'Overload')",
    )
    engine_overload_low: float = Field(
        0.5,
        ge=0,
        description="overload policy: engine_overload_patience batches in a row below this fraction of the "
        "trigger interval lower the degradation one step (below engine_overload_high: hysteresis)",
    )
    engine_overload_patience: int = Field(
        3, ge=1, description="overload policy: batches in a row below engine_overload_low before a step down"
    )

    # --- reliability and security (helper REL; docs/RELIABILITY.md) ---------------
    max_rule_window_days: float = Field(
        366.0, description="longest time window a rule may use (longer: refused; the engine keeps that much)"
    )
    max_rule_rows: int = Field(1_000_000, description="largest n of a rule's LAST n ROWS window")
    pg_engine_password: str | None = Field(
        None, description="password of the PostgreSQL role tidewatch_engine (None: role cannot log in)"
    )
    pg_dashboard_password: str | None = Field(
        None, description="password of the PostgreSQL role tidewatch_dashboard (None: role cannot log in)"
    )
    pg_relay_password: str | None = Field(
        None, description="password of the PostgreSQL role tidewatch_relay (None: role cannot log in)"
    )
    kafka_security: Literal["plaintext", "scram", "ssl", "scram_ssl"] = Field(
        "plaintext",
        description="Kafka security protocol of every app client and of the embedded broker: 'plaintext' "
        "(default: PLAINTEXT), 'scram' (SASL/SCRAM-SHA-512 + ACLs over SASL_PLAINTEXT; every app client "
        "connects as its principal), 'ssl' (TLS: SSL) or 'scram_ssl' (SCRAM + ACLs over TLS: SASL_SSL); "
        "docs/RELIABILITY.md",
    )
    kafka_ssl_ca_location: Path | None = Field(
        None,
        description="TLS modes: CA certificate(s), PEM, the broker's certificate must chain to (librdkafka "
        "ssl.ca.location, Java ssl.truststore.location of type PEM); None: the embedded broker's CA "
        "(<run_dir>/kafka/tls/ca.pem) when `tidewatch up` made one, else the system's trust store",
    )
    kafka_ssl_verify_hostname: bool = Field(
        True,
        description="TLS modes: the broker's certificate must name the host connected to "
        "(ssl.endpoint.identification.algorithm=https); false checks only its chain",
    )
    kafka_ssl_certificate_location: Path | None = Field(
        None,
        description="TLS modes: client certificate chain, PEM, for a broker that asks for one "
        "(ssl.client.auth); None: no client certificate",
    )
    kafka_ssl_key_location: Path | None = Field(
        None,
        description="its private key, PEM (PKCS#8: 'BEGIN PRIVATE KEY' or 'BEGIN ENCRYPTED PRIVATE KEY', "
        "which Spark's Java client needs); None: in the kafka_ssl_certificate_location file",
    )
    kafka_ssl_key_password: str | None = Field(None, description="password of an encrypted client key")
    kafka_admin_password: str | None = Field(
        None, description="SCRAM password of the broker's super user 'admin'"
    )
    kafka_feed_password: str | None = Field(None, description="SCRAM password of principal 'feed'")
    kafka_engine_password: str | None = Field(None, description="SCRAM password of principal 'engine'")
    kafka_dashboard_password: str | None = Field(None, description="SCRAM password of principal 'dashboard'")
    kafka_relay_password: str | None = Field(None, description="SCRAM password of principal 'relay'")

    # --- dashboard: login rate limit across clients (helper DASH) -----------------
    login_max_failures_per_user: int = Field(
        50,
        description="failed logins of one user name from all clients together within login_window_s "
        "before every client is refused (bounds guessing from many addresses)",
    )
    feed_commit_every: int = Field(
        10_000, description="resumable file feeds (--resume): records per Kafka transaction"
    )
    feed_progress_dir: Path | None = Field(
        None, description="progress files of resumable feeds (default: <run_dir>/feed-progress)"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Secret files from ``TIDEWATCH_SECRETS_DIR`` (lowest priority: the environment wins)."""
        secrets_dir = os.environ.get(SECRETS_DIR_VARIABLE)
        if secrets_dir and getattr(file_secret_settings, "secrets_dir", None) is None:
            path = Path(secrets_dir).resolve()
            if path.is_relative_to(PROJECT_ROOT):
                raise ValueError(
                    f"{SECRETS_DIR_VARIABLE}={secrets_dir} is inside the repository ({PROJECT_ROOT}); "
                    "keep secret files outside it"
                )
            if not path.is_dir():
                raise ValueError(f"{SECRETS_DIR_VARIABLE}={secrets_dir} is not a directory")
            file_secret_settings = SecretsSettingsSource(settings_cls, secrets_dir=path)
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("kafka_security", mode="before")
    @classmethod
    def _security_lower_case(cls, value: object) -> object:
        """``SCRAM_SSL`` reads like Kafka's own names; accept it in any case."""
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _overload_marks_apart(self) -> Settings:
        """The overload policy's low mark below its high mark (else it steps up and down at once)."""
        if self.engine_overload_low >= self.engine_overload_high:
            raise ValueError(
                f"engine_overload_low ({self.engine_overload_low}) must be below engine_overload_high "
                f"({self.engine_overload_high})"
            )
        return self

    @model_validator(mode="after")
    def _no_demo_passwords_in_production(self) -> Settings:
        """``deployment = "production"`` refuses every built-in demo password, naming the variable."""
        if self.deployment != "production":
            return self
        bad = [f for f, demo in DEMO_PASSWORDS.items() if getattr(self, f) == demo]
        if self.database_url and urlsplit(self.database_url).password in DEMO_PASSWORDS.values():
            bad.append("database_url")
        if bad:
            names = ", ".join(f"TIDEWATCH_{f.upper()}" for f in bad)
            raise ValueError(
                f"TIDEWATCH_DEPLOYMENT=production refuses the built-in demo password of {names}: set "
                f"{'it' if len(bad) == 1 else 'each'} in the environment or as a file of that name in "
                f"{SECRETS_DIR_VARIABLE} (outside the repository)"
            )
        return self

    @model_validator(mode="after")
    def _bootstrap_follows_port(self) -> Settings:
        """Without an explicit ``kafka_bootstrap``, clients use the embedded broker's ``kafka_port``."""
        if "kafka_bootstrap" not in self.model_fields_set:
            # frozen model: set the derived value directly (and mark it set, as an assignment would)
            object.__setattr__(self, "kafka_bootstrap", f"127.0.0.1:{self.kafka_port}")
            self.model_fields_set.add("kafka_bootstrap")
        return self

    def stream_topic(self, stream: str) -> str:
        """The Kafka topic of an event stream (``trades`` or ``packets``)."""
        return {"trades": self.topic_trades, "packets": self.topic_packets}[stream]

    @property
    def lookup_period_ms(self) -> int:
        """The engine's lookup period: ``engine_lookup_every_ms``, default ``pane_ms``."""
        return int(self.engine_lookup_every_ms or self.pane_ms)

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            return self.database_url
        return (
            f"postgresql+psycopg2://{self.pg_user}:{self.pg_password}"
            f"@{self.pg_host}:{self.pg_port}/{self.pg_database}"
        )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once).

    Called only at entry points (CLI commands, ``python -m`` mains, ``migrations/env.py``, the
    Streamlit app, benchmarks, tests); library code takes a :class:`Settings` argument."""
    return Settings()
