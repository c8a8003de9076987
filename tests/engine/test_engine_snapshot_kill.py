"""The engine's driver SIGKILLed (the driver alone, not its process group) while a forked child
writes its state snapshot: no process of the engine is left -- not the child, not Spark's JVM,
not Spark's Python workers (``engine_snapshot_fork``, the default; issue #20's condition for a
forked writer).  With one shard (``engine_shards`` = 1) the writer is forked by the shard's
Spark Python worker (engine.shards.processor), a grandchild of ``pyspark.daemon``: it must end
too, by the parent-death signal, once the JVM and its workers end."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.engine.support import (
    engine_env,
    kill_engine,
    make_scenario,
    produce,
    produce_rules,
    progress,
    start_engine,
)
from tests.engine.test_engine_integration import engine_settings, fresh_database, topics_of, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _snapshot_children(driver: psutil.Process) -> list[psutil.Process]:
    """The driver's children that are Python processes: its snapshot writers (Spark's JVM is
    ``java``; Spark's Python workers are the JVM's children, not the driver's)."""
    out = []
    for c in driver.children():
        try:
            if "java" not in c.name():
                out.append(c)
        except psutil.Error:  # ended meanwhile
            continue
    return out


def _shard_snapshot_writers(driver: psutil.Process) -> list[psutil.Process]:
    """The snapshot writers forked by the shards' Python workers: the children of the children
    of ``pyspark.daemon`` (the daemon forks the workers, a worker forks a writer)."""
    out = []
    for p in driver.children(recursive=True):
        try:
            if "pyspark.daemon" not in " ".join(p.cmdline()):
                continue
            parent = p.parent()
            grand = parent.parent() if parent is not None else None
            if grand is not None and "pyspark.daemon" in " ".join(grand.cmdline()):
                out.append(p)  # forked by a worker, itself forked by the daemon
        except psutil.Error:  # ended meanwhile
            continue
    return out


@pytest.mark.parametrize("shards", [0, 1])
def test_a_driver_killed_mid_snapshot_leaves_no_process(
    kafka_bootstrap: str, pg_url: str, tmp_path: Path, shards: int
) -> None:
    run = uuid.uuid4().hex[:8]
    s = engine_settings(run, tmp_path / "ckpt")
    db = fresh_database(pg_url)
    from engine.sinks.publish import ensure_topics

    ensure_topics(kafka_bootstrap, s)
    sc = make_scenario(n_trades=30000, n_packets=10000, seed=5)
    produce_rules(sc, kafka_bootstrap, s.topic_subscriptions)
    env = engine_env(s, kafka_bootstrap, db) | {
        "TIDEWATCH_SNAPSHOT_EVERY_BATCHES": "1",
        "TIDEWATCH_ENGINE_SHARDS": str(shards),
    }
    find = _shard_snapshot_writers if shards else _snapshot_children
    proc = start_engine(env, tmp_path / "engine.log", run)
    try:
        wait_for(lambda: progress(db)[0] >= 1, 180, "the engine's first batch (the rules)")
        produce(sc, kafka_bootstrap, topics_of(s))
        driver = psutil.Process(proc.pid)
        deadline = time.monotonic() + 180
        writers: list[psutil.Process] = []
        while not writers and time.monotonic() < deadline:
            writers = find(driver)
            time.sleep(0.005)
        assert writers, "no snapshot writer was seen in 180 s"
        every = driver.children(recursive=True)
        assert any("java" in p.name() for p in every), "Spark's JVM is not the driver's child"
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone
        proc.wait(30)
        _, alive = psutil.wait_procs(every, timeout=60)
        left = [(p.pid, p.name()) for p in alive]
        assert not left, f"processes of the killed engine still running: {left}"
    finally:
        kill_engine(proc)
