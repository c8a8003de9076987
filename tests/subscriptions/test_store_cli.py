"""``tidewatch subscribe`` / ``tidewatch subscriptions …`` end to end against a real PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pytest
from typer.testing import CliRunner

from subscriptions import store_cli
from subscriptions.service import SubscriptionService
from tidewatch.cli import app
from tidewatch.db import migrate
from tidewatch.settings import get_settings

pytestmark = pytest.mark.integration

RULE = "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDS > 1000"


@pytest.fixture()
def cli(pg_url, monkeypatch):
    migrate.upgrade(pg_url)
    svc = SubscriptionService(settings=get_settings(), url=pg_url, topic=f"test-cli-{uuid.uuid4().hex[:8]}")
    monkeypatch.setattr(store_cli, "_service", lambda: svc)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def _listed(cli, user: str, *extra: str) -> list[dict]:
    res = cli("subscriptions", "list", "--user", user, "--json", *extra)
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def test_subscribe_list_pause_resume_delete(cli):
    user, other = f"cli-{uuid.uuid4().hex[:6]}", f"cli-{uuid.uuid4().hex[:6]}"
    res = cli("subscribe", "--user", user, "--name", "vol", RULE)
    assert res.exit_code == 0 and "subscribed vol" in res.stdout
    assert [(s["name"], s["state"], s["version"]) for s in _listed(cli, user)] == [("vol", "active", 1)]

    assert cli("subscriptions", "pause", "vol", "--user", user).exit_code == 0
    assert _listed(cli, user)[0]["state"] == "paused"
    assert cli("subscriptions", "resume", "vol", "--user", user).exit_code == 0
    assert _listed(cli, user)[0]["state"] == "active"

    # another user sees nothing and can change nothing
    assert _listed(cli, other) == []
    res = cli("subscriptions", "delete", "vol", "--user", other)
    assert res.exit_code == 1 and "no subscription" in res.output
    assert _listed(cli, user)[0]["state"] == "active"

    assert cli("subscriptions", "delete", "vol", "--user", user).exit_code == 0
    assert _listed(cli, user) == []
    assert _listed(cli, user, "--all")[0]["state"] == "deleted"


def test_a_bad_rule_is_refused_with_its_position(cli):
    user = f"cli-{uuid.uuid4().hex[:6]}"
    res = cli("subscribe", "--user", user, RULE.replace("size", "sise"))
    assert res.exit_code == 1
    assert "rule refused" in res.output and "line 1, column" in res.output and "size" in res.output
    assert _listed(cli, user) == []


def test_staleness_is_set_shown_changed_and_cleared(cli):
    user = f"cli-{uuid.uuid4().hex[:6]}"
    res = cli("subscribe", "--user", user, "--name", "vol", "--staleness", "30s", RULE)
    assert res.exit_code == 0, res.output
    assert "staleness=30s" in res.stdout
    assert [(s["name"], s["staleness_budget_ms"]) for s in _listed(cli, user)] == [("vol", 30_000)]
    res = cli("subscriptions", "update", "vol", "--user", user, "--staleness", "2m")
    assert res.exit_code == 0 and "version=2" in res.stdout and "staleness=2min" in res.stdout
    table = cli("subscriptions", "list", "--user", user)
    assert table.exit_code == 0 and "staleness" in table.stdout and "2 min" in table.stdout
    assert cli("subscriptions", "update", "vol", "--user", user, "--staleness", "none").exit_code == 0
    assert _listed(cli, user)[0]["staleness_budget_ms"] is None
    shown = cli("subscriptions", "show", "vol", "--user", user)
    assert shown.exit_code == 0 and "staleness budget: none" in shown.stdout
    lines = [ln.split() for ln in shown.stdout.splitlines() if ln.strip().startswith("v")]
    assert [(ln[0], ln[-1]) for ln in lines] == [
        ("v1", "staleness=30s"),
        ("v2", "staleness=2min"),
        ("v3", "staleness=none"),
    ]


@pytest.mark.parametrize(
    ("staleness", "says"),
    [
        ("soon", "is not a duration: write e.g. 30s, 2m or 1h"),
        ("100ms", "shorter than the engine's lookup period (1 s)"),
        ("2d", "longer than the most allowed (24 h)"),
    ],
)
def test_a_bad_staleness_is_refused_with_what_to_do(cli, staleness, says):
    user = f"cli-{uuid.uuid4().hex[:6]}"
    res = cli("subscribe", "--user", user, "--staleness", staleness, RULE)
    assert res.exit_code == 1 and says in " ".join(res.output.split())
    assert _listed(cli, user) == []


def test_staleness_is_explained_in_help(cli):
    res = cli("subscriptions", "update", "--help")
    text = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 0 and "--staleness" in text
    assert "30s, 2m, 1h" in text and "'none'" in text and "overloaded" in text
