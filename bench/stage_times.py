"""Spark's stages per streaming micro-batch, from Spark's own event log: wall time, task time and
the executors' JVM CPU of each stage, matched to its batch by ``streaming.sql.batchId``.

Where a micro-batch's time goes between the stages Spark runs for it -- e.g. the sharded mode's
route stage (the Kafka read and ``mapInArrow``) and its shards' stage
(``transformWithStateInPandas``) -- which the engine's own log and the query's progress do not
split (docs/measurements/engine.md, "The sharded mode's start").  ``executorCpuTime`` is the
task threads' JVM CPU only: a Python worker's CPU is in the task's run time, not in it.  Run a
bench with Spark's event log on, then this on the log it wrote::

    TIDEWATCH_SPARK_EXTRA_CONF='{"spark.eventLog.enabled": "true", "spark.eventLog.dir": "file:///tmp/evlog"}' \\
        .venv/bin/python bench/engine_bench.py --live 40 ... --shards 2
    .venv/bin/python bench/stage_times.py /tmp/evlog --steady-from 10

A log file compressed by Spark (``.zstd``, ``.lz4``, ``.snappy``) is read through Arrow's codec of
that name; a directory is searched for its newest ``events_*`` / ``app-*`` file.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

#: Spark's event log codecs by file suffix -> Arrow's codec names
CODECS = {".zstd": "zstd", ".lz4": "lz4", ".snappy": "snappy"}


@dataclass(frozen=True)
class Stage:
    """One completed stage of an event log."""

    stage_id: int
    batch: int | None  #: the streaming micro-batch it ran for (None: a batch job)
    name: str
    tasks: int
    wall_ms: int  #: submission to completion
    run_ms: int  #: the tasks' run time, summed
    jvm_cpu_ms: float  #: the task threads' JVM CPU, summed


def log_file(path: Path) -> Path:
    """``path`` itself, or the newest event log file under it (Spark's v2 logs are directories)."""
    if path.is_file():
        return path
    files = [p for p in path.rglob("*") if p.is_file() and p.name.startswith(("events_", "app-", "local-"))]
    if not files:
        raise SystemExit(f"no Spark event log under {path}: run the bench with spark.eventLog.enabled")
    return max(files, key=lambda p: p.stat().st_mtime)


def lines(path: Path) -> Iterator[str]:
    """The JSON lines of an event log file, decompressed by its suffix."""
    codec = CODECS.get(path.suffix)
    if codec is None:
        with path.open(encoding="utf-8") as f:
            yield from f
        return
    with pa.CompressedInputStream(pa.OSFile(str(path)), codec) as f:
        yield from f.read().decode("utf-8").splitlines()


def stages(path: Path) -> list[Stage]:
    """The completed stages of the event log ``path``, in completion order."""
    batch_of: dict[int, int | None] = {}
    out: list[Stage] = []
    for ln in lines(path):
        e = json.loads(ln)
        ev = e.get("Event")
        if ev == "SparkListenerJobStart":
            b = (e.get("Properties") or {}).get("streaming.sql.batchId")
            for sid in e["Stage IDs"]:
                batch_of[int(sid)] = None if b is None else int(b)
        elif ev == "SparkListenerStageCompleted":
            si = e["Stage Info"]
            if "Completion Time" not in si or "Submission Time" not in si:
                continue
            acc = {a["Name"]: a.get("Value") for a in si.get("Accumulables", [])}
            out.append(
                Stage(
                    int(si["Stage ID"]),
                    batch_of.get(int(si["Stage ID"])),
                    str(si["Stage Name"]).split(" at ")[0],
                    int(si["Number of Tasks"]),
                    int(si["Completion Time"]) - int(si["Submission Time"]),
                    int(acc.get("internal.metrics.executorRunTime") or 0),
                    int(acc.get("internal.metrics.executorCpuTime") or 0) / 1e6,
                )
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path, help="an event log file, or the spark.eventLog.dir it is in")
    ap.add_argument("--batches", type=int, default=6, help="micro-batches listed one by one from the first")
    ap.add_argument("--steady-from", type=int, default=10, help="medians over the batches from this one on")
    a = ap.parse_args()
    path = log_file(a.log)
    got = stages(path)
    print(f"{path}: {len(got)} stages")
    for s in got:
        if s.batch is None or s.batch < a.batches:
            print(
                f"batch {'-' if s.batch is None else s.batch:>3} stage {s.stage_id:>3} {s.name:<28} "
                f"tasks {s.tasks:>2}  wall {s.wall_ms:>6} ms  run {s.run_ms:>6} ms  JVM CPU {s.jvm_cpu_ms:>6.0f} ms"
            )
    for name in sorted({s.name for s in got if s.batch is not None}):
        late = [s for s in got if s.name == name and s.batch is not None and s.batch >= a.steady_from]
        if late:
            print(
                f"{name}: batches {a.steady_from}+ ({len(late)} stages), median wall "
                f"{statistics.median(s.wall_ms for s in late):.0f} ms, run "
                f"{statistics.median(s.run_ms for s in late):.0f} ms, JVM CPU "
                f"{statistics.median(s.jvm_cpu_ms for s in late):.0f} ms"
            )


if __name__ == "__main__":
    main()
