"""Supervision of the stack's app processes by supervisord (Supervisor 4.x).

``tidewatch up`` does not watch its app processes itself: it writes ``<run_dir>/supervisord.conf``
(:func:`render_conf`, one ``[program:x]`` per :class:`Program`), starts ``supervisord`` in the
foreground (``nodaemon``) as a recorded process of the run (``<run_dir>/pids/supervisord.json``,
like Kafka and PostgreSQL), and asks it over its XML-RPC interface to start each program.
supervisord restarts a program that exits (``autorestart``); one that exits within ``startsecs``
of each start is retried ``startretries`` times with a growing back-off and then left ``FATAL``.

The control channel is a Unix socket in the run dir (``<run_dir>/supervisor.sock``, mode 0700:
only the user that ran ``tidewatch up``); no TCP port is opened.  Each program's stdout and
stderr go to ``<run_dir>/logs/<name>.log`` (rotated at 50 MB, 3 kept); supervisord's own log
(spawns, exits, give-ups) is ``<run_dir>/logs/supervisord.log``.  ``supervisorctl -c
<run_dir>/supervisord.conf`` works on the same socket.

Stopping: SIGTERM to supervisord stops the programs one by one in reverse start order
(``priority``), each with its ``stopsignal`` and SIGKILL after ``stopwaitsecs``; :func:`shutdown`
sends it and sweeps whatever of supervisord's process tree is left after the programs' stop
time (:func:`tidewatch.stack.processes.terminate_tree`).
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import sys
import time
import xmlrpc.client
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidewatch.errors import TidewatchError
from tidewatch.settings import PROJECT_ROOT, Settings
from tidewatch.stack import processes as process

NAME = "supervisord"

#: supervisord's state names of a process that is up or on its way up (``supervisor.states``)
RUNNING_STATES = frozenset({"STARTING", "RUNNING", "BACKOFF"})
#: the longest path a Unix socket address may have on Linux (``sun_path`` holds 108 bytes)
_MAX_SOCKET_PATH = 107


class SupervisionError(TidewatchError, RuntimeError):
    """supervisord could not be started or did not do what was asked (the message says what)."""


class ProgramFailed(SupervisionError):
    """A program did not come up: it ended ``FATAL`` (or ``EXITED``) or timed out."""


@dataclass(frozen=True)
class Program:
    """One supervised program: a ``[program:<name>]`` section of :func:`render_conf`.

    ``startsecs``: how long it must stay up for a start to count; ``startretries``: failed starts
    in a row before ``FATAL``; ``stopwaitsecs``: from ``stopsignal`` to SIGKILL.  ``stopasgroup``
    sends the stop signal to its whole process group; without it only the program gets it (the
    engine stops its own Spark JVM) and the group gets only the SIGKILL (``killasgroup``)."""

    name: str
    argv: Sequence[str]
    log: Path
    priority: int
    startsecs: int = 3
    startretries: int = 3
    stopwaitsecs: int = 15
    stopasgroup: bool = True
    stopsignal: str = "TERM"
    directory: Path = PROJECT_ROOT


# --- files -----------------------------------------------------------------------------------


def conf_path(s: Settings) -> Path:
    return s.run_dir / "supervisord.conf"


def socket_path(s: Settings) -> Path:
    return s.run_dir / "supervisor.sock"


def log_path(s: Settings) -> Path:
    """supervisord's own log: its start, and each program's spawns, exits and give-ups."""
    return s.run_dir / "logs" / "supervisord.log"


def _value(text: str) -> str:
    """``text`` as a supervisord config value: ``%`` doubled (supervisord expands ``%(x)s``);
    a newline or an inline-comment start (`` ;`` / `` #``) would change the meaning: refused."""
    if "\n" in text or re.search(r"\s[;#]", text):
        raise SupervisionError(f"cannot write {text!r} into supervisord.conf")
    return text.replace("%", "%%")


def render_conf(s: Settings, programs: Sequence[Program]) -> str:
    """The text of ``<run_dir>/supervisord.conf``: the Unix socket, supervisord in the foreground
    logging to stdout (the file :func:`start` gives it), and one ``autostart=false`` program per
    entry of ``programs`` (``tidewatch up`` starts them one by one, waiting for each)."""
    sock = socket_path(s)
    lines = [
        "; written by `tidewatch up` (tidewatch/stack/supervision.py); rewritten at each `up`",
        "[unix_http_server]",
        f"file={_value(str(sock))}",
        "chmod=0700",
        "",
        "[supervisord]",
        # the user it runs as already: supervisord drops no privileges, and says so only without this
        f"user={_value(pwd.getpwuid(os.getuid()).pw_name)}",
        "nodaemon=true",
        "silent=true",  # no second copy of the log on stdout: the log *is* stdout, below
        "logfile=/dev/stdout",
        "logfile_maxbytes=0",
        "loglevel=info",
        f"pidfile={_value(str(s.run_dir / 'supervisord.pid'))}",
        f"childlogdir={_value(str(s.run_dir / 'logs'))}",
        f"identifier=tidewatch:{_value(str(s.run_dir))}",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{_value(str(sock))}",
    ]
    for p in programs:
        lines += [
            "",
            f"[program:{p.name}]",
            f"command={_value(shlex.join(p.argv))}",
            f"directory={_value(str(p.directory))}",
            f"priority={p.priority}",
            "autostart=false",
            "autorestart=true",
            f"startsecs={p.startsecs}",
            f"startretries={p.startretries}",
            f"stopsignal={p.stopsignal}",
            f"stopwaitsecs={p.stopwaitsecs}",
            f"stopasgroup={'true' if p.stopasgroup else 'false'}",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={_value(str(p.log))}",
            "stdout_logfile_maxbytes=50MB",
            "stdout_logfile_backups=3",
        ]
    return "\n".join(lines) + "\n"


def write_conf(s: Settings, programs: Sequence[Program]) -> Path:
    path = conf_path(s)
    path.parent.mkdir(parents=True, exist_ok=True)
    (s.run_dir / "logs").mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render_conf(s, programs))
    tmp.replace(path)
    return path


# --- the XML-RPC client ----------------------------------------------------------------------


def proxy(s: Settings) -> Any:
    """An XML-RPC proxy of supervisord on the run dir's socket (``proxy(s).supervisor.getState()``)."""
    from supervisor.xmlrpc import SupervisorTransport

    transport = SupervisorTransport(None, None, f"unix://{socket_path(s)}")
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def record(s: Settings) -> process.ProcessRecord | None:
    return process.read_record(s.run_dir, NAME)


def is_up(s: Settings) -> bool:
    """supervisord of this run dir runs (its recorded PID) and answers on its socket."""
    if not process.is_running(record(s)):
        return False
    try:
        return bool(proxy(s).supervisor.getState()["statename"] == "RUNNING")
    except (OSError, xmlrpc.client.Error):
        return False


def program_infos(s: Settings) -> dict[str, dict[str, Any]]:
    """supervisord's ``getProcessInfo`` of every program (``statename``, ``pid``, ``start``,
    ``now``, ``description``, ``spawnerr``, ``exitstatus``, ``stdout_logfile``), by name;
    empty when supervisord is not up."""
    if not process.is_running(record(s)):
        return {}
    try:
        return {i["name"]: i for i in proxy(s).supervisor.getAllProcessInfo()}
    except (OSError, xmlrpc.client.Error):
        return {}


# --- start / stop ----------------------------------------------------------------------------


def _reload(s: Settings) -> list[str]:
    """Make a running supervisord take the rewritten conf (what ``supervisorctl update`` does): new
    programs added; a changed or removed one replaced or dropped if it is not running (a running
    one keeps its old settings until it is stopped).  The programs left as they were, by name."""
    server = proxy(s).supervisor
    [[added, changed, removed]] = server.reloadConfig()
    kept = []
    infos = program_infos(s)
    for name in [*changed, *removed]:
        if infos.get(name, {}).get("statename") in RUNNING_STATES:
            kept.append(name)
            continue
        server.removeProcessGroup(name)
        if name in changed:
            added.append(name)
    for name in added:
        server.addProcessGroup(name)
    return kept


def start(s: Settings, programs: Sequence[Program], *, timeout: float = 20.0) -> process.ProcessRecord:
    """Write the conf and start supervisord (or, if it runs, make it reload the conf); wait until
    it answers on its socket.  Starts no program."""
    sock = socket_path(s)
    if len(str(sock).encode()) > _MAX_SOCKET_PATH:
        raise SupervisionError(
            f"the run dir's path is too long for a Unix socket ({sock}): set TIDEWATCH_RUN_DIR shorter"
        )
    conf = write_conf(s, programs)
    rec = record(s)
    if process.is_running(rec) and is_up(s):
        assert rec is not None
        _reload(s)
        return rec
    process.stop(s.run_dir, NAME)  # a recorded supervisord that does not answer: gone, or hung
    sock.unlink(missing_ok=True)
    rec = process.spawn(
        s.run_dir,
        NAME,
        [sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)],
        log=log_path(s),
        cwd=PROJECT_ROOT,
    )

    def answering() -> bool:
        if not process.is_running(rec):
            raise process.StartupFailed(f"supervisord exited at start-up:\n{tail(log_path(s))}")
        return is_up(s)

    try:
        process.wait_until(answering, timeout=timeout, interval=0.2, what=f"supervisord on {sock}")
    except BaseException:
        process.stop(s.run_dir, NAME)
        raise
    return rec


def start_program(
    s: Settings, name: str, *, timeout: float, ready: Callable[[], bool] | None = None
) -> dict[str, Any]:
    """Have supervisord start ``name`` (if it is not up already) and wait until it is ``RUNNING``
    (up for its ``startsecs``) and ``ready()`` (e.g. its health URL answers); its process info.
    Raises :class:`ProgramFailed` when it ends ``FATAL``/``EXITED``/``STOPPED`` or after ``timeout``."""
    server = proxy(s).supervisor
    try:
        server.startProcess(name, False)
    except xmlrpc.client.Fault as exc:
        if exc.faultCode != _fault("ALREADY_STARTED"):
            raise ProgramFailed(f"supervisord could not start {name}: {exc.faultString}") from None
    deadline = time.monotonic() + timeout
    info: dict[str, Any] = {}
    while time.monotonic() < deadline:
        info = server.getProcessInfo(name)
        state = info["statename"]
        if state not in RUNNING_STATES:
            raise ProgramFailed(f"{name} is {state} ({_why(info)}); its log: {info['stdout_logfile']}")
        if state == "RUNNING" and (ready is None or _quiet(ready)):
            return info
        time.sleep(0.25)
    raise ProgramFailed(
        f"{name} not ready after {timeout:.0f}s (it is {info.get('statename', '?')}); "
        f"its log: {info.get('stdout_logfile', '?')}"
    )


def stop_program(s: Settings, name: str) -> bool:
    """Have supervisord stop ``name`` (waits for it, up to its ``stopwaitsecs`` and the SIGKILL);
    whether it was up."""
    try:
        proxy(s).supervisor.stopProcess(name, True)
    except xmlrpc.client.Fault as exc:
        if exc.faultCode == _fault("NOT_RUNNING"):
            return False
        raise SupervisionError(f"supervisord could not stop {name}: {exc.faultString}") from None
    return True


def shutdown(s: Settings, *, timeout: float) -> bool:
    """Stop supervisord and so every program (in reverse start order, each within its
    ``stopwaitsecs``); after ``timeout`` whatever is left of its process tree is signalled and then
    killed.  Whether it was running."""
    stopped = process.stop(s.run_dir, NAME, timeout=timeout)
    socket_path(s).unlink(missing_ok=True)
    return stopped


# --- what happened ---------------------------------------------------------------------------


def _fault(name: str) -> int:
    from supervisor.xmlrpc import Faults

    return int(getattr(Faults, name))


def _quiet(ready: Callable[[], bool]) -> bool:
    try:
        return bool(ready())
    except Exception:  # noqa: BLE001 - not ready yet
        return False


def _why(info: dict[str, Any]) -> str:
    return str(info.get("spawnerr") or info.get("description") or f"exit status {info.get('exitstatus')}")


def tail(path: Path | str, n: int = 12) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


_ERROR = re.compile(r"error|exception|traceback|fatal|critical|killed|refused|failed", re.IGNORECASE)


def last_lines(path: Path | str, *, scan: int = 200) -> tuple[str, str]:
    """``(error, last)`` of a log: the last of its last ``scan`` lines that reads like an error
    (error, exception, fatal, ...) and its last non-empty line; "" for none (or no log)."""
    lines = [ln.strip() for ln in tail(path, scan).splitlines() if ln.strip()]
    error = next((ln for ln in reversed(lines) if _ERROR.search(ln)), "")
    return error, lines[-1] if lines else ""


_STARTED = re.compile(r" supervisord started with pid (\d+)")
_SPAWNED = re.compile(r" spawned: '([^']+)' with pid \d+")
_ENDED = re.compile(r" (?:exited|gave up): '?([^' :]+)'?")


def spawn_counts(s: Settings) -> dict[str, int]:
    """How many times the running supervisord has spawned each program (its log since it
    started: the first start, its restarts after an exit and ``tidewatch restart``)."""
    rec = record(s)
    counts: dict[str, int] = {}
    if rec is None:
        return counts
    try:
        text = log_path(s).read_text(errors="replace")
    except OSError:
        return counts
    started = [m for m in _STARTED.finditer(text) if int(m.group(1)) == rec.pid]
    for m in _SPAWNED.finditer(text, started[-1].end() if started else 0):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def last_exit(s: Settings, name: str) -> str | None:
    """supervisord's last ``exited:`` / ``gave up:`` line about ``name`` (why it stopped)."""
    lines = [ln for ln in tail(log_path(s), 400).splitlines() if (m := _ENDED.search(ln)) and m[1] == name]
    return lines[-1].split(" ", 3)[-1] if lines else None
