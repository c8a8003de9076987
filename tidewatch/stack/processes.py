"""PID files and process-tree control for the embedded stack.

Every process ``tidewatch up`` starts is recorded in ``<run_dir>/pids/<name>.json``
(pid, process start time, command, port).  ``stop`` signals exactly that process and
its descendants, never anything found by name; the start time guards against a
recycled PID.  The start time is kept twice: as a wall-clock time (for people, and for
records written before the other was kept), and as seconds since boot, which a step of the
system clock (NTP, a virtual machine resumed) does not move and which identifies the process --
psutil's wall-clock start time of a running process does move with such a step, and a broker
whose record no longer matched could be neither stopped nor started again on its port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from tidewatch.errors import TidewatchError


@dataclass
class ProcessRecord:
    """What we know about one process we started."""

    name: str
    pid: int
    create_time: float
    argv: list[str]
    port: int | None = None
    log: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    since_boot: float | None = None  # the start in seconds since boot (None in older records)


def since_boot(proc: psutil.Process) -> float:
    """When ``proc`` started, in seconds since the system booted: psutil's start time less its
    boot time, both read from the wall clock now, so a clock step cancels out (on Linux the
    kernel keeps the start as clock ticks since boot).  ``proc`` must be a fresh
    ``psutil.Process``: it keeps its start time from the first call."""
    return proc.create_time() - psutil.boot_time()


def pid_dir(run_dir: Path) -> Path:
    d = run_dir / "pids"
    d.mkdir(parents=True, exist_ok=True)
    return d


def record_path(run_dir: Path, name: str) -> Path:
    return pid_dir(run_dir) / f"{name}.json"


def write_record(run_dir: Path, rec: ProcessRecord) -> None:
    path = record_path(run_dir, rec.name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(rec), indent=2))
    tmp.replace(path)


def read_record(run_dir: Path, name: str) -> ProcessRecord | None:
    path = record_path(run_dir, name)
    try:
        return ProcessRecord(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def remove_record(run_dir: Path, name: str) -> None:
    record_path(run_dir, name).unlink(missing_ok=True)


def all_records(run_dir: Path) -> list[ProcessRecord]:
    out = []
    for path in sorted(pid_dir(run_dir).glob("*.json")):
        rec = read_record(run_dir, path.stem)
        if rec is not None:
            out.append(rec)
    return out


def process_of(rec: ProcessRecord) -> psutil.Process | None:
    """The live process a record names, or ``None`` (dead, zombie, or PID reused)."""
    try:
        proc = psutil.Process(rec.pid)
        if rec.since_boot is not None:  # clock ticks since boot: 0.01 s, and no clock step moves it
            same_start = abs(since_boot(proc) - rec.since_boot) <= 0.05
        else:  # a record written before since_boot was kept
            same_start = abs(proc.create_time() - rec.create_time) <= 1.0
        if not same_start:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def is_running(rec: ProcessRecord | None) -> bool:
    return rec is not None and process_of(rec) is not None


def spawn(
    run_dir: Path,
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
) -> ProcessRecord:
    """Start ``argv`` detached in its own session (so ``down`` can signal its group), log to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    return adopt(run_dir, name, proc.pid, argv, port=port, log=log)


def adopt(
    run_dir: Path, name: str, pid: int, argv: Sequence[str], *, port: int | None, log: Path
) -> ProcessRecord:
    """Record the running process ``pid`` as ``name``: one :func:`spawn` started, or one started
    by someone else on our behalf (e.g. ``pg_ctl`` starting postgres)."""
    started = psutil.Process(pid)
    rec = ProcessRecord(
        name=name,
        pid=pid,
        create_time=started.create_time(),
        argv=list(argv),
        port=port,
        log=str(log),
        since_boot=since_boot(started),
    )
    write_record(run_dir, rec)
    return rec


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def terminate_tree(proc: psutil.Process, *, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Stop ``proc`` and all its descendants: ``sig`` to ``proc`` alone first, so it can stop its
    own children in order (the engine stops its Spark JVM with ``spark.stop()`` and waits for a
    snapshot being written); after it is gone, or after ``timeout``, ``sig`` to every descendant
    still there, and SIGKILL to whatever is left 5 s later."""
    procs = _tree(proc)  # the descendants now: an orphan is no longer a child once ``proc`` is gone
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        pass
    psutil.wait_procs([proc], timeout=timeout)
    left = []
    for p in procs:
        left.extend(_tree(p))  # descendants may have spawned more children meanwhile
    left = [p for p in {*left} if p.is_running()]
    for p in left:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    _gone, alive = psutil.wait_procs(left, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def stop(run_dir: Path, name: str, *, sig: int = signal.SIGTERM, timeout: float = 20.0) -> bool:
    """Stop the recorded process ``name`` and its children; return whether one was running."""
    rec = read_record(run_dir, name)
    if rec is None:
        return False
    proc = process_of(rec)
    if proc is not None:
        terminate_tree(proc, sig=sig, timeout=timeout)
    remove_record(run_dir, name)
    return proc is not None


class StartupFailed(TidewatchError, RuntimeError):
    """A service died while we waited for it; stops :func:`wait_until` at once."""


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, interval: float = 0.25, what: str = "condition"
) -> None:
    """Poll ``predicate()`` until true; raise ``TimeoutError`` naming ``what``.

    Exceptions from ``predicate`` count as "not yet", except :class:`StartupFailed`.
    """
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except StartupFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure just means "not yet"
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout:.0f}s waiting for {what}" + (f": {last_exc}" if last_exc else "")
    )


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_holder(port: int) -> str:
    """Who listens on TCP ``port``, for an error message: ``"pid 123 (java)"``; ``"an unknown
    process"`` when the system does not say (another user's process, no rights to list)."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                if conn.pid is None:
                    break
                try:
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                except psutil.Error:
                    return f"pid {conn.pid}"
    except psutil.Error:
        pass
    return "an unknown process"


def am_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
