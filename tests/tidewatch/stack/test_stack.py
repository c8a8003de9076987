"""The data-driven app list and status of ``tidewatch up`` (no services started)."""

from __future__ import annotations

from tidewatch.settings import Settings
from tidewatch.stack import embedded as stack


def test_cli_paths_are_detected():
    assert stack._cli_has("up")
    assert stack._cli_has("db", "upgrade")
    assert not stack._cli_has("no-such-command")
    assert not stack._cli_has("up", "deeper")


def test_apps_have_distinct_names_and_loopback_dashboard():
    names = [a.name for a in stack.APPS]
    assert len(names) == len(set(names)) and {"relay", "engine", "dashboard", "feed"} <= set(names)
    dash = next(a for a in stack.APPS if a.name == "dashboard")
    argv = dash.argv(Settings(dashboard_port=18555))
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.port") + 1] == "18555"


def test_status_of_an_empty_run_dir_says_nothing_runs(tmp_path):
    rows = {r["name"]: r for r in stack.status_rows(Settings(run_dir=tmp_path))}
    assert rows["postgres"]["state"] == "stopped" and rows["kafka"]["state"] == "stopped"
    assert all(r["pid"] == "-" for r in rows.values())
    for app in stack.APPS:
        assert rows[app.name]["state"] in ("stopped", "not built yet")


def test_status_names_the_logs_in_one_line_under_the_table():
    """The logs' paths are not table cells (they wrapped the table at 80 columns): one line."""
    row = lambda name, log: {"name": name, "log": log}  # noqa: E731
    assert stack.log_line([row("postgres", "-")]) == "logs: none yet"
    same = [row("relay", ".run/logs/relay.log"), row("engine", ".run/logs/engine.log"), row("kafka", "-")]
    assert stack.log_line(same) == "logs: .run/logs/<component>.log"
    mixed = [row("relay", ".run/logs/relay.log"), row("postgres", "/var/pg/server.log")]
    assert stack.log_line(mixed) == "logs: relay .run/logs/relay.log; postgres /var/pg/server.log"
    up = [row("postgres", ".run/postgres/postgres.log"), row("kafka", ".run/kafka/stdout.log")]
    up += [row(n, f".run/logs/{n}.log") for n in ("supervisord", "relay", "engine")]
    assert stack.log_line(up) == (
        "logs: .run/logs/<component>.log; postgres .run/postgres/postgres.log; kafka .run/kafka/stdout.log"
    )
