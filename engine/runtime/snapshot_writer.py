"""Writing the engine's state snapshot without stopping the batches for its serialization or the disk.

A snapshot is the whole driver state at the end of one batch, in the format of
:mod:`engine.runtime.state_codec`.  The next batch may change the state, so only what must see
the state as it is now runs in the calling (evaluation) thread: the capture
(:meth:`engine.core.EngineCore.capture`, :func:`engine.runtime.state_capture.capture`) -- the
walk of the object graph, copies of the arrays (a ``memcpy``), of the object arrays and of the
algorithm structures' arrays.  The rest -- the object arrays' Arrow buffers, the structures'
``np.savez``, the JSON document, the CRC-32 (:meth:`~engine.runtime.state_capture.Captured.finish`)
-- and writing the file -- a temporary file written piece by piece, ``fsync``, rename -- are done
by one background thread while the batches go on.  That thread competes with the evaluation
thread for the GIL while it converts and serializes (the CRC, the write and ``fsync`` release
it); figures in docs/measurements/engine.md, "Snapshots off the evaluation thread".  Nothing is
forked: a fork of the driver (py4j, librdkafka and Arrow threads) could inherit a lock held by
another thread and hang, and would share the driver's sockets and pipes.

At most one snapshot is in flight (finished and written): a snapshot that falls due while the
previous one is still in flight is skipped (logged) -- before its capture, so it costs the
evaluation thread nothing -- and the next one due is taken instead.  A snapshot that fails --
the state cannot be captured or finished, the disk refuses the write -- is logged and skipped:
a snapshot only shortens a restart's replay, the state is never lost for want of one.  While a
snapshot is in flight the driver holds the state and the capture (copies of the arrays, the
nodes), then the file's pieces.  ``SnapshotWriter(background=False)`` finishes and writes in the
calling thread too (tests, benchmarks).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("tidewatch.engine")


class Finishable(Protocol):
    """What a capture gives (:class:`engine.runtime.state_capture.Captured`): ``finish()``, the
    file's pieces (buffers) in order."""

    def finish(self) -> list[Any]: ...


def atomic_write(path: Path, data: bytes | Iterable[Any]) -> None:
    """Write ``data`` -- bytes, or buffers one after another (bytes, uint8 arrays) -- to ``path``
    all or nothing: a temporary file of this process, ``fsync``, rename (the temporary file is
    removed when the write fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    pieces: Iterable[Any] = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    try:
        with open(tmp, "wb") as f:
            for piece in pieces:
                f.write(piece)
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
    """Captures snapshots in the calling thread, finishes and writes them in a background thread
    (see the module's docstring).

    ``background``: False finishes and writes in the calling thread too.  ``keep``: snapshots kept."""

    def __init__(self, background: bool = True, keep: int = 3) -> None:
        self.background = bool(background)
        self.keep = keep
        self._thread: threading.Thread | None = None
        self._batch = -1  # the batch of the snapshot in flight
        #: (batch id, path, bytes, seconds from the capture to the rename) of the snapshots
        #: written; the newest last
        self.written: list[tuple[int, Path, int, float]] = []
        #: (batch id, seconds of the capture in the calling thread, seconds to finish) of the
        #: snapshots written; the newest last
        self.timings: list[tuple[int, float, float]] = []
        self.skipped = 0
        self.failed = 0

    @property
    def busy(self) -> bool:
        """Whether a snapshot is still in flight (being finished or written)."""
        self.poll()
        return self._thread is not None

    def write(self, batch_id: int, path: Path, capture: Callable[[], Finishable | bytes]) -> bool:
        """Snapshot batch ``batch_id`` to ``path``: ``capture()`` now (its result's ``finish()``
        gives the file's pieces; plain bytes are written as they are), finished and written in the
        background; False if skipped (the previous snapshot is still in flight) or the capture
        failed."""
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
            captured = capture()
        except Exception:
            self.failed += 1
            log.exception(
                "state snapshot of batch %d failed: the state could not be captured; the next one "
                "due is taken, a restart replays more batches until then",
                batch_id,
            )
            return False
        captured_s = time.perf_counter() - t0
        box = [captured]  # the thread takes it out: the capture is freed as soon as it is finished
        del captured
        if not self.background:
            self._finish(batch_id, path, box, t0, captured_s)
            return True
        self._batch = batch_id
        self._thread = threading.Thread(
            target=self._finish,
            args=(batch_id, path, box, t0, captured_s),
            name=f"tidewatch-snapshot-{batch_id}",
        )
        self._thread.start()
        return True

    def _finish(
        self, batch_id: int, path: Path, box: list[Finishable | bytes], t0: float, captured_s: float
    ) -> None:
        """Finish the capture in ``box`` (taken out of it), write, ``fsync``, rename; then keep the
        newest ``keep`` snapshots (the writer thread)."""
        t1 = time.perf_counter()
        captured = box.pop()
        try:
            pieces = [captured] if isinstance(captured, bytes) else captured.finish()
        except Exception:
            self.failed += 1
            log.exception(
                "state snapshot of batch %d failed: the captured state could not be finished; the "
                "next one due is taken, a restart replays more batches until then",
                batch_id,
            )
            return
        del captured  # the pieces replace the capture: hold one of them only
        finished_s = time.perf_counter() - t1
        size = sum(memoryview(p).nbytes for p in pieces)
        try:
            atomic_write(path, pieces)
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
        self.written.append((batch_id, path, size, seconds))
        self.timings.append((batch_id, captured_s, finished_s))
        for old in sorted(path.parent.glob("*.bin"))[: -self.keep]:
            old.unlink(missing_ok=True)
        log.info(
            "state snapshot of batch %d written (%d bytes in %.1f s: captured in %.2f s in the "
            "evaluation thread, finished in %.2f s and written%s)",
            batch_id,
            size,
            seconds,
            captured_s,
            finished_s,
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
