"""``tidewatch up | down | status`` and ``tidewatch db …``: the embedded stack.

``up`` starts, as local processes on 127.0.0.1 with private ports: PostgreSQL (migrated to
Alembic head), Kafka (KRaft, topics created), then the app processes that exist in this
checkout -- the engine, the dashboard and a demo feed.  The app list is data
(:data:`APPS`); an app whose command or file is not there yet is skipped with a message.
``down`` stops exactly the processes ``up`` recorded in ``<run_dir>/pids`` (children
included), apps first, PostgreSQL last.  ``status`` shows what runs.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tidewatch.kafka import client as kafka_client
from tidewatch.settings import PROJECT_ROOT, Settings, get_settings
from tidewatch.stack import kafka_broker as kafka_service
from tidewatch.stack import postgres_server as pg_service
from tidewatch.stack import processes as process

console = Console(stderr=True)
out = Console()


# --- the app processes -----------------------------------------------------------------------


def _cli_has(*path: str) -> bool:
    """Whether ``tidewatch <path…>`` is a registered command (the area module exists)."""
    from tidewatch.cli import app

    # typer >= 0.20 vendors click, so duck-type the group instead of isinstance(click.Group)
    cmd = typer.main.get_command(app)
    ctx = cmd.context_class(cmd)
    for name in path:
        get = getattr(cmd, "get_command", None)
        if get is None:
            return False
        cmd = get(ctx, name)
        if cmd is None:
            return False
    return True


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback only
            return bool(resp.status == 200)
    except OSError:
        return False


@dataclass(frozen=True)
class App:
    """An app process of the stack: how to tell it exists, start it, and check it."""

    name: str
    what: str
    available: Callable[[], bool]
    missing: str
    argv: Callable[[Settings], list[str]]
    port: Callable[[Settings], int | None] = lambda s: None
    health_url: Callable[[Settings], str | None] = lambda s: None
    env: Callable[[Settings], dict[str, str]] = field(default=lambda s: {})
    #: seconds to wait for health (or, without a health URL, to see it stay up)
    settle_s: float = 3.0
    #: its Kafka principal (:data:`tidewatch.kafka.client.PRINCIPALS`; SCRAM user in the SCRAM modes)
    principal: str | None = None


def _kafka_env(s: Settings, principal: str | None) -> dict[str, str]:
    """In the SCRAM modes (scram, scram_ssl): the process's own SCRAM password and an empty one
    for every other principal (admin included), so it cannot log in as another principal even if
    the others' passwords are in the environment, ``.env`` or the secrets dir.  Nothing in the
    other modes."""
    if not kafka_client.scram_enabled(s):
        return {}
    env = {kafka_client.password_variable(p): "" for p in (kafka_client.ADMIN, *kafka_client.PRINCIPALS)}
    if principal is not None:
        env[kafka_client.password_variable(principal)] = kafka_client.client_config(s, principal)[
            "sasl.password"
        ]
    return env


def _role_env(s: Settings, proc: str) -> dict[str, str]:
    """``TIDEWATCH_DATABASE_URL`` of the process's least-privilege role when its password is
    configured (``TIDEWATCH_PG_<PROC>_PASSWORD``; migration 0002_roles), else nothing."""
    url = pg_service.process_url(s, proc)
    return {"TIDEWATCH_DATABASE_URL": url} if url else {}


def _tidewatch(*args: str) -> list[str]:
    return [sys.executable, "-m", "tidewatch.cli", *args]


APPS: list[App] = [
    App(
        name="relay",
        principal="relay",
        what="outbox relay (subscription changes to Kafka)",
        available=lambda: _cli_has("subscriptions", "relay"),
        missing="`tidewatch subscriptions relay` is not there yet (subscriptions/store_cli.py)",
        argv=lambda s: _tidewatch("subscriptions", "relay"),
        env=lambda s: _role_env(s, "relay"),
        settle_s=3.0,
    ),
    App(
        name="engine",
        principal="engine",
        what="Spark engine",
        available=lambda: _cli_has("engine", "run"),
        missing="`tidewatch engine run` is not there yet (engine/cli.py)",
        argv=lambda s: _tidewatch("engine", "run"),
        env=lambda s: {
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            **_role_env(s, "engine"),
        },
        settle_s=5.0,
    ),
    App(
        name="dashboard",
        principal="dashboard",
        what="Streamlit dashboard",
        available=lambda: (PROJECT_ROOT / "dashboard" / "app.py").is_file(),
        missing="dashboard/app.py is not there yet",
        argv=lambda s: [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(PROJECT_ROOT / "dashboard" / "app.py"),
            "--server.address",
            s.dashboard_host,
            "--server.port",
            str(s.dashboard_port),
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ],
        port=lambda s: s.dashboard_port,
        health_url=lambda s: f"http://{s.dashboard_host}:{s.dashboard_port}/_stcore/health",
        env=lambda s: _role_env(s, "dashboard"),
        settle_s=60.0,
    ),
    App(
        name="feed",
        principal="feed",
        what="demo trades feed",
        available=lambda: _cli_has("feed", "trades"),
        missing="`tidewatch feed trades` is not there yet (ingest/cli.py)",
        argv=lambda s: _tidewatch("feed", "trades", "--demo"),
        settle_s=3.0,
    ),
]


def _log(s: Settings, name: str) -> Path:
    return s.run_dir / "logs" / f"{name}.log"


def start_app(app: App, s: Settings) -> process.ProcessRecord:
    rec = process.read_record(s.run_dir, app.name)
    if process.is_running(rec):
        assert rec is not None
        return rec
    env = {**os.environ, **app.env(s), **_kafka_env(s, app.principal)}
    rec = process.spawn(
        s.run_dir, app.name, app.argv(s), log=_log(s, app.name), cwd=PROJECT_ROOT, env=env, port=app.port(s)
    )
    url = app.health_url(s)

    def ready() -> bool:
        if not process.is_running(rec):
            raise process.StartupFailed(f"{app.name} exited at start-up; see {_log(s, app.name)}")
        return url is not None and _http_ok(url)

    try:
        if url is not None:
            process.wait_until(ready, timeout=app.settle_s, what=app.what)
        else:
            deadline = time.monotonic() + app.settle_s
            while time.monotonic() < deadline:
                ready()
                time.sleep(0.25)
    except BaseException as exc:
        process.stop(s.run_dir, app.name)  # kills it if it hangs, drops the record either way
        tail = _tail(_log(s, app.name))
        raise RuntimeError(f"{exc}" + (f"\n--- last lines of its log ---\n{tail}" if tail else "")) from exc
    return rec


def _tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# --- up / down / status ---------------------------------------------------------------------


def check_kafka_secrets(s: Settings, principals: list[str]) -> None:
    """Fail before anything starts when a needed SCRAM password is missing (the SCRAM modes; the
    message names the variable) or a TLS file set is not there (the TLS modes)."""
    if kafka_client.security_protocol(s) != "PLAINTEXT":
        for principal in (kafka_client.ADMIN, *principals):
            kafka_client.client_config(s, principal)


def _start_kafka(s: Settings) -> process.ProcessRecord:
    """Start Kafka; in the SCRAM modes also create every principal's SCRAM user and ACLs (as admin)."""
    rec = kafka_service.start(s)
    if kafka_client.tls_enabled(s):
        console.print(
            f"[green]✓[/] Kafka over TLS ({kafka_client.security_protocol(s)}); its CA: "
            f"{kafka_client.embedded_ca(s)} (clients elsewhere: TIDEWATCH_KAFKA_SSL_CA_LOCATION)"
        )
    if kafka_client.scram_enabled(s):
        users = kafka_client.ensure_principals(s, bootstrap=f"127.0.0.1:{s.kafka_port}")
        console.print(f"[green]✓[/] Kafka SASL/SCRAM principals and ACLs: {', '.join(users) or 'none'}")
    return rec


def start_services(s: Settings, *, migrate: bool = True, topics: bool = True) -> None:
    """PostgreSQL and Kafka (in parallel), then the migrations and the topics."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        fut_pg = pool.submit(pg_service.start, s)
        fut_kafka = pool.submit(_start_kafka, s)
        errors = []
        for what, fut in (("PostgreSQL", fut_pg), ("Kafka", fut_kafka)):
            try:
                rec = fut.result()
                port = s.pg_port if what == "PostgreSQL" else s.kafka_port
                console.print(f"[green]✓[/] {what} on 127.0.0.1:{port} (pid {rec.pid})")
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{what}: {exc}")
        if errors:
            raise RuntimeError("\n".join(errors))
    if migrate:
        from tidewatch.db import migrate as db_migrate

        db_migrate.upgrade(s.sqlalchemy_url)
        console.print(f"[green]✓[/] database migrated to {db_migrate.current(s.sqlalchemy_url)}")
    if topics:
        from tidewatch.kafka.admin import ensure_topics

        status = ensure_topics(f"127.0.0.1:{s.kafka_port}", s)
        created = [t for t, st in status.items() if st == "created"]
        console.print(
            f"[green]✓[/] topics ready ({', '.join(status)})"
            + (f"; created {len(created)}" if created else "")
        )


def seed_demo(s: Settings) -> None:
    """Create the demo account with the trade examples of RULES.md as subscriptions (once).

    The demo feed injects the episodes these rules look for, so alerts arrive within a minute
    of `tidewatch up`; log in to the dashboard as ``settings.demo_user``.
    """
    from dashboard import TEMPLATES, sign_up  # the packages' public API (their __all__)
    from subscriptions import SubscriptionService

    if _user_exists(s):  # seeded before; what the user changed since stays as it is
        return
    service = SubscriptionService(settings=s)
    sign_up(service.sessions, s.demo_user, s.demo_password)
    trade_rules = {name: text for name, text in TEMPLATES.items() if " FROM trades" in text}
    for name, text in trade_rules.items():
        service.create(s.demo_user, text, name=name)
    console.print(
        f"[green]✓[/] demo account {s.demo_user!r} (password {s.demo_password!r}) "
        f"with {len(trade_rules)} example subscriptions"
    )


def _user_exists(s: Settings) -> bool:
    from sqlalchemy import select

    from tidewatch.db.models import User
    from tidewatch.db.session import session_scope

    with session_scope(s.sqlalchemy_url) as session:
        return session.scalar(select(User.id).where(User.username == s.demo_user)) is not None


def _running(s: Settings) -> set[str]:
    return {r.name for r in process.all_records(s.run_dir) if process.is_running(r)}


def stop_all(s: Settings, *, only: set[str] | None = None) -> list[str]:
    """Stop recorded processes (all, or the names in ``only``): apps in reverse start order,
    anything else recorded, then Kafka, then PostgreSQL."""
    wanted = (lambda name: True) if only is None else (lambda name: name in only)
    stopped = []
    for app in reversed(APPS):
        if wanted(app.name) and process.stop(s.run_dir, app.name):
            stopped.append(app.name)
    known = {a.name for a in APPS} | {kafka_service.NAME, pg_service.NAME}
    for rec in process.all_records(s.run_dir):
        if rec.name not in known and wanted(rec.name) and process.stop(s.run_dir, rec.name):
            stopped.append(rec.name)
    if wanted(kafka_service.NAME) and kafka_service.stop(s):
        stopped.append(kafka_service.NAME)
    if wanted(pg_service.NAME) and pg_service.stop(s):
        stopped.append(pg_service.NAME)
    return stopped


def up(
    services_only: Annotated[
        bool, typer.Option("--services-only", help="only Kafka and PostgreSQL (migrated, topics)")
    ] = False,
    skip: Annotated[
        list[str] | None, typer.Option("--skip", help="an app not to start: relay, engine, dashboard, feed")
    ] = None,
) -> None:
    """Start the embedded stack: Kafka, PostgreSQL (migrated), engine, dashboard, demo feed."""
    s = get_settings()
    apps = [] if services_only else [a for a in APPS if a.name not in (skip or [])]
    try:
        check_kafka_secrets(s, [a.principal for a in apps if a.principal])
    except (RuntimeError, ValueError) as exc:
        console.print(f"[red]✗ cannot start:[/] {exc}")
        raise typer.Exit(2) from None
    already = _running(s)
    try:
        start_services(s)
        if not services_only:
            seed_demo(s)
            for app in APPS:
                if app not in apps:
                    console.print(f"[dim]-[/] {app.what}: skipped (--skip)")
                    continue
                if not app.available():
                    console.print(f"[yellow]![/] {app.what}: not started, {app.missing}")
                    continue
                rec = start_app(app, s)
                where = f" on {s.dashboard_host}:{app.port(s)}" if app.port(s) else ""
                console.print(f"[green]✓[/] {app.what}{where} (pid {rec.pid}, log {_log(s, app.name)})")
    except (Exception, KeyboardInterrupt) as exc:
        console.print(f"[red]✗ start-up failed:[/] {exc}")
        # undo only what this invocation started; what ran before keeps running
        stopped = stop_all(s, only=_running(s) - already)
        console.print(f"stopped again: {', '.join(stopped) or 'nothing'}")
        raise typer.Exit(1) from None
    if process.is_running(process.read_record(s.run_dir, "dashboard")):
        out.print(f"Dashboard: [bold]http://{s.dashboard_host}:{s.dashboard_port}[/]")
    out.print("Stop everything with: [bold]tidewatch down[/]")


def down() -> None:
    """Stop exactly what `tidewatch up` started (by PID, children included)."""
    s = get_settings()
    stopped = stop_all(s)
    out.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


def _health(name: str, s: Settings) -> str:
    if name == kafka_service.NAME:
        return "ok" if kafka_service.healthy(s) else "not answering"
    if name == pg_service.NAME:
        return "ok" if pg_service.healthy(s) else "not answering"
    app = next((a for a in APPS if a.name == name), None)
    if app is not None and (url := app.health_url(s)):
        return "ok" if _http_ok(url) else "not answering"
    return "ok"


def _short(path: str) -> str:
    try:
        return os.path.relpath(path, PROJECT_ROOT) if path.startswith(str(PROJECT_ROOT)) else path
    except ValueError:
        return path


def status_rows(s: Settings) -> list[dict[str, str]]:
    rows = []
    names = [pg_service.NAME, kafka_service.NAME, *(a.name for a in APPS)]
    names += [r.name for r in process.all_records(s.run_dir) if r.name not in names]
    ports = {pg_service.NAME: s.pg_port, kafka_service.NAME: s.kafka_port}
    for name in names:
        rec = process.read_record(s.run_dir, name)
        running = process.is_running(rec)
        app = next((a for a in APPS if a.name == name), None)
        if running:
            state, health = "running", _health(name, s)
        elif rec is not None:
            state, health = "dead (stale pid file)", "-"
        elif app is not None and not app.available():
            state, health = "not built yet", "-"
        else:
            state, health = "stopped", "-"
        port = rec.port if rec and rec.port else ports.get(name) or (app.port(s) if app else None)
        rows.append(
            {
                "name": name,
                "state": state,
                "pid": str(rec.pid) if rec and running else "-",
                "port": str(port) if port else "-",
                "health": health,
                "log": _short(rec.log) if rec and rec.log else "-",
            }
        )
    return rows


def status() -> None:
    """What runs: component, PID, port, health."""
    table = Table(title="tidewatch status")
    for col in ("component", "state", "pid", "port", "health", "log"):
        table.add_column(col)
    for r in status_rows(get_settings()):
        colour = (
            "green"
            if r["state"] == "running" and r["health"] == "ok"
            else ("yellow" if r["state"] == "running" else "dim")
        )
        table.add_row(r["name"], f"[{colour}]{r['state']}[/]", r["pid"], r["port"], r["health"], r["log"])
    out.print(table)


# --- tidewatch db ---------------------------------------------------------------------------

db_app = typer.Typer(help="Database schema (Alembic migrations in migrations/).", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Migrate the database up to REVISION (default head)."""
    from tidewatch.db import migrate as db_migrate

    url = get_settings().sqlalchemy_url
    db_migrate.upgrade(url, revision=revision)
    out.print(f"database at {db_migrate.current(url)}")


@db_app.command("downgrade")
def db_downgrade(revision: Annotated[str, typer.Argument(help="target revision, e.g. base or -1")]) -> None:
    """Migrate the database down to REVISION."""
    from tidewatch.db import migrate as db_migrate

    url = get_settings().sqlalchemy_url
    db_migrate.downgrade(url, revision=revision)
    out.print(f"database at {db_migrate.current(url)}")


@db_app.command("current")
def db_current() -> None:
    """Print the revision the database is at."""
    from tidewatch.db import migrate as db_migrate

    out.print(str(db_migrate.current(get_settings().sqlalchemy_url)))


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
    app.add_typer(db_app, name="db")
