"""The embedded PostgreSQL server: own data dir, private port on 127.0.0.1.

Debian's ``postgresql`` package provides the binaries (``/usr/lib/postgresql/<v>/bin``).
``initdb`` refuses to run as root, so as root every server command runs as the
``postgres`` system user (``runuser -u postgres --``) and the server's folder is owned by it.

Authentication: the cluster's superuser may connect only through the Unix socket, which
lives in a 0700 folder of the server's owner (``local all all trust``); TCP connections on
127.0.0.1 need a password (scram-sha-256).  The application role ``settings.pg_user`` owns
``settings.pg_database``.
"""

from __future__ import annotations

import getpass
import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg2
from psycopg2 import sql

from tidewatch.settings import Settings
from tidewatch.stack import processes as process

NAME = "postgres"


def find_bin_dir(settings: Settings) -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: the setting, else the newest Debian one, else PATH."""
    s = settings
    if s.pg_bin_dir is not None:
        return s.pg_bin_dir
    candidates = sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p, "initdb").exists()),
        key=lambda p: _version_key(p.parent.name),
    )
    if candidates:
        return candidates[-1]
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


@dataclass(frozen=True)
class PgLayout:
    root: Path  # <run_dir>/postgres, owned by the server's user
    data: Path
    sock: Path
    log: Path


def layout(settings: Settings) -> PgLayout:
    s = settings
    root = s.run_dir / "postgres"
    return PgLayout(root=root, data=root / "data", sock=root / "sock", log=root / "postgres.log")


def _server_user() -> str:
    return "postgres" if process.am_root() else getpass.getuser()


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if process.am_root() else argv


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(_as_server_user(argv), capture_output=True, text=True, **kw)


def _chown_tree(path: Path, user: str) -> None:
    if process.am_root():
        shutil.chown(path, user=user, group=None)
        for dirpath, dirnames, filenames in os.walk(path):
            for n in dirnames + filenames:
                shutil.chown(os.path.join(dirpath, n), user=user)


def init(settings: Settings) -> bool:
    """``initdb`` the data dir if it is not a cluster yet; return whether it did."""
    s = settings
    lay = layout(s)
    if (lay.data / "PG_VERSION").exists():
        return False
    bindir = find_bin_dir(s)
    if bindir is None:
        raise RuntimeError(
            "PostgreSQL binaries not found: run scripts/setup.sh (installs Debian's postgresql)"
        )
    lay.root.mkdir(parents=True, exist_ok=True)
    if (
        process.am_root()
        and subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(lay.root.parent)]).returncode
    ):
        raise RuntimeError(
            f"the postgres user cannot reach {lay.root.parent}: make its parent folders world-executable"
        )
    lay.sock.mkdir(exist_ok=True)
    os.chmod(lay.root, 0o700)
    os.chmod(lay.sock, 0o700)
    _chown_tree(lay.root, _server_user())
    res = _run(
        [
            str(bindir / "initdb"),
            "-D",
            str(lay.data),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ]
    )
    if res.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{res.stdout}{res.stderr}")
    return True


def postmaster_pid(settings: Settings) -> int | None:
    try:
        first = (layout(settings).data / "postmaster.pid").read_text().splitlines()[0]
        return int(first)
    except (FileNotFoundError, IndexError, ValueError, PermissionError):
        return None


def is_running(settings: Settings) -> bool:
    return process.is_running(process.read_record(settings.run_dir, NAME))


def start(settings: Settings, *, timeout: float = 60.0) -> process.ProcessRecord:
    """Init if needed, start the server, create the app role and database; record its PID."""
    s = settings
    rec = process.read_record(s.run_dir, NAME)
    if process.is_running(rec):
        assert rec is not None
        ensure_app_database(s)
        return rec
    init(s)
    bindir = find_bin_dir(s)
    assert bindir is not None
    lay = layout(s)
    opts = f"-p {s.pg_port} -c listen_addresses={s.pg_host} -k {lay.sock}"
    res = _run(
        [
            str(bindir / "pg_ctl"),
            "-D",
            str(lay.data),
            "-l",
            str(lay.log),
            "-w",
            "-t",
            str(int(timeout)),
            "-o",
            opts,
            "start",
        ]
    )
    if res.returncode != 0:
        log_tail = ""
        try:
            log_tail = "\n".join(lay.log.read_text().splitlines()[-10:])
        except OSError:
            pass
        raise RuntimeError(f"pg_ctl start failed:\n{res.stdout}{res.stderr}\n{log_tail}")
    pid = postmaster_pid(s)
    if pid is None:
        raise RuntimeError("postgres started but wrote no postmaster.pid")
    rec = process.adopt(
        s.run_dir, NAME, pid, ["postgres", "-D", str(lay.data), *opts.split()], port=s.pg_port, log=lay.log
    )
    ensure_app_database(s)
    return rec


def superuser_connect(settings: Settings, dbname: str = "postgres"):  # type: ignore[no-untyped-def]
    """A psycopg2 connection as the cluster's superuser over the private Unix socket."""
    s = settings
    return psycopg2.connect(host=str(layout(s).sock), port=s.pg_port, user=_server_user(), dbname=dbname)


def allow_createdb(settings: Settings) -> None:
    """Let the application role create databases (tests and benchmarks make one per run)."""
    s = settings
    conn = superuser_connect(s)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(s.pg_user)))
    finally:
        conn.close()


def ensure_app_database(settings: Settings) -> None:
    """Create ``settings.pg_user`` (with its password) and ``settings.pg_database`` if missing."""
    s = settings
    conn = superuser_connect(s)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (s.pg_user,))
            verb = "ALTER" if cur.fetchone() else "CREATE"
            cur.execute(
                sql.SQL(verb + " ROLE {} WITH LOGIN PASSWORD %s").format(sql.Identifier(s.pg_user)),
                (s.pg_password,),
            )
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (s.pg_database,))
            if cur.fetchone() is None:
                cur.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(s.pg_database), sql.Identifier(s.pg_user)
                    )
                )
            ensure_process_roles(cur, s)
    finally:
        conn.close()


#: the least-privilege role of each process (migration 0002_roles grants their privileges) ->
#: the settings field holding its password
PROCESS_ROLES = {
    "engine": ("tidewatch_engine", "pg_engine_password"),
    "dashboard": ("tidewatch_dashboard", "pg_dashboard_password"),
    "relay": ("tidewatch_relay", "pg_relay_password"),
}


def ensure_process_roles(cur, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """Create the per-process roles as the cluster's superuser (the application role has no
    CREATEROLE: on PostgreSQL 15 that would let it grant itself almost anything).

    A role with a password in the settings can log in (its password set as a SCRAM verifier
    computed here, so the clear text never reaches the server); without one it is ``NOLOGIN``
    and its process uses the application role.  The grants come from migration 0002_roles.
    """
    from psycopg2.extensions import encrypt_password

    for role, field in PROCESS_ROLES.values():
        password = getattr(settings, field)
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
        if cur.fetchone() is None:
            cur.execute(
                sql.SQL("CREATE ROLE {} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT").format(
                    sql.Identifier(role)
                )
            )
        if password:
            verifier = encrypt_password(password, role, cur.connection, "scram-sha-256")
            cur.execute(sql.SQL("ALTER ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(role)), (verifier,))
        else:
            cur.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))


def process_url(settings: Settings, process: str) -> str | None:
    """SQLAlchemy URL of ``process``'s own role (engine, dashboard, relay), or None when its
    password is not configured (then the process uses ``settings.sqlalchemy_url``)."""
    from sqlalchemy.engine import make_url

    role, field = PROCESS_ROLES[process]
    password = getattr(settings, field)
    if not password:
        return None
    url = make_url(settings.sqlalchemy_url).set(username=role, password=password)
    return url.render_as_string(hide_password=False)


def healthy(settings: Settings) -> bool:
    """The app role can log in over TCP and run a query."""
    s = settings
    try:
        conn = psycopg2.connect(
            host=s.pg_host,
            port=s.pg_port,
            user=s.pg_user,
            password=s.pg_password,
            dbname=s.pg_database,
            connect_timeout=2,
        )
    except psycopg2.Error:
        return False
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            return cur.fetchone() == (1,)
    finally:
        conn.close()


def stop(settings: Settings, *, timeout: float = 30.0) -> bool:
    """Fast shutdown (SIGINT to the postmaster, which stops its children); SIGKILL after ``timeout``."""
    import signal

    s = settings
    return process.stop(s.run_dir, NAME, sig=signal.SIGINT, timeout=timeout)
