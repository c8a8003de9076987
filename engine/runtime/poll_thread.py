"""A daemon thread that calls one function every few seconds until stopped: the engine's
pollers of PostgreSQL (the key page's chart requests, :mod:`engine.sinks.charts` and
:mod:`engine.shards.charts`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["PollThread"]

log = logging.getLogger("tidewatch.engine")


class PollThread:
    """Calls ``look`` every ``every_s`` seconds in a daemon thread named ``name`` between
    :meth:`start` and :meth:`stop`.  A look that raises is logged as ``"<what> now: <error
    type>"`` (e.g. PostgreSQL restarting) and the next look comes as planned."""

    def __init__(self, name: str, every_s: float, look: Callable[[], object], what: str) -> None:
        self.name, self.every_s, self.look, self.what = name, every_s, look, what
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (nothing when it runs)."""
        if self._thread is not None:
            return
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(self.every_s):
                try:
                    self.look()
                except Exception as exc:  # noqa: BLE001 -- logged; the next look tries again
                    log.warning("%s now: %s", self.what, type(exc).__name__)

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (waits up to 30 s for the look in progress)."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=30)
