"""Writing the engine's state snapshot without stopping the batches for the disk.

A snapshot is the whole driver state at the end of one batch (:meth:`engine.core.EngineCore.to_bytes`,
in the format of :mod:`engine.runtime.state_codec`).  The next batch may change the state, so it
is serialized right away, in the calling (evaluation) thread: the codec copies the arrays as raw
buffers, close to a ``memcpy`` of the state (figures in docs/measurements/engine.md).  Writing
those bytes -- to a temporary file, ``fsync``, rename -- is what takes seconds for a state of
hundreds of megabytes on a slow disk, and that is done by one background thread while the
batches go on (the write and ``fsync`` release the GIL).  Nothing is forked: a fork of the
driver (py4j, librdkafka and Arrow threads) could inherit a lock held by another thread and hang,
and would share the driver's sockets and pipes.

At most one write is in flight: a snapshot that falls due while the previous one is still being
written is skipped (logged), and the next one due is taken instead.  A snapshot that fails -- the
state cannot be serialized, the disk refuses the write -- is logged and skipped: a snapshot only
shortens a restart's replay, the state is never lost for want of one.  The serialized bytes are
held until written: while a write is in flight the driver holds the state and one copy of it.
``SnapshotWriter(background=False)`` writes in the calling thread too (tests, benchmarks).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("tidewatch.engine")


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing: a temporary file of this process, ``fsync``, rename
    (the temporary file is removed when the write fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


class SnapshotWriter:
    """Serializes snapshots in the calling thread and writes them in a background thread (see
    the module's docstring).

    ``background``: False writes in the calling thread too.  ``keep``: snapshots kept."""

    def __init__(self, background: bool = True, keep: int = 3) -> None:
        self.background = bool(background)
        self.keep = keep
        self._thread: threading.Thread | None = None
        self._batch = -1  # the batch of the write in flight
        #: (batch id, path, bytes, seconds from serializing to the rename) of the snapshots
        #: written; the newest last
        self.written: list[tuple[int, Path, int, float]] = []
        self.skipped = 0
        self.failed = 0

    @property
    def busy(self) -> bool:
        """Whether a snapshot is still being written."""
        self.poll()
        return self._thread is not None

    def write(self, batch_id: int, path: Path, serialize: Callable[[], bytes]) -> bool:
        """Snapshot ``serialize()`` of batch ``batch_id`` to ``path``: serialized now, written in
        the background; False if skipped (the previous snapshot is still being written) or failed."""
        if self.busy:
            self.skipped += 1
            log.info(
                "state snapshot of batch %d skipped: the one of batch %d is still being written",
                batch_id,
                self._batch,
            )
            return False
        t0 = time.perf_counter()
        try:
            data = serialize()
        except Exception:
            self.failed += 1
            log.exception(
                "state snapshot of batch %d failed: the state could not be serialized; the next one "
                "due is taken, a restart replays more batches until then",
                batch_id,
            )
            return False
        serialized = time.perf_counter() - t0
        if not self.background:
            self._write(batch_id, path, data, t0, serialized)
            return True
        self._batch = batch_id
        self._thread = threading.Thread(
            target=self._write,
            args=(batch_id, path, data, t0, serialized),
            name=f"tidewatch-snapshot-{batch_id}",
        )
        self._thread.start()
        return True

    def _write(self, batch_id: int, path: Path, data: bytes, t0: float, serialized: float) -> None:
        """Write, ``fsync``, rename; then keep the newest ``keep`` snapshots (the writer thread)."""
        try:
            atomic_write(path, data)
        except Exception as exc:
            self.failed += 1
            log.warning(
                "state snapshot of batch %d failed: could not write %s (%s); the next one due is "
                "taken, a restart replays more batches until then",
                batch_id,
                path,
                exc,
            )
            return
        seconds = time.perf_counter() - t0
        self.written.append((batch_id, path, len(data), seconds))
        for old in sorted(path.parent.glob("*.bin"))[: -self.keep]:
            old.unlink(missing_ok=True)
        log.info(
            "state snapshot of batch %d written (%d bytes in %.1f s: serialized in %.2f s in the "
            "evaluation thread, written%s)",
            batch_id,
            len(data),
            seconds,
            serialized,
            " by the writer thread while the batches went on" if self.background else "",
        )

    def poll(self) -> None:
        """Note that the write in flight has finished (nothing to do when none is)."""
        t = self._thread
        if t is not None and not t.is_alive():
            t.join()
            self._thread = None

    def wait(self) -> None:
        """Wait for the snapshot being written, if any (on stop)."""
        t = self._thread
        if t is not None:
            t.join()
        self.poll()
