"""Where the sharded engine's driver spends its CPU per micro-batch (issue #19).

Runs ``bench/engine_bench.py`` (its arguments passed on unchanged, e.g. ``--live 120 --shards 2``)
in this process with the steps of :meth:`engine.shards.engine.ShardedEngine.on_batch` timed by
``time.thread_time()`` around each call: the whole ``on_batch``, the shards' rows decoded
(``decode_output``), merged (``merge_outputs``), the check of the last committed batch
(``Store.last_committed``), the delivery (``ShardedEngine._deliver``, of which
``Delivery.deliver``: ``Store.commit``, the Kafka transaction's ``Publisher.commit``), the Kafka
records produced meanwhile (``Publisher.begin`` on the producing thread, which waits for
``Publisher._produce`` on a short-lived thread of its own; of that, ``encode_alerts``: the Avro
records) and the expansion behind it (``Store.project``, its own thread).  What ``on_batch``
takes beyond its timed parts is Spark's job for the shards' rows and ``toArrow``, the metrics and
the log line.  At exit prints, per step, CPU seconds, calls and CPU ms per call, and the CPU
seconds of the threads alive at the 2-s samples, by name (librdkafka's among them; a thread that
lives between two samples is missed: hence the timed ``_produce``)::

    TIDEWATCH_SPARK_MASTER="local-cluster[2,1,3072]" .venv/bin/python bench/shard_batch_probe.py \\
        --live 120 --rules 10 --keys 100000 --stream trades --rate 50000 --lateness-ms 500 \\
        --trigger 0.5 --max-offsets 200000 --snapshot-every 50 --shards 2 --verbose

(the services of ``tidewatch up --services-only`` running, as for the engine bench).
"""

from __future__ import annotations

import atexit
import collections
import re
import runpy
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engine.shards.engine as sharded  # noqa: E402
from engine.sinks import publish  # noqa: E402
from engine.sinks.deliver import Delivery  # noqa: E402
from engine.sinks.publish import Publisher  # noqa: E402
from engine.sinks.store import Store  # noqa: E402

cpu: dict[str, float] = collections.defaultdict(float)
calls: collections.Counter[str] = collections.Counter()


def timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its calling thread's CPU time to ``label``."""
    fn: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            cpu[label] += time.thread_time() - t
            calls[label] += 1

    setattr(owner, name, wrapper)


#: per OS thread of this process, (its name, the CPU seconds it had used when last seen)
threads: dict[int, tuple[str, float]] = {}


def sample_threads(every_s: float = 2.0) -> None:
    """Note every thread's name and CPU (psutil's user + system time; the name Python gave it,
    else the kernel's, ``/proc/self/task/<id>/comm``) every ``every_s``: threads that end (a
    closed producer's) keep their last figure."""
    me = psutil.Process()
    while True:
        names = {t.native_id: t.name for t in threading.enumerate()}
        for t in me.threads():
            if t.id not in names:
                try:
                    names[t.id] = Path(f"/proc/self/task/{t.id}/comm").read_text().strip()
                except OSError:
                    continue
            threads[t.id] = (names[t.id], t.user_time + t.system_time)
        time.sleep(every_s)


def report() -> None:
    for label, s in sorted(cpu.items(), key=lambda kv: -kv[1]):
        n = calls[label]
        print(
            f"step {label}: {s:.3f} CPU-s over {n} calls, {s / max(n, 1) * 1000:.2f} CPU-ms each", flush=True
        )
    by_name: dict[str, float] = collections.defaultdict(float)
    for name, sec in threads.values():
        by_name[re.sub(r"[-_ ]?\d+$", "", name)] += sec
    print("threads (CPU-s from the process's start, by name, numbers dropped): " + ", ".join(
        f"{n} {s:.2f}" for n, s in sorted(by_name.items(), key=lambda kv: -kv[1])[:14]), flush=True)  # fmt: skip


def main() -> None:
    timed(sharded.ShardedEngine, "on_batch", "on_batch")
    timed(sharded, "decode_output", "decode_output")  # as the module calls them
    timed(sharded, "merge_outputs", "merge_outputs")
    timed(Store, "last_committed", "Store.last_committed")
    timed(Store, "commit", "Store.commit")
    timed(Store, "project", "Store.project (expansion thread)")
    timed(Delivery, "deliver", "Delivery.deliver")
    timed(Publisher, "commit", "Publisher.commit")
    timed(Publisher, "begin", "Publisher.begin (producing thread)")
    timed(Publisher, "_produce", "Publisher._produce (a tidewatch-kafka thread)")
    timed(publish, "encode_alerts", "encode_alerts (in _produce)")
    timed(sharded.ShardedEngine, "_deliver", "ShardedEngine._deliver")
    atexit.register(report)
    threading.Thread(target=sample_threads, name="probe-sampler", daemon=True).start()
    sys.argv = [str(ROOT / "bench" / "engine_bench.py"), *sys.argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
