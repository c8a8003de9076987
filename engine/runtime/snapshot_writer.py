"""Writing the engine's state snapshot without stopping the batches for its serialization or the disk.

A snapshot is the whole driver state at the end of one batch, in the format of
:mod:`engine.runtime.state_codec`.  The next batch may change the state, so whatever reads the
state must see it as it is now.  Two ways, by ``fork``:

* **A forked child (``fork=True``, the engine's default, ``Settings.engine_snapshot_fork``).**
  The evaluation thread forks (``multiprocessing``'s ``fork`` context, 20--90 ms for the live
  10,000-rule driver of 1.2 GB); the child holds the copy-on-write image of the state as it is
  now, and does the whole serialization there -- capture (copying nothing: its image cannot
  change, ``capture(private_image=True)``, :class:`Capture`), finish, write, ``fsync``, rename -- at
  a lower priority (``nice`` 10: the batches and Spark's tasks come first), while the parent's
  batches go on without sharing its GIL.  The parent pays for the pages it changes while the
  child lives (a copy each, ≈ 0.2 s per GB); with ``prefault`` the fork's thread takes the copies
  of the pages the next batch writes ahead of it (:mod:`engine.runtime.prefault`).  The child
  touches nothing but the state and the file: not the parent's sockets, clients or other
  threads' locks (it ends by ``os._exit`` through ``multiprocessing``, closing its copies of the
  descriptors only; no socket can be shut down in it: :func:`_no_shutdown_in_child`).  It dies with the parent (Linux's
  parent-death signal), so a killed driver leaves no writer holding its pipes -- Spark's JVM
  ends when the driver's end of its pipe closes.  A lock another thread held at the fork stays
  held in the child, so a child that could block on one -- none of the code it runs takes such a
  lock, but a library might -- is killed after ``fork_timeout_s`` and counted as a failed
  snapshot, and later snapshots are written from a thread; the parent never waits for it.  A
  temporary file a killed child leaves is named by its pid; :func:`remove_stale_temporaries`
  deletes it once that process is gone.
* **In this process (``fork=False``).**  Only what must see the state as it is now runs in the
  calling (evaluation) thread: the capture (:meth:`engine.core.EngineCore.capture`,
  :func:`engine.runtime.state_capture.capture`) -- the walk of the object graph, copies of the
  arrays (a ``memcpy``), of the object arrays and of the algorithm structures' arrays.  The rest
  -- the object arrays' Arrow buffers, the structures' ``np.savez``, the JSON document, the
  CRC-32 (:meth:`~engine.runtime.state_capture.Captured.finish`) -- and writing the file -- a
  temporary file written piece by piece, ``fsync``, rename -- are done by one background thread
  while the batches go on.  That thread competes with the evaluation thread for the GIL while it
  converts and serializes (the CRC, the write and ``fsync`` release it); figures in
  docs/measurements/engine.md, "Snapshots off the evaluation thread" and "Snapshots by a forked
  child".

At most one snapshot is in flight (finished and written): a snapshot that falls due while the
previous one is still in flight is skipped (logged) -- before its capture, so it costs the
evaluation thread nothing -- and the next one due is taken instead.  A snapshot that fails --
the state cannot be captured or finished, the disk refuses the write -- is logged and skipped:
a snapshot only shortens a restart's replay, the state is never lost for want of one.  While a
snapshot is in flight in this process the driver holds the state and the capture (copies of the
arrays, the nodes), then the file's pieces.  ``SnapshotWriter(background=False)`` finishes and
writes in the calling thread too (tests, benchmarks).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from engine.runtime.prefault import ahead_of_next_batch
from tidewatch.lifetime import die_with_parent

log = logging.getLogger("tidewatch.engine")


class Finishable(Protocol):
    """What a capture gives (:class:`engine.runtime.state_capture.Captured`): ``finish()``, the
    file's pieces (buffers) in order."""

    def finish(self) -> list[Any]: ...


class Capture(Protocol):
    """What :meth:`SnapshotWriter.write` takes (:meth:`engine.core.EngineCore.capture`): called
    once per snapshot, with no argument in the calling thread, or with ``private_image=True`` in
    the forked child (its image of the state never changes: nothing need be copied,
    :func:`engine.runtime.state_capture.capture`); its result's ``finish()`` gives the file's
    pieces (plain bytes are written as they are)."""

    def __call__(self, *, private_image: bool = False) -> Finishable | bytes: ...


#: what :meth:`SnapshotWriter.write` calls in this process once a child is forked (or None)
AfterFork = Callable[[], object] | None


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
    """Captures snapshots in the calling thread, finishes and writes them in a background thread,
    or does it all in a forked child (see the module's docstring).

    ``background``: False finishes and writes in the calling thread too (``fork`` is then
    ignored).  ``keep``: snapshots kept.  ``fork``: serialize in a forked child;
    ``fork_timeout_s``: the child is killed (a failed snapshot) past this.  ``prefault``: once a
    child is forked, the pages the next batch of :meth:`write`'s ``evaluator`` writes are made
    this process's own by the fork's thread (:func:`engine.runtime.prefault.ahead_of_next_batch`;
    ``Settings.engine_snapshot_prefault``)."""

    def __init__(
        self,
        background: bool = True,
        keep: int = 3,
        fork: bool = False,
        fork_timeout_s: float = 600.0,
        prefault: bool = False,
    ) -> None:
        self.background = bool(background)
        self.keep = keep
        self.fork = bool(fork) and self.background
        self.prefault = bool(prefault)
        self.fork_timeout_s = float(fork_timeout_s)
        self._thread: threading.Thread | None = None
        self._batch = -1  # the batch of the snapshot in flight
        #: (batch id, path, bytes, seconds from the capture to the rename) of the snapshots
        #: written; the newest last
        self.written: list[tuple[int, Path, int, float]] = []
        #: (batch id, seconds of the capture -- or of the fork -- in the calling thread, seconds
        #: to finish -- in a child: to capture and finish) of the snapshots written; the newest last
        self.timings: list[tuple[int, float, float]] = []
        self.skipped = 0
        self.failed = 0

    @property
    def busy(self) -> bool:
        """Whether a snapshot is still in flight (being finished or written)."""
        self.poll()
        return self._thread is not None

    def write(self, batch_id: int, path: Path, capture: Capture, evaluator: object = None) -> bool:
        """Snapshot batch ``batch_id`` to ``path``: ``capture()`` now -- forking, the child's
        ``capture(private_image=True)`` of its image of now (:class:`Capture`) -- (its result's
        ``finish()`` gives the file's pieces; plain bytes are written as they are), finished and
        written in the background; False if skipped (the previous snapshot is still in flight)
        or the capture failed.  ``evaluator``: with ``prefault``, the one whose next batch's pages
        are made this process's own once a child is forked, by the thread that forked it while the
        caller goes on (:func:`engine.runtime.prefault.ahead_of_next_batch`, its targets read
        now); a failure of that step is logged, never raised; nothing is done when no child is
        forked."""
        if self.busy:
            self.skipped += 1
            log.info(
                "state snapshot of batch %d skipped: the one of batch %d is still being written",
                batch_id,
                self._batch,
            )
            return False
        if self.fork:
            after_fork = ahead_of_next_batch(evaluator) if self.prefault else None
            return self._fork(batch_id, path, capture, after_fork)
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
        self._done(batch_id, path, size, t0, captured_s, finished_s)

    def _done(
        self, batch_id: int, path: Path, size: int, t0: float, captured_s: float, finished_s: float
    ) -> None:
        """Note snapshot ``batch_id`` written, keep the newest ``keep``, log it."""
        seconds = time.perf_counter() - t0
        self.written.append((batch_id, path, size, seconds))
        self.timings.append((batch_id, captured_s, finished_s))
        for old in sorted(path.parent.glob("*.bin"))[: -self.keep]:
            old.unlink(missing_ok=True)
        if self.fork:
            how = "forked in %.2f s by the evaluation thread, captured, finished and written in %.2f s by a child"
        else:
            how = "captured in %.2f s in the evaluation thread, finished in %.2f s and written" + (
                " by the writer thread while the batches went on" if self.background else ""
            )
        log.info(
            "state snapshot of batch %d written (%d bytes in %.1f s: " + how + ")",
            batch_id,
            size,
            seconds,
            captured_s,
            finished_s,
        )

    def _fork(self, batch_id: int, path: Path, capture: Capture, after_fork: AfterFork) -> bool:
        """Snapshot ``batch_id`` from a forked child.  The fork is made by the thread that then
        waits for the child (the child's parent-death signal is tied to that thread, which lives
        as long as the child); the calling thread waits for the fork only."""
        forked = threading.Event()
        failed: list[BaseException] = []
        self._batch = batch_id
        t0 = time.perf_counter()
        self._thread = threading.Thread(
            target=self._run_child,
            args=(batch_id, path, capture, forked, failed, t0, after_fork),
            name=f"tidewatch-snapshot-{batch_id}",
        )
        self._thread.start()
        forked.wait()
        if failed:
            self._thread.join()
            self._thread = None
            self.failed += 1
            log.warning(
                "state snapshot of batch %d failed: could not fork the process that writes it (%s); "
                "the next one due is taken, a restart replays more batches until then",
                batch_id,
                failed[0],
            )
            return False
        return True

    def _run_child(
        self,
        batch_id: int,
        path: Path,
        capture: Capture,
        forked: threading.Event,
        failed: list[BaseException],
        t0: float,
        after_fork: AfterFork = None,
    ) -> None:
        """Fork the child writing snapshot ``batch_id``, run ``after_fork``, then wait for the
        child (killed past ``fork_timeout_s``; writing from a thread from then on: a child that
        hangs once would hang again)."""
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        try:
            child = ctx.Process(
                target=_serialize_in_child,
                args=(path, capture, send, os.getpid()),
                name=f"tidewatch-snapshot-{batch_id}",
                daemon=True,
            )
            with _no_shutdown_in_child():
                child.start()
        except Exception as exc:
            failed.append(exc)
            receive.close()
            return
        finally:
            send.close()  # the child's copy is the one that writes
            forked.set()
        forked_s = time.perf_counter() - t0
        if after_fork is not None:
            try:
                after_fork()
            except Exception:
                log.exception(
                    "snapshot of batch %d: the step after its fork failed (the snapshot goes on)", batch_id
                )
        child.join(self.fork_timeout_s)
        try:
            if child.exitcode is None:
                child.kill()
                child.join()
                path.with_name(f"{path.name}.{child.pid}.tmp").unlink(missing_ok=True)
                self.failed += 1
                self.fork = False
                log.warning(
                    "state snapshot of batch %d failed: its process did not finish in %.0f s and was "
                    "killed; the next one due is taken, written from a thread of this process from "
                    "now on (a restart replays more batches until then)",
                    batch_id,
                    self.fork_timeout_s,
                )
                return
            gone = ("error", f"its process ended with exit code {child.exitcode}")
            report: tuple[Any, ...] = receive.recv() if receive.poll() else gone
        finally:
            receive.close()
        if report[0] != "ok":
            self.failed += 1
            log.warning(
                "state snapshot of batch %d failed: %s; the next one due is taken, a restart "
                "replays more batches until then",
                batch_id,
                report[1],
            )
            return
        _, size, busy_s = report
        self._done(batch_id, path, size, t0, forked_s, busy_s)

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


def _serialize_in_child(path: Path, capture: Capture, send: Any, parent: int) -> None:
    """In the forked child: capture (``private_image=True``: this image of the state never
    changes, nothing is copied) and finish the state (the child's image of the parent's at the
    fork), write it to ``path`` atomically, and send ``("ok", bytes, seconds)`` -- or
    ``("error", why)`` -- to the parent.  Runs at a lower priority (``nice`` 10).  Dies with the
    parent: SIGKILL when the thread that forked it ends (Linux's parent-death signal), or at once
    if the parent ``parent`` is already gone."""
    t0 = time.perf_counter()
    if not die_with_parent(parent):  # no orphan writer holding the driver's pipes
        os._exit(1)
    os.nice(_CHILD_NICENESS)  # background work: the batches and Spark's tasks come first
    try:
        captured = capture(private_image=True)  # this image of the state never changes: no copies
        pieces = [captured] if isinstance(captured, bytes) else captured.finish()
    except Exception as exc:
        send.send(("error", f"the state could not be captured or finished ({type(exc).__name__}: {exc})"))
        return
    try:
        atomic_write(path, pieces)
    except Exception as exc:
        send.send(("error", f"could not write {path} ({exc})"))
        return
    send.send(("ok", sum(memoryview(p).nbytes for p in pieces), time.perf_counter() - t0))


#: how much lower the child's scheduling priority is than the driver's
_CHILD_NICENESS = 10


@contextlib.contextmanager
def _no_shutdown_in_child() -> Iterator[None]:
    """Around a fork: ``socket.shutdown`` does nothing in the child and stays itself in this
    process.  At the fork CPython clears, in the child, the thread states of the threads the child
    lacks; what they alone held is freed, and finalizers run -- py4j's ended a thread's
    connection to Spark's JVM with a ``shutdown``, which on a socket the child shares with the
    parent ends it for the parent ("Connection reset by peer" in the engine at every snapshot,
    Nov 24; tests/engine/runtime/test_snapshot_fork.py).  ``close`` is harmless (the parent keeps
    its descriptor).  The method is replaced only while the fork is made, by one that calls the
    original in this process; the child keeps it."""
    original = socket.socket.shutdown
    parent = os.getpid()

    def shutdown(self: socket.socket, how: int) -> None:
        if os.getpid() != parent:
            return  # the child: the socket is the parent's too
        original(self, how)

    socket.socket.shutdown = shutdown  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        socket.socket.shutdown = original  # type: ignore[method-assign]
