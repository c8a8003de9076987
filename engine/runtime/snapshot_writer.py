"""Writing the engine's state snapshot without stopping the batches.

A snapshot is the whole driver state at the end of one batch (:meth:`engine.core.EngineCore.to_bytes`);
serializing and writing it takes seconds for a state of hundreds of megabytes, and the next
batch may not change the state until it is done.  Written in the evaluation thread, that is a
stall of the stream every ``snapshot_every_batches`` batches: alerts of the batches behind it
wait for it.

On a system with ``fork`` the snapshot is written the way Redis writes its ``BGSAVE``: the
engine forks; the child holds a copy-on-write image of the state exactly as it was at the end of
the batch, serializes it, writes it to a temporary file, ``fsync``s and renames it, and exits;
the parent goes on with the next batch at once and reaps the child later.  The child shares
every socket with the parent, so it must not end a connection: it leaves with ``os._exit`` (no
finalizer, no ``atexit``), its collector is off, and no socket can be shut down in it.  That
last guard is needed: at the fork CPython clears the thread states of the threads that do not
exist in the child, and the finalizers this runs close what those threads held alone -- Spark's
py4j drops a thread's connection to the JVM that way, and ``socket.shutdown`` on it would end
the connection for the parent too (seen: "Connection reset by peer" in the engine at every
snapshot until the guard).
A snapshot whose child fails is logged and skipped: a snapshot only shortens a restart's
replay, the state is never lost for want of one.  Without ``fork`` (or with
``engine_snapshot_in_child = false``) the snapshot is written in the calling thread, as before.

At most one child runs: a snapshot that falls due while the previous one is still being
written is skipped, and the next one due is taken instead.  A child still writing after
``timeout_s`` (it could only be stuck: a lock another thread held at the fork) is killed and
counted as failed.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tidewatch.engine")


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing: a temporary file of this process, ``fsync``, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temporary files of snapshot writers that are gone (a crash mid-write)."""
    removed = []
    for tmp in folder.glob("*.tmp") if folder.exists() else []:
        try:
            pid = int(tmp.name.split(".")[-2])
        except (ValueError, IndexError):
            pid = -1
        if pid > 0 and _alive(pid):
            continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: True in a snapshot child (and in the parent for the instant of the fork)
_in_child = False


def _install_shutdown_guard() -> None:
    """Make ``socket.shutdown`` a no-op in a snapshot child (see the module's docstring)."""
    original = socket.socket.shutdown
    if getattr(original, "_tidewatch_guard", False):
        return

    def shutdown(self: socket.socket, how: int) -> None:
        if _in_child:  # the parent's connection, shared: closing the child's descriptor is enough
            return
        original(self, how)

    shutdown._tidewatch_guard = True  # type: ignore[attr-defined]
    socket.socket.shutdown = shutdown  # type: ignore[method-assign,assignment]


@dataclass
class _Child:
    pid: int
    batch_id: int
    path: Path
    started: float


class SnapshotWriter:
    """Writes snapshots, in a forked child when it can (see the module's docstring)."""

    def __init__(self, in_child: bool = True, keep: int = 3, timeout_s: float = 600.0) -> None:
        self.in_child = bool(in_child) and hasattr(os, "fork")
        if self.in_child:
            _install_shutdown_guard()
        self.keep = keep
        self.timeout_s = timeout_s
        self._child: _Child | None = None
        #: (batch id, path, bytes, seconds) of the snapshots written; the newest last
        self.written: list[tuple[int, Path, int, float]] = []
        self.skipped = 0

    @property
    def busy(self) -> bool:
        """Whether a child is still writing (reaps it when it has finished)."""
        self.poll()
        return self._child is not None

    def write(self, batch_id: int, path: Path, serialize: Callable[[], bytes]) -> bool:
        """Snapshot ``serialize()`` of batch ``batch_id`` to ``path``; False if skipped because
        the previous snapshot is still being written."""
        if self.busy:
            self.skipped += 1
            log.info(
                "state snapshot of batch %d skipped: the one of batch %d is still being written",
                batch_id,
                self._child.batch_id if self._child else -1,
            )
            return False
        t0 = time.perf_counter()
        if not self.in_child:
            return self._write_here(batch_id, path, serialize, t0)
        global _in_child
        _in_child = True  # set before the fork: the finalizers it runs in the child must see it
        try:
            pid = os.fork()
        except OSError as exc:  # e.g. no memory for the page tables: write it here, as before
            _in_child = False
            log.warning("could not fork the snapshot writer (%s): writing it in this thread", exc)
            return self._write_here(batch_id, path, serialize, t0)
        if pid != 0:
            _in_child = False
        else:  # the child: serialize the copy-on-write image, write, leave without cleanup
            code = 1
            try:
                gc.disable()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                atomic_write(path, serialize())
                code = 0
            finally:
                os._exit(code)
        self._child = _Child(pid, batch_id, path, t0)
        return True

    def _write_here(self, batch_id: int, path: Path, serialize: Callable[[], bytes], t0: float) -> bool:
        """Write the snapshot in the calling thread (no fork)."""
        atomic_write(path, serialize())
        self._done(batch_id, path, time.perf_counter() - t0)
        return True

    def poll(self) -> None:
        """Reap the child if it has finished; kill it if it has run past ``timeout_s``."""
        c = self._child
        if c is None:
            return
        try:
            pid, status = os.waitpid(c.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: judge by the file
            pid, status = c.pid, 0 if c.path.exists() else 1
        if pid == 0:
            if time.perf_counter() - c.started <= self.timeout_s:
                return
            os.kill(c.pid, signal.SIGKILL)
            pid, status = os.waitpid(c.pid, 0)
        self._child = None
        code = os.waitstatus_to_exitcode(status)
        if code == 0 and c.path.exists():
            self._done(c.batch_id, c.path, time.perf_counter() - c.started)
        else:
            log.warning(
                "state snapshot of batch %d failed in its writer process (exit %s); the next one "
                "due is taken, a restart replays more batches until then",
                c.batch_id,
                code,
            )

    def wait(self) -> None:
        """Wait for a snapshot being written (on stop; a stuck child is killed at ``timeout_s``)."""
        while self.busy:
            time.sleep(0.05)

    def _done(self, batch_id: int, path: Path, seconds: float) -> None:
        size = path.stat().st_size
        self.written.append((batch_id, path, size, seconds))
        for old in sorted(path.parent.glob("*.bin"))[: -self.keep]:
            old.unlink(missing_ok=True)
        log.info(
            "state snapshot of batch %d written (%d bytes in %.1f s%s)",
            batch_id,
            size,
            seconds,
            ", by a forked writer while the batches went on" if self.in_child else "",
        )
