"""Riding out a Kafka broker restart under a transactional producer (engine and outbox relay).

After a broker restart librdkafka (2.16) can block in ``send_offsets_to_transaction`` or
``commit_transaction`` past its own timeout (librdkafka issues 5456 and 5511), and a
transaction can fail with any kind of error (retriable, abortable, fatal).  Both callers do
the same thing: each call into the transactional clients runs under :func:`bounded` (given up
with :class:`KafkaStalled` after a deadline; the call is left in its thread, on a producer that
is then abandoned), and :func:`retrying` repeats the whole unit of work.  At every attempt
after the first the caller re-creates its producer with the same ``transactional.id`` -- its
``init_transactions`` fences the old producer and completes or aborts its open transaction --
and then consults its own progress record (the engine's marker offset, the relay's recovery
read of the topic) to decide whether the work was already committed.  :class:`Call` is the
thread under :func:`bounded`, also used alone for a call that overlaps others (the engine's
progress marker, :class:`engine.sinks.publish.Marking`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from confluent_kafka import KafkaError, KafkaException

from tidewatch.errors import TidewatchError

T = TypeVar("T")

#: refusals no new producer can get past (credentials, ACLs): raised at once, never retried
REFUSED = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
    }
)


def refused(exc: BaseException) -> bool:
    """True when ``exc`` is Kafka refusing this principal (an ACL or its credentials), by its
    error code.  A transaction whose records were refused fails its commit with a code of its
    own; :class:`DeliveryErrors` turns that into the refusal the records' delivery reports gave."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and err.code() in REFUSED


class DeliveryErrors:
    """A producer's ``on_delivery`` callback that keeps the first refusal among the delivery
    reports, so a failed transaction is reported with the records' own error code."""

    def __init__(self) -> None:
        self.first_refusal: KafkaError | None = None

    def __call__(self, err: KafkaError | None, msg: object) -> None:
        if err is not None and err.code() in REFUSED and self.first_refusal is None:
            self.first_refusal = err

    def reraise(self, producer: Any, exc: KafkaException) -> None:
        """After ``exc`` failed a transaction of ``producer``: serve its pending delivery reports
        and raise the first refusal among them (as a :class:`KafkaException` from ``exc``);
        return when there is none."""
        producer.poll(0)
        if self.first_refusal is not None:
            raise KafkaException(self.first_refusal) from exc


class KafkaStalled(TidewatchError, RuntimeError):
    """A call of a Kafka client did not return within its deadline (see :func:`bounded`)."""


class Call(Generic[T]):
    """``fn()`` started at once on a daemon thread of its own (named ``name``), its value or its
    exception kept for :meth:`wait`; :attr:`alive` while it runs.  A call that never returns (a
    client blocked past its own timeout) is left running: it must only touch clients that are
    then abandoned."""

    def __init__(self, fn: Callable[[], T], what: str, name: str = "tidewatch-kafka") -> None:
        #: what the call does, for :class:`KafkaStalled`'s message
        self.what = what
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- re-raised by wait()
            self._box["error"] = exc

    @property
    def alive(self) -> bool:
        """Whether ``fn()`` is still running."""
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> T:
        """``fn()``'s value once it returned, or its exception raised again (at every wait);
        :class:`KafkaStalled` if it is still running after ``timeout`` seconds (None: waits as
        long as it runs)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise KafkaStalled(f"{self.what}: no answer from Kafka within {timeout or 0:.0f} s")
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]  # type: ignore[no-any-return]


def bounded(fn: Callable[[], T], seconds: float, what: str) -> T:
    """``fn()`` in a thread of its own (a :class:`Call`); :class:`KafkaStalled` if it has not
    returned after ``seconds`` (the thread is left running: it must only touch clients that are
    then abandoned)."""
    return Call(fn, what).wait(seconds)


def retrying(
    attempt: Callable[[int], T],
    retry_s: float,
    what: str,
    log: logging.Logger,
    stop: threading.Event | None = None,
) -> T:
    """``attempt(1)``, ``attempt(2)``, ... until one returns, while they raise
    :class:`~confluent_kafka.KafkaException` or :class:`KafkaStalled`, pausing 0.5 s (doubling up
    to 10 s) in between, for up to ``retry_s`` or until ``stop`` is set; then the last error is
    raised.  A refusal (ACL, credentials: :func:`refused`) is raised at once.  ``attempt(n)`` with ``n > 1`` must re-create the producer and check its progress
    before working again."""
    deadline = time.monotonic() + retry_s
    n, wait = 1, 0.5
    while True:
        try:
            out = attempt(n)
            if n > 1:
                log.info("%s: published to Kafka at attempt %d", what, n)
            return out
        except (KafkaException, KafkaStalled) as exc:
            if refused(exc):  # an ACL or a credential: a new producer would be refused the same
                log.error("%s: refused by Kafka (%s): not retried", what, exc)
                raise
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop.is_set()):
                log.error("%s: Kafka unreachable for %.0f s: giving up (%s)", what, retry_s, exc)
                raise
            pause = min(wait, left)
            log.warning(
                "%s: Kafka transaction failed (attempt %d: %s); retrying with a new producer "
                "in %.1f s (%.0f s left)", what, n, exc, pause, left,
            )  # fmt: skip
            if stop is None:
                time.sleep(pause)
            elif stop.wait(pause):
                raise
            n, wait = n + 1, min(2 * wait, 10.0)
