"""One settings object for all of Tidewatch.

Every tunable lives here and is read from the environment (prefix ``TIDEWATCH_``)
or from a ``.env`` file; nothing else in the code base reads ``os.environ`` for
configuration.  Secrets (passwords) come from the environment or from files
outside the repository, never from code.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The repository / installation root (parent of the ``tidewatch`` package).
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    """Tidewatch configuration.  ``TIDEWATCH_<FIELD>`` overrides each field."""

    model_config = SettingsConfigDict(env_prefix="TIDEWATCH_", env_file=".env", extra="ignore")

    # --- where things live -------------------------------------------------
    cache_dir: Path = Field(PROJECT_ROOT / ".cache", description="downloads: Kafka jars, Ivy cache")
    run_dir: Path = Field(PROJECT_ROOT / ".run", description="data dirs, logs and PID files of the embedded stack")

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

    # --- PostgreSQL ----------------------------------------------------------
    pg_host: str = "127.0.0.1"
    pg_port: int = 15432
    pg_user: str = "tidewatch"
    pg_password: str = "tidewatch"
    pg_database: str = "tidewatch"
    database_url: str | None = Field(None, description="overrides the pg_* fields when set")

    # --- Spark / engine ------------------------------------------------------
    spark_master: str = "local[2]"
    spark_version: str = "4.3.0"
    pane_ms: int = Field(1000, description="pane (basic window) width g in ms; divides every window")
    trigger_seconds: float = 1.0
    allowed_lateness_ms: int = 5000
    max_future_ms: int = 60_000
    checkpoint_dir: Path | None = None
    snapshot_every_batches: int = 50

    # --- collective indexes --------------------------------------------------
    ci_p: int = Field(8, description="CI-COUNT / CI-SUM parameter p (epsilon ~ 2/p), section 4.1.2")

    # --- dashboard -----------------------------------------------------------
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 18501

    # --- rule language limits -----------------------------------------------
    max_rule_chars: int = 4000
    max_rule_depth: int = 32
    max_rule_aggregates: int = 32

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
    """The process-wide settings (read once)."""
    return Settings()
