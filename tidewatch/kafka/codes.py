"""Kafka errors told apart by their error code, never by their text.

:func:`error_code` is the code of the :class:`~confluent_kafka.KafkaError` a
:class:`~confluent_kafka.KafkaException` carries; the sets below group the codes that the
callers treat alike.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

__all__ = ["AUTHORIZATION_FAILED", "COORDINATOR", "error_code"]

#: the group (or transaction) coordinator is loading, moving or not there yet, e.g. on a fresh
#: broker that creates ``__consumer_offsets`` on first use: worth retrying a read of committed
#: offsets.  Every code whose name contains ``COORDINATOR`` (what the callers used to look for
#: in the error's text), ``TRANSACTION_COORDINATOR_FENCED`` included, ``_WAIT_COORD`` not.
COORDINATOR = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.TRANSACTION_COORDINATOR_FENCED,
    }
)

#: an ACL refuses this principal: every code whose name contains ``AUTHORIZATION_FAILED``
AUTHORIZATION_FAILED = frozenset(
    {
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.DELEGATION_TOKEN_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


def error_code(exc: BaseException | KafkaError | None) -> int | None:
    """The Kafka error code of ``exc`` (a :class:`~confluent_kafka.KafkaException` carrying a
    :class:`~confluent_kafka.KafkaError`, or the :class:`~confluent_kafka.KafkaError` itself);
    None for anything else."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    return err.code() if isinstance(err, KafkaError) else None
