"""``tidewatch alerts tail``: the ``alerts`` (and ``results``) topics, decoded, in a terminal.

A terminal view of what the dashboard shows: each Kafka record of the topics is decoded with the
Avro schemas of :mod:`tidewatch.wire.avro` and printed as one line (:func:`format_line`), or as
one JSON object per line with ``--json`` (:func:`json_line`).  Like ``tail``: without ``--last``
it follows new records until Ctrl-C; ``--last N`` prints the newest N records and stops
(``--follow`` keeps following after them); ``--from-beginning`` starts at the oldest record.

It reads as the ``dashboard`` principal (the one the ACLs let read alerts and results,
:func:`tidewatch.kafka.client.client_config`), ``read_committed`` -- only what the engine's
transactions committed, as every other reader -- in a throw-away consumer group that commits
nothing.  Records that do not decode are reported on stderr and skipped.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dashboard.capped import CAPPED, capped_text

if TYPE_CHECKING:
    from confluent_kafka import Consumer

    from tidewatch.settings import Settings

#: the topics ``tail`` reads, by the name of their schema
TOPICS = ("alerts", "results")


@dataclass(frozen=True)
class Record:
    """One decoded record: its topic role (``alerts`` / ``results``), position, and the Avro
    record (None: a tombstone of ``results``, whose Kafka ``key`` is ``subscription|key``)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # Kafka's, epoch ms
    key: str
    value: dict[str, Any] | None


def iso_time(ms: int, tz: tzinfo | None = None) -> str:
    """Epoch milliseconds as ISO-8601 in ``tz`` (default: the local time zone), to the millisecond."""
    t = datetime.fromtimestamp(ms / 1000, UTC)
    return (t.astimezone(tz) if tz is not None else t.astimezone()).isoformat(timespec="milliseconds")


def _number(v: float | None) -> str:
    if v is None:
        return "NULL"
    if math.isfinite(v) and v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.10g}"


def format_values(values: dict[str, float | None]) -> str:
    """``label=value`` pairs in label order; NULL for a NULL aggregate, whole numbers without ``.0``."""
    return ", ".join(f"{k}={_number(v)}" for k, v in sorted(values.items()))


def format_line(rec: Record, tz: tzinfo | None = None) -> str:
    """One human line: ``<as of>  ENTER  <subscription name> [<id>]  key=<key>  <values>`` for an
    alert (``CAPPED <subscription>  capped: n more changes withheld (…)`` for the alert cap's
    record, :mod:`dashboard.capped`); ``RESULT``/``GONE`` (present or not) for a result,
    ``REMOVED`` for its tombstone."""
    v = rec.value
    if v is None:
        return f"{'-':<29}  REMOVED  {rec.key}  (results tombstone)"
    if rec.topic == "alerts":
        name = v.get("rule_name") or v["subscription_id"]
        kind = v["kind"]
        if kind == CAPPED:  # the alert cap's record: what it withheld, not a key
            sub = f"{name} [{v['subscription_id']}]" if name != v["subscription_id"] else name
            return f"{iso_time(v['as_of'], tz)}  {kind} {sub}  {capped_text(v.get('values') or {})}"
    else:
        name = v["subscription_id"]
        kind = "RESULT" if v["present"] else "GONE"
    sub = f"{name} [{v['subscription_id']}]" if name != v["subscription_id"] else name
    line = f"{iso_time(v['as_of'], tz)}  {kind:<6} {sub}  key={v['key']}"
    values = format_values(v.get("values") or {})
    return f"{line}  {values}" if values else line


def json_line(rec: Record) -> str:
    """One JSON object: ``topic``, ``partition``, ``offset``, ``timestamp`` and the decoded record
    under ``record`` (null for a tombstone, then ``key`` says which result left)."""
    return json.dumps(
        {
            "topic": rec.topic,
            "partition": rec.partition,
            "offset": rec.offset,
            "timestamp": rec.timestamp,
            "key": rec.key,
            "record": rec.value,
        },
        sort_keys=True,
        allow_nan=False,
        default=str,
    )


def matches(rec: Record, subscription: str | None) -> bool:
    """Whether ``rec`` belongs to ``subscription`` (its id or, for alerts, its name; None: all)."""
    if subscription is None:
        return True
    if rec.value is None:
        return rec.key.split("|", 1)[0] == subscription
    return subscription in (rec.value["subscription_id"], rec.value.get("rule_name"))


# ---------------------------------------------------------------- Kafka
def consumer(settings: Settings, bootstrap: str | None = None) -> Consumer:
    """A read_committed consumer as the ``dashboard`` principal, committing nothing."""
    from confluent_kafka import Consumer

    from tidewatch.kafka.client import librdkafka_config

    return Consumer(
        librdkafka_config(
            settings,
            "dashboard",
            bootstrap,
            **{
                "group.id": f"tidewatch-dashboard-tail-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "log_level": 2,  # no librdkafka line per failed connect: a failure ends the command, named
            },
        )
    )


def _poll(
    c: Consumer, roles: dict[str, str], warn: Callable[[str], None]
) -> tuple[Record | None, tuple[str, int] | None]:
    """The next record (None: nothing in time, or it did not decode -- reported to ``warn``) and
    the (topic, partition) whose end was reached (``enable.partition.eof``), if that is what came."""
    from confluent_kafka import KafkaError

    from tidewatch.wire.avro import AvroDecodeError, decode

    msg = c.poll(0.5)
    if msg is None:
        return None, None
    topic, part, off = str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)
    err = msg.error()
    if err is not None:
        if err.code() == KafkaError._PARTITION_EOF:
            return None, (topic, part)
        raise RuntimeError(f"Kafka: {err}")
    role = roles[topic]
    raw_key = msg.key()
    key = raw_key.decode("utf-8", "replace") if isinstance(raw_key, bytes) else str(raw_key or "")
    payload = msg.value()
    value = None
    if payload is not None:
        try:
            value = decode(bytes(payload), role)
        except AvroDecodeError as exc:
            warn(f"{topic}[{part}]@{off}: not a {role} record ({exc})")
            return None, None
    return Record(role, part, off, int(msg.timestamp()[1]), key, value), None


def _partitions(c: Consumer, topic: str, timeout: float) -> list[int]:
    md = c.list_topics(topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        raise typer.BadParameter(f"topic {topic!r} cannot be read: {t.error if t else 'missing'}")
    return sorted(t.partitions)


def _read_to_end(
    c: Consumer,
    starts: dict[tuple[str, int], int],
    roles: dict[str, str],
    warn: Callable[[str], None],
    timeout: float,
) -> list[Record]:
    """Every record from ``starts`` (topic, partition -> offset) up to the end of each partition."""
    from confluent_kafka import TopicPartition

    if not starts:
        return []
    c.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
    pending = set(starts)
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the end of {sorted(pending)} was not reached in {timeout:.0f} s")
        rec, eof = _poll(c, roles, warn)
        if eof is not None:
            pending.discard(eof)
        if rec is not None:
            out.append(rec)
    return out


def last_records(
    c: Consumer, roles: dict[str, str], n: int, warn: Callable[[str], None], timeout: float = 30.0
) -> list[Record]:
    """The newest ``n`` committed records of the topics (Kafka timestamp order, then partition
    and offset).  Transaction markers and aborted records take offsets too, so each partition is
    read from ``n + margin`` before its end, the margin doubled until ``n`` records are found or
    the partition's start is reached."""
    parts = [(t, p) for t in roles for p in _partitions(c, t, timeout)]
    from confluent_kafka import TopicPartition

    got: dict[tuple[str, int], list[Record]] = {}
    for t, p in parts:
        low, high = c.get_watermark_offsets(TopicPartition(t, p), timeout=timeout)
        span = n + 16
        while True:
            start = max(low, high - span)
            recs = _read_to_end(c, {(t, p): start}, roles, warn, timeout) if high > low else []
            if len(recs) >= n or start == low:
                got[(t, p)] = recs[-n:] if n else []
                break
            span *= 2
    every = [r for recs in got.values() for r in recs]
    every.sort(key=lambda r: (r.timestamp, r.topic, r.partition, r.offset))
    return every[-n:] if n else []


def follow(
    c: Consumer,
    roles: dict[str, str],
    warn: Callable[[str], None],
    *,
    from_beginning: bool,
    after: dict[tuple[str, int], int] | None = None,
    timeout: float = 30.0,
) -> Iterator[Record]:
    """Records as they are committed, until the caller stops iterating (Ctrl-C): from the oldest
    (``from_beginning``), after the offsets ``after``, or from the end."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

    tps = []
    for t in roles:
        for p in _partitions(c, t, timeout):
            if after is not None and (t, p) in after:
                off = after[(t, p)] + 1
            else:
                off = OFFSET_BEGINNING if from_beginning else OFFSET_END
            tps.append(TopicPartition(t, p, off))
    c.assign(tps)
    while True:
        rec, _ = _poll(c, roles, warn)
        if rec is not None:
            yield rec


# ---------------------------------------------------------------- the command
def tail(
    settings: Settings,
    *,
    topics: Sequence[str],
    last: int | None,
    from_beginning: bool,
    follow_after: bool,
    subscription: str | None,
    as_json: bool,
    bootstrap: str | None = None,
    echo: Callable[[str], None] = print,
    warn: Callable[[str], None] = print,
) -> int:
    """Run ``tidewatch alerts tail``; returns how many records were printed."""
    topic_of = {"alerts": settings.topic_alerts, "results": settings.topic_results}
    roles = {topic_of[r]: r for r in topics}
    show = json_line if as_json else format_line
    printed = 0
    c = consumer(settings, bootstrap)
    try:
        after: dict[tuple[str, int], int] | None = None
        if last is not None:
            if follow_after:  # where the newest records end now: following starts after them
                after = _ends(c, roles)
            if subscription is None:
                newest = last_records(c, roles, last, warn)
            else:  # keyed by subscription, but a key's partition is the producer's business
                newest = [r for r in last_records(c, roles, 10**12, warn) if matches(r, subscription)]
                newest = newest[-last:] if last else []
            for rec in newest:
                echo(show(rec))
                printed += 1
            if not follow_after:
                return printed
        for rec in follow(c, roles, warn, from_beginning=from_beginning, after=after):
            if matches(rec, subscription):
                echo(show(rec))
                printed += 1
    except KeyboardInterrupt:  # Ctrl-C: the normal way to stop following
        pass
    finally:
        c.close()
    return printed


def _ends(c: Consumer, roles: dict[str, str], timeout: float = 30.0) -> dict[tuple[str, int], int]:
    """The offset of the last record of each partition of the topics (-1: empty)."""
    from confluent_kafka import TopicPartition

    return {
        (t, p): c.get_watermark_offsets(TopicPartition(t, p), timeout=timeout)[1] - 1
        for t in roles
        for p in _partitions(c, t, timeout)
    }


def register(app: typer.Typer) -> None:
    """Add the ``alerts`` command group (``tidewatch alerts tail``) to the root CLI."""
    alerts = typer.Typer(help="Read the alerts and results topics in a terminal.", no_args_is_help=True)

    @alerts.command("tail")
    def tail_cmd(
        last: Annotated[
            int | None,
            typer.Option(
                "--last", "-n", min=0, help="print the newest N records and stop (add --follow to go on)"
            ),
        ] = None,
        follow_: Annotated[
            bool, typer.Option("--follow", "-f", help="with --last: keep following new records after them")
        ] = False,
        from_beginning: Annotated[
            bool, typer.Option("--from-beginning", help="start at the oldest record instead of new ones only")
        ] = False,
        subscription: Annotated[
            str | None,
            typer.Option(
                "--subscription", "-s", help="only this subscription (its id, or its name for alerts)"
            ),
        ] = None,
        results: Annotated[
            bool, typer.Option("--results", help="also the results topic (current results, compacted)")
        ] = False,
        results_only: Annotated[bool, typer.Option("--results-only", help="the results topic alone")] = False,
        as_json: Annotated[
            bool, typer.Option("--json", help="one JSON object per line (topic, offset, decoded record)")
        ] = False,
        bootstrap: Annotated[
            str | None, typer.Option(help="Kafka bootstrap servers (default: settings)")
        ] = None,
    ) -> None:
        """Print alerts as they are committed, like [bold]tail -f[/bold]; Ctrl-C stops.

        One line per alert: as-of time (ISO-8601, local), ENTER or EXIT, subscription, key, values.

        With [bold]--results[/bold]: RESULT (key in the result), GONE (it left), REMOVED (tombstone).

        Reads committed records only, with your Kafka settings, as the dashboard's principal.

        Examples: [bold]tidewatch alerts tail[/bold] · [bold]tidewatch alerts tail --last 20[/bold] ·
        [bold]tidewatch alerts tail -s momentum --from-beginning --json[/bold]
        """
        import sys

        from confluent_kafka import KafkaException

        from tidewatch.settings import get_settings

        topics = ("results",) if results_only else ("alerts", "results") if results else ("alerts",)
        try:
            tail(
                get_settings(),
                topics=topics,
                last=last,
                from_beginning=from_beginning,
                follow_after=follow_ or last is None,
                subscription=subscription,
                as_json=as_json,
                bootstrap=bootstrap,
                echo=lambda s: print(s, flush=True),
                warn=lambda s: print(s, file=sys.stderr, flush=True),
            )
        except (KafkaException, TimeoutError, RuntimeError) as exc:  # Kafka down, topic unreadable
            print(f"tidewatch alerts tail: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None

    app.add_typer(alerts, name="alerts")
