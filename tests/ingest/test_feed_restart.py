"""The Kafka broker restarted while a file feed runs: the feed keeps going and nothing is lost or doubled.

The broker is the embedded one (:mod:`tidewatch.stack.kafka_broker`, the broker ``tidewatch up``
runs) in a temporary run dir on free ports (fixture ``restartable_kafka``, tests/conftest.py), so it can be stopped and started again on the
same ports and data (the session's container broker is shared by other tests).  The real
``tidewatch feed trades --csv`` runs in a subprocess, paced with ``--rate``; the broker is
stopped (controlled shutdown, SIGTERM) part-way, left down for a few seconds and started
again.  The producer queues and retries meanwhile (idempotent: ``enable.idempotence``, so a
retried batch is written once; ``message.timeout.ms`` 120 s bounds the outage it rides
out).  This is the plain (idempotent) feed.  With ``--resume`` (transactions) a broker
restart in the middle of a transaction was seen to stall ``send_offsets_to_transaction`` in
librdkafka 2.16 past its timeout (docs/RELIABILITY.md): killing the feed and running it again
with ``--resume`` is exactly-once (tests/ingest/test_feed_resume.py), but it does not ride the
restart out on its own.
The topic read back with ``read_committed`` holds every record of the file exactly once,
each key's records in file order.  docs/RELIABILITY.md, "Kafka broker restart mid-stream".
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from ingest.producer import ensure_topic
from ingest.trades_gen import TradeConfig, TradeGenerator
from tests.engine.support import end_offsets
from tests.ingest.support import read_messages
from tidewatch.settings import Settings, get_settings
from tidewatch.stack import kafka_broker as kafka
from tidewatch.wire.avro import decode_batch, field_names
from tidewatch.wire.csv_io import columns_to_frame, read_csv_chunks, write_csv

pytestmark = pytest.mark.integration

DOWN_S = float(os.environ.get("TIDEWATCH_TEST_BROKER_DOWN_S", "4"))


def _high_watermarks(bootstrap: str, topic: str) -> int:
    """Sum of the partitions' high watermarks (records written, committed or not)."""
    return sum(end_offsets(bootstrap, topic).values())


def test_feed_rides_out_a_broker_restart(restartable_kafka: Settings, tmp_path: Path) -> None:
    broker = restartable_kafka
    bootstrap = broker.kafka_bootstrap
    topic = f"it-restart-{uuid.uuid4().hex[:8]}"
    ensure_topic(get_settings(), bootstrap, topic, 2)
    f = tmp_path / "trades.csv"
    write_csv(
        f, TradeGenerator(TradeConfig(rate=2000, n_symbols=200), seed=5).chunks(0, 2500, 1000), "trades"
    )
    src = pd.concat([columns_to_frame(c, "trades") for c in read_csv_chunks(f, "trades")], ignore_index=True)
    n = len(src)
    rate = 2000
    cmd = [sys.executable, "-m", "tidewatch.cli", "feed", "trades", "--csv", str(f)]
    cmd += ["--bootstrap", bootstrap, "--topic", topic, "--no-progress", "--rate", str(rate)]
    # feed at `rate`/s; the broker goes down after ~3 s of sending and comes back DOWN_S later
    assert n / rate > 3 + DOWN_S + 2, "the file must outlast the outage"
    log = tmp_path / "feed.log"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"), text=True)
    try:
        deadline = time.monotonic() + 60
        while _high_watermarks(bootstrap, topic) < 2 * rate and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.1)
        before = _high_watermarks(bootstrap, topic)
        assert 0 < before < n
        t0 = time.monotonic()
        kafka.stop(broker)
        time.sleep(DOWN_S)
        assert proc.poll() is None, "the feed died while the broker was down"
        kafka.start(broker)
        outage = time.monotonic() - t0
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    errors = log.read_text()
    assert proc.returncode == 0, errors[-3000:]
    assert "failed 0, unconfirmed 0" in errors
    got_msgs = read_messages(bootstrap, topic)
    print(
        f"\n{n} records; {before} written when the broker stopped; down {outage:.1f} s; got {len(got_msgs)}"
    )
    assert len(got_msgs) == n  # nothing lost, nothing doubled ...
    batch, ok = decode_batch("trades", pa.array([m.value() for m in got_msgs], pa.binary()))
    assert ok.all()
    got = batch.to_pandas()
    got["_p"] = [m.partition() for m in got_msgs]
    got["_o"] = [m.offset() for m in got_msgs]
    cols = field_names("trades")
    a = src[cols].astype(object).sort_values(cols, kind="stable").reset_index(drop=True)
    b = got[cols].astype(object).sort_values(cols, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)
    for sym, g in got.sort_values(["_p", "_o"]).groupby("symbol", sort=False):  # ... in file order per key
        assert g["_p"].nunique() == 1
        assert g["ts"].tolist() == src.loc[src["symbol"] == sym, "ts"].tolist()
