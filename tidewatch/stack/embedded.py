"""``tidewatch up | down | status | restart`` and ``tidewatch db …``: the embedded stack.

``up`` starts, as local processes on 127.0.0.1 with private ports: PostgreSQL (migrated to
Alembic head), Kafka (KRaft, topics created), then the app processes that exist in this
checkout -- the outbox relay, the engine, the dashboard and a demo feed.  The app list is data
(:data:`APPS`); an app whose command or file is not there yet is skipped with a message.

The apps run under supervisord (:mod:`tidewatch.stack.supervision`), which restarts one that
exits and leaves one that keeps failing at start-up ``FATAL``; ``up`` starts them one by one
through it and waits for each (``RUNNING`` for its ``startsecs``, and its health URL if it has
one).  Kafka and PostgreSQL stay outside it, started and recorded by ``up`` itself: they come
first, need set-up between start and use (storage format, SCRAM users and ACLs, roles,
migrations, topics) that a restart by supervisord would skip, PostgreSQL is started by
``pg_ctl`` as the ``postgres`` user, and the apps already ride out a restart of either
(docs/RELIABILITY.md).  Every process ``up`` starts itself -- Kafka, PostgreSQL, supervisord --
is recorded in ``<run_dir>/pids``.  ``down`` stops supervisord (which stops the apps in reverse
start order), then Kafka, then PostgreSQL, each by its recorded PID, children included.
``status`` shows what runs, each app's state from supervisord, and exits 1 when something that
should run does not; ``restart APP`` restarts one app through supervisord.

``up --workers N`` also starts a Spark standalone master and N workers on 127.0.0.1 as
supervisord programs (:mod:`tidewatch.stack.spark_cluster`), waits until the master reports N
ALIVE workers, and starts the engine on it (``spark_master = spark://127.0.0.1:PORT``).
"""

from __future__ import annotations

import enum
import os
import sys
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from tidewatch.kafka import client as kafka_client
from tidewatch.settings import PROJECT_ROOT, Settings, get_settings
from tidewatch.stack import db_cli, supervision
from tidewatch.stack import kafka_broker as kafka_service
from tidewatch.stack import postgres_server as pg_service
from tidewatch.stack import processes as process
from tidewatch.stack import spark_cluster as cluster_mod
from tidewatch.stack.logs import log_line

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
    #: seconds to wait for its health URL once it is RUNNING
    settle_s: float = 3.0
    #: its Kafka principal (:data:`tidewatch.kafka.client.PRINCIPALS`; SCRAM user in the SCRAM modes)
    principal: str | None = None
    #: supervisord: seconds it must stay up for a start to count (fewer: a failed start, retried
    #: ``startretries`` times, then FATAL); seconds from SIGTERM to SIGKILL when it is stopped
    startsecs: int = 3
    stopwaitsecs: int = 15
    #: SIGTERM to its whole process group (False: to the app alone, which stops its children)
    stopasgroup: bool = True
    #: supervisord's ``priority`` (start order; stopped in the reverse one); None: by its place in APPS
    priority: int | None = None


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
        # a transaction stalled by a broker outage is given up after relay_kafka_stall_s (20 s)
        stopwaitsecs=30,
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
        startsecs=10,
        # SIGTERM to the engine alone: it stops its Spark JVM (spark.stop()) and waits for a
        # snapshot being written; its batch transaction is given up after engine_kafka_stall_s
        stopwaitsecs=40,
        stopasgroup=False,
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
            "--client.toolbarMode",
            "viewer",  # no "Deploy" button (issue 21)
        ],
        port=lambda s: s.dashboard_port,
        health_url=lambda s: f"http://{s.dashboard_host}:{s.dashboard_port}/_stcore/health",
        env=lambda s: _role_env(s, "dashboard"),
        settle_s=60.0,
        startsecs=5,
        stopwaitsecs=10,
    ),
    App(
        name="feed",
        principal="feed",
        what="demo trades feed",
        available=lambda: _cli_has("feed", "trades"),
        missing="`tidewatch feed trades` is not there yet (ingest/cli.py)",
        argv=lambda s: _tidewatch("feed", "trades", "--demo"),
    ),
]

APP_NAMES = [a.name for a in APPS]


class AppName(enum.StrEnum):
    """The apps ``tidewatch restart`` takes (the names of :data:`APPS`; a test checks they match)."""

    relay = "relay"
    engine = "engine"
    dashboard = "dashboard"
    feed = "feed"


def _log(s: Settings, name: str) -> Path:
    return s.run_dir / "logs" / f"{name}.log"


def cluster_apps(s: Settings) -> list[App]:
    """The Spark master and workers of the cluster ``up --workers N`` started in this run dir
    (:mod:`tidewatch.stack.spark_cluster`; none without one): supervisord programs after the relay
    and before the engine (``priority`` 11 and 12), so the engine is stopped first."""
    c = cluster_mod.load(s)
    if c is None:
        return []

    def daemon(name: str, what: str, port: int, webui: int, priority: int) -> App:
        return App(
            name=name,
            what=what,
            available=lambda: True,
            missing="",
            argv=lambda s: cluster_mod.argv(name, s, c),
            port=lambda s: port,
            health_url=lambda s: f"http://127.0.0.1:{webui}/json/",
            env=lambda s: cluster_mod.env(name, s),
            settle_s=60.0,
            startsecs=5,
            stopwaitsecs=20,
            priority=priority,
        )

    master = daemon(cluster_mod.MASTER, "Spark standalone master", c.master_port, c.webui_port, 11)
    workers = [
        daemon(cluster_mod.worker_name(i), f"Spark worker {i}", port, port, 12)
        for i, port in enumerate(c.worker_webui_ports, start=1)
    ]
    return [master, *workers]


def _priority(app: App) -> int:
    return app.priority if app.priority is not None else 10 * (APPS.index(app) + 1)


def all_apps(s: Settings) -> list[App]:
    """Every supervisord program of the run dir's stack: :data:`APPS` and the cluster's daemons,
    in start order."""
    return sorted([*APPS, *cluster_apps(s)], key=_priority)


def _app(name: str, s: Settings | None = None) -> App:
    return next(a for a in (APPS if s is None else all_apps(s)) if a.name == name)


def app_command(name: str, s: Settings) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of app ``name`` (run by :mod:`tidewatch.stack.app_exec`
    under supervisord): this process's environment, the app's own additions (its database role's
    URL; the engine's: the cluster's master, :func:`tidewatch.stack.spark_cluster.engine_env`) and
    its Kafka credentials (:func:`_kafka_env`; none for the Spark daemons)."""
    app = _app(name, s)
    extra = cluster_mod.engine_env(s, cluster_mod.load(s)) if name == "engine" else {}
    return app.argv(s), {**os.environ, **app.env(s), **extra, **_kafka_env(s, app.principal)}


def programs(s: Settings, apps: list[App]) -> list[supervision.Program]:
    """supervisord's programs of ``apps``, started in this order (``priority``) and stopped in the
    reverse one; each runs ``python -m tidewatch.stack.app_exec NAME`` (no secret in the conf)."""
    return [
        supervision.Program(
            name=app.name,
            argv=[sys.executable, "-m", "tidewatch.stack.app_exec", app.name],
            log=_log(s, app.name),
            priority=_priority(app),
            startsecs=app.startsecs,
            stopwaitsecs=app.stopwaitsecs,
            stopasgroup=app.stopasgroup,
        )
        for app in apps
    ]


def _shutdown_timeout(s: Settings) -> float:
    """supervisord stops the apps one after the other: their stop times, and a margin."""
    return float(sum(a.stopwaitsecs for a in all_apps(s)) + 15)


def start_app(app: App, s: Settings) -> dict[str, Any]:
    """Have supervisord start ``app`` and wait until it is RUNNING (and healthy, with a health
    URL); supervisord's process info.  On failure: stopped again, RuntimeError with its log's tail."""
    url = app.health_url(s)
    # every failed start waits out startsecs, then a back-off of 1, 2, 3 ... s
    timeout = (app.startsecs + 5) * 4 + (app.settle_s if url else 0.0)
    try:
        return supervision.start_program(
            s, app.name, timeout=timeout, ready=(lambda: _http_ok(url)) if url else None
        )
    except BaseException as exc:
        try:
            supervision.stop_program(s, app.name)
        except (supervision.SupervisionError, OSError):
            pass
        tail = supervision.tail(_log(s, app.name))
        raise RuntimeError(f"{exc}" + (f"\n--- last lines of its log ---\n{tail}" if tail else "")) from exc


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
    """Create the demo account with the trade examples of RULES.md as subscriptions (once;
    :data:`dashboard.rules.DEMO_SUBSCRIPTIONS`: the volume threshold set for the demo feed).

    The demo feed injects the episodes these rules look for, so alerts arrive within a minute
    of `tidewatch up`; log in to the dashboard as ``settings.demo_user``.
    """
    from dashboard import DEMO_SUBSCRIPTIONS, sign_up  # the packages' public API (their __all__)
    from subscriptions import SubscriptionService

    if _user_exists(s):  # seeded before; what the user changed since stays as it is
        console.print(
            f"[green]✓[/] demo account {s.demo_user!r} (password {s.demo_password!r}), "
            "its subscriptions as they were left"
        )
        return
    service = SubscriptionService(settings=s)
    sign_up(service.sessions, s.demo_user, s.demo_password)
    trade_rules = DEMO_SUBSCRIPTIONS  # the trade examples, thresholds set for the demo feed
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
    """The recorded processes that run (Kafka, PostgreSQL, supervisord) and the apps up under it."""
    names = {r.name for r in process.all_records(s.run_dir) if process.is_running(r)}
    infos = supervision.program_infos(s)
    return names | {n for n, i in infos.items() if i["statename"] in supervision.RUNNING_STATES}


def stop_all(s: Settings, *, only: set[str] | None = None) -> list[str]:
    """Stop what ``up`` started (all, or the names in ``only``): the apps -- by stopping
    supervisord, or each app through it when supervisord itself is not to be stopped --, anything
    else recorded (app PID files of an older ``up``), then Kafka, then PostgreSQL.  The names
    stopped, in that order."""
    wanted = (lambda name: True) if only is None else (lambda name: name in only)
    stopped = []
    infos = supervision.program_infos(s)
    up_apps = [
        a.name
        for a in reversed(all_apps(s))
        if infos.get(a.name, {}).get("statename") in supervision.RUNNING_STATES
    ]
    if wanted(supervision.NAME) and supervision.record(s) is not None:
        if supervision.shutdown(s, timeout=_shutdown_timeout(s)):
            stopped += [*up_apps, supervision.NAME]
    else:
        for name in up_apps:
            if wanted(name) and supervision.stop_program(s, name):
                stopped.append(name)
    for app in reversed(APPS):
        if wanted(app.name) and process.stop(s.run_dir, app.name):
            stopped.append(app.name)
    known = {a.name for a in APPS} | {kafka_service.NAME, pg_service.NAME, supervision.NAME}
    for rec in process.all_records(s.run_dir):
        if rec.name not in known and wanted(rec.name) and process.stop(s.run_dir, rec.name):
            stopped.append(rec.name)
    if wanted(kafka_service.NAME) and kafka_service.stop(s):
        stopped.append(kafka_service.NAME)
    if wanted(pg_service.NAME) and pg_service.stop(s):
        stopped.append(pg_service.NAME)
    if (
        supervision.program_infos(s).get(cluster_mod.MASTER, {}).get("statename")
        not in supervision.RUNNING_STATES
    ):
        cluster_mod.forget(s)  # no cluster any more: a restarted engine runs local
    return stopped


def start_cluster(s: Settings, cluster: cluster_mod.Cluster) -> None:
    """Have supervisord start the cluster's master, then its workers, and wait until the master
    reports every worker ALIVE (the workers start in parallel, once the master answers)."""
    master, *workers = cluster_apps(s)

    def started(app: App, info: dict[str, Any]) -> None:
        console.print(
            f"[green]✓[/] {app.what} on 127.0.0.1:{app.port(s)} "
            f"(pid {info['pid']}, log {_short(str(_log(s, app.name)))})"
        )

    started(master, start_app(master, s))
    with ThreadPoolExecutor(max_workers=len(workers)) as pool:
        for app, fut in [(w, pool.submit(start_app, w, s)) for w in workers]:
            started(app, fut.result())
    status = cluster_mod.wait_for_workers(cluster)
    console.print(
        f"[green]✓[/] Spark cluster {cluster.master_url}: {len(cluster_mod.alive_workers(status))} workers "
        f"ALIVE, {status.get('cores')} cores (web UI http://127.0.0.1:{cluster.webui_port})"
    )


def up(
    services_only: Annotated[
        bool, typer.Option("--services-only", help="only Kafka and PostgreSQL (migrated, topics)")
    ] = False,
    skip: Annotated[
        list[str] | None, typer.Option("--skip", help="an app not to start: relay, engine, dashboard, feed")
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=0,
            help="run the engine on a Spark standalone cluster on 127.0.0.1: a master and N workers "
            "(supervised; spark_worker_cores / spark_worker_memory each); 0: Spark in local mode",
        ),
    ] = 0,
) -> None:
    """Start the embedded stack: Kafka, PostgreSQL (migrated), relay, engine, dashboard, demo feed.

    The apps run under supervisord, which restarts one that dies.  With --workers N the engine
    runs on a Spark master and N workers that supervisord runs too."""
    s = get_settings()
    apps = [] if services_only else [a for a in APPS if a.name not in (skip or [])]
    try:
        check_kafka_secrets(s, [a.principal for a in apps if a.principal])
    except (RuntimeError, ValueError) as exc:
        console.print(f"[red]✗ cannot start:[/] {exc}")
        raise typer.Exit(2) from None
    already = _running(s)
    cluster = cluster_mod.load(s) if cluster_mod.MASTER in already else None
    if cluster is not None and workers not in (0, cluster.workers):
        console.print(
            f"[red]✗ cannot start:[/] a Spark cluster with {cluster.workers} workers runs "
            f"({cluster.master_url}); stop it first with [bold]{typed_command()} down[/]"
        )
        raise typer.Exit(2)
    try:
        start_services(s)
        if not services_only:
            seed_demo(s)
            if cluster is None:
                cluster_mod.forget(s)  # of a run that ended without `down`
                cluster = cluster_mod.plan(s, workers) if workers else None
            to_start = []
            for app in APPS:
                if app not in apps:
                    console.print(f"[dim]-[/] {app.what}: skipped (--skip)")
                elif not app.available():
                    console.print(f"[yellow]![/] {app.what}: not started, {app.missing}")
                else:
                    to_start.append(app)
            if to_start or cluster:
                # every app that exists is a program (a skipped one stays STOPPED until
                # `tidewatch restart` starts it), so a later `up` without --skip finds it there
                rec = supervision.start(s, programs(s, [a for a in all_apps(s) if a.available()]))
                console.print(
                    f"[green]✓[/] supervisord (pid {rec.pid}, socket {_short(str(supervision.socket_path(s)))})"
                )
            if cluster is not None:
                start_cluster(s, cluster)
            for app in to_start:
                info = start_app(app, s)
                where = f" on {s.dashboard_host}:{app.port(s)}" if app.port(s) else ""
                where = f" on {cluster.master_url}" if app.name == "engine" and cluster else where
                console.print(
                    f"[green]✓[/] {app.what}{where} (pid {info['pid']}, log {_short(str(_log(s, app.name)))})"
                )
    except (Exception, KeyboardInterrupt) as exc:
        console.print(f"[red]✗ start-up failed:[/] {exc}")
        # undo only what this invocation started; what ran before keeps running
        stopped = stop_all(s, only=_running(s) - already)
        console.print(f"stopped again: {', '.join(stopped) or 'nothing'}")
        raise typer.Exit(1) from None
    if supervision.program_infos(s).get("dashboard", {}).get("statename") == "RUNNING":
        out.print(f"Dashboard: [bold]http://{s.dashboard_host}:{s.dashboard_port}[/]")
    cmd = typed_command()
    out.print(f"Stop everything with: [bold]{cmd} down[/]")
    if cmd != "tidewatch":
        out.print(
            f"(the tidewatch command is in the project's virtualenv: [bold]source {Path(cmd).parent}/activate[/] puts it on your PATH)"
        )


def typed_command() -> str:
    """``tidewatch`` as the user must type it: the bare name when the shell finds this very
    program on the PATH, else its path relative to the working directory (``.venv/bin/tidewatch``
    after ``make run``, whose venv is not activated)."""
    import shutil

    me = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    found = shutil.which("tidewatch")
    if me is None or me.name != "tidewatch" or (found and Path(found).resolve() == me):
        return "tidewatch"
    try:
        return str(Path(sys.argv[0]).absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(me)


def down() -> None:
    """Stop exactly what `tidewatch up` started (supervisord and its apps, Kafka, PostgreSQL)."""
    s = get_settings()
    stopped = stop_all(s)
    out.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


def restart(
    app: Annotated[AppName, typer.Argument(help="the app to restart", case_sensitive=False)],
) -> None:
    """Restart one app of the stack under supervisord: relay, engine, dashboard or feed.

    Stops it (SIGTERM, SIGKILL after its stop time), starts it, waits until it runs (the
    dashboard: until it answers) and prints its new PID."""
    s = get_settings()
    name = app.value
    if not supervision.is_up(s):
        console.print("[red]✗[/] supervisord is not running: start the stack with [bold]tidewatch up[/]")
        raise typer.Exit(1)
    infos = supervision.program_infos(s)
    if name not in infos:
        console.print(f"[red]✗[/] {name} is not one of supervisord's programs ({_app(name).missing})")
        raise typer.Exit(1)
    old = infos[name]["pid"] or None
    try:
        supervision.stop_program(s, name)
        info = start_app(_app(name), s)
    except (Exception, KeyboardInterrupt) as exc:
        console.print(f"[red]✗ {name} did not come back:[/] {exc}")
        raise typer.Exit(1) from None
    out.print(f"{name} restarted: pid {old or '-'} -> {info['pid']}")


def _health(name: str, s: Settings) -> str:
    if name == kafka_service.NAME:
        return "ok" if kafka_service.healthy(s) else "not answering"
    if name == pg_service.NAME:
        return "ok" if pg_service.healthy(s) else "not answering"
    if name == supervision.NAME:
        return "ok" if supervision.is_up(s) else "not answering"
    if name == cluster_mod.MASTER or cluster_mod.worker_index(name) is not None:
        return cluster_mod.health(name, s)
    app = next((a for a in APPS if a.name == name), None)
    if app is not None and (url := app.health_url(s)):
        return "ok" if _http_ok(url) else "not answering"
    return "ok"


def _short(path: str) -> str:
    try:
        return os.path.relpath(path, PROJECT_ROOT) if path.startswith(str(PROJECT_ROOT)) else path
    except ValueError:
        return path


def _uptime(info: dict[str, Any]) -> str:
    if info["statename"] != "RUNNING" or not info.get("start"):
        return "-"
    secs = max(0, int(info["now"]) - int(info["start"]))
    return f"{secs // 3600}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


def _app_row(app: App, s: Settings, info: dict[str, Any] | None, spawns: dict[str, int]) -> dict[str, str]:
    """An app's status row from supervisord's process info (None: supervisord does not run it).
    ``ok`` is "yes" unless it should run and does not: it was started (``start`` > 0) and is
    not RUNNING (BACKOFF, FATAL, EXITED, STOPPED, ...), or supervisord is gone."""
    port = app.port(s)
    row = {
        "name": app.name,
        "pid": "-",
        "uptime": "-",
        "restarts": "-",
        "health": "-",
        "error": "",
        "last": "",
        "why": "",
    }
    row |= {"port": str(port) if port else "-", "log": _short(str(_log(s, app.name))), "ok": "yes"}
    if info is None:
        legacy = process.read_record(s.run_dir, app.name)  # a PID file of an `up` before supervision
        if process.is_running(legacy):
            assert legacy is not None
            return row | {
                "state": "running (unsupervised)",
                "pid": str(legacy.pid),
                "health": _health(app.name, s),
            }
        return row | {"state": "not built yet" if not app.available() else "stopped"}
    state = str(info["statename"])
    row |= {"state": state, "uptime": _uptime(info)}
    if app.name in spawns:
        row["restarts"] = str(max(0, spawns[app.name] - 1))
    if state in supervision.RUNNING_STATES and info.get("pid"):
        row["pid"] = str(info["pid"])
    if state == "RUNNING":
        row["health"] = _health(app.name, s)
    elif info.get("start"):  # started once, and not running now
        row["ok"] = "no"
        row["why"] = info.get("spawnerr") or supervision.last_exit(s, app.name) or ""
        row["error"], row["last"] = supervision.last_lines(info.get("stdout_logfile") or _log(s, app.name))
    else:
        row["state"] = "STOPPED (not started)"
    return row


def status_rows(s: Settings) -> list[dict[str, str]]:
    """One row per component: PostgreSQL, Kafka, supervisord, then each app (its state from
    supervisord), then anything else recorded.  Keys: name, state, pid, uptime, restarts, port,
    health, log, ok ("no": it should run and does not; ``status`` then exits 1), and for such a
    one error and last (its log's last error line and last line) and why (supervisord's reason,
    e.g. "Exited too quickly")."""
    rows = []
    infos = supervision.program_infos(s)
    spawns = supervision.spawn_counts(s) if infos else {}
    sup = supervision.record(s)
    ports = {pg_service.NAME: s.pg_port, kafka_service.NAME: s.kafka_port}
    names = [pg_service.NAME, kafka_service.NAME, supervision.NAME]
    names += [r.name for r in process.all_records(s.run_dir) if r.name not in names + APP_NAMES]
    for name in names:
        rec = process.read_record(s.run_dir, name)
        running = process.is_running(rec)
        if running:
            state, health = "running", _health(name, s)
        elif rec is not None:
            state, health = "dead (stale pid file)", "-"
        else:
            state, health = "stopped", "-"
        port = rec.port if rec and rec.port else ports.get(name)
        if name == supervision.NAME:
            port = None
        log = _short(rec.log) if rec and rec.log else "-"
        error, last = supervision.last_lines(rec.log) if rec and rec.log and not running else ("", "")
        rows.append(
            {
                "name": name,
                "state": state,
                "pid": str(rec.pid) if rec and running else "-",
                "uptime": "-",
                "restarts": "-",
                "port": str(port) if port else "-",
                "health": health,
                "log": log,
                "error": error,
                "last": last,
                "why": "",
                # Kafka and PostgreSQL must run; supervisord once `up` started it
                "ok": "no" if (not running and (name in ports or rec is not None)) else "yes",
            }
        )
        if name == supervision.NAME:
            rows += [_app_row(a, s, infos.get(a.name) if sup else None, spawns) for a in all_apps(s)]
    return rows


def engine_verdict(s: Settings, rows: list[dict[str, str]]) -> Any:
    """The engine's health by the rule of the dashboard's Health page
    (:func:`engine.liveness.verdict`: its last batch, lag and run record): set as the engine
    row's ``health``; ``down`` makes the row not ok (``status`` exits 1).  Returns the verdict."""
    from engine import liveness

    v = liveness.check(s)
    for r in rows:
        if r["name"] == "engine":
            r["health"] = v.status
            r["ok"] = "no" if v.status == "down" else r["ok"]
    return v


def status() -> None:
    """What runs: state (apps: RUNNING, BACKOFF, FATAL, ...), PID, uptime, restarts, port, health, log.

    The engine's health is the one the dashboard's Health view shows, with its cause when it is
    not ok.  Exits 1 when something that should run does not, and prints its log and last
    error line.
    \f
    The engine's verdict: :func:`engine_verdict`."""
    table = Table(title="tidewatch status", box=box.SIMPLE_HEAD)
    for col in ("component", "state", "pid", "uptime", "restarts", "port", "health"):
        table.add_column(col, overflow="fold")
    settings = get_settings()
    rows = status_rows(settings)
    engine = engine_verdict(settings, rows)
    for r in rows:
        good = r["state"] in ("running", "RUNNING")
        colour = "green" if good and r["health"] == "ok" else ("yellow" if good else "dim")
        colour = "red" if r["ok"] == "no" else colour
        cells = (r["pid"], r["uptime"], r["restarts"], r["port"], r["health"])
        table.add_row(r["name"], f"[{colour}]{r['state']}[/]", *cells)
    out.print(table)
    out.print(log_line(rows), markup=False, highlight=False)
    if summary := cluster_mod.summary(get_settings()):
        out.print(summary, highlight=False)
    bad = [r for r in rows if r["ok"] == "no"]
    for r in bad:
        why = f" ({r['why']})" if r["why"] else ""
        out.print(f"[red]✗ {r['name']}[/] is {r['state']}{why}; log: {r['log']}", highlight=False)
        if r["error"] or r["last"]:
            said = f"last error: {r['error']}" if r["error"] else f"last log line: {r['last']}"
            out.print(f"  {said}", markup=False, highlight=False)
    if engine.status != "ok":
        out.print(f"engine health ({engine.status}): {engine.text}", markup=False, highlight=False)
    if bad:
        raise typer.Exit(1)


# --- tidewatch db ---------------------------------------------------------------------------


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
    app.command("restart")(restart)
    app.add_typer(db_cli.db_app, name="db")
