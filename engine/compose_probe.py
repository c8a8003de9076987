"""A minimal ``trades`` consumer for the compose ``engine`` service's smoke test.

``docker-compose.yml`` runs the real engine (``tidewatch engine run``) by default; the compose
test (tests/integration/test_compose.py) runs this probe in the engine container instead
(``TIDEWATCH_COMPOSE_ENGINE_CMD``), because it has to see one particular record arrive
without depending on rules: it consumes ``settings.topic_trades`` from the beginning, decodes
every value with :func:`ingest.avro.decode` (the wire format the engine reads), and logs

* ``compose-probe: saw <symbol> ts=<ts> ...`` for each trade whose symbol starts with
  ``PROBE`` (what the test looks for), and
* a summary line every ``--report-every`` seconds (records and decode errors so far).

Run as ``python -m engine.compose_probe``.  It creates the project's topics first (retrying
until Kafka answers), so it works whichever container starts first.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time

from tidewatch.settings import get_settings

log = logging.getLogger("compose-probe")


def _wait_for_topics(bootstrap: str, deadline_s: float) -> None:
    from tidewatch.kafka.admin import ensure_topics

    t_end = time.monotonic() + deadline_s
    while True:
        try:
            ensure_topics(bootstrap, timeout=5.0)
            return
        except Exception as exc:  # Kafka not up yet
            if time.monotonic() > t_end:
                raise
            log.info("waiting for Kafka at %s (%s)", bootstrap, exc)
            time.sleep(2.0)


def run(bootstrap: str, topic: str, group: str, report_every: float, wait_s: float) -> int:
    """Consume until SIGTERM/SIGINT; return the number of records read."""
    from confluent_kafka import Consumer

    from ingest.avro import AvroDecodeError, decode

    _wait_for_topics(bootstrap, wait_s)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "topic.metadata.refresh.interval.ms": 2000,
        }
    )
    stop = {"now": False}

    def _stop(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    consumer.subscribe([topic])
    log.info("consuming %s from %s as group %s", topic, bootstrap, group)
    records = errors = 0
    next_report = time.monotonic() + report_every
    try:
        while not stop["now"]:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is not None:
                    log.warning("kafka error: %s", msg.error())
                    continue
                records += 1
                value = msg.value()
                try:
                    if value is None:
                        raise AvroDecodeError("tombstone (no value)")
                    trade = decode(value, "trades")
                except AvroDecodeError as exc:
                    errors += 1
                    log.warning("undecodable record at %s/%d: %s", msg.partition(), msg.offset(), exc)
                    continue
                if str(trade["symbol"]).startswith("PROBE"):
                    log.info(
                        "saw %s ts=%s price=%s size=%s partition=%d offset=%d",
                        trade["symbol"],
                        trade["ts"],
                        trade["price"],
                        trade["size"],
                        msg.partition(),
                        msg.offset(),
                    )
            if time.monotonic() >= next_report:
                log.info("%d records, %d undecodable", records, errors)
                next_report = time.monotonic() + report_every
    finally:
        consumer.close()
    log.info("stopped after %d records, %d undecodable", records, errors)
    return records


def main(argv: list[str] | None = None) -> int:
    s = get_settings()
    p = argparse.ArgumentParser(prog="python -m engine.compose_probe", description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", default=s.kafka_bootstrap)
    p.add_argument("--topic", default=s.topic_trades)
    p.add_argument("--group", default="tidewatch-compose-probe")
    p.add_argument("--report-every", type=float, default=10.0)
    p.add_argument("--wait", type=float, default=300.0, help="seconds to wait for Kafka")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    run(a.bootstrap, a.topic, a.group, a.report_every, a.wait)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
