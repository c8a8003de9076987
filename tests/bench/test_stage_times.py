"""``bench/stage_times.py`` on a small event log written here, plain and zstd-compressed as Spark
writes it: each stage matched to its micro-batch (a batch job's to none), its wall time, task time
and JVM CPU read. No services."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from bench.stage_times import log_file, stages


def _events() -> list[dict[str, object]]:
    def job(job_id: int, stage_ids: list[int], batch: str | None) -> dict[str, object]:
        props = {"spark.job.description": "x"} | ({"streaming.sql.batchId": batch} if batch else {})
        return {
            "Event": "SparkListenerJobStart",
            "Job ID": job_id,
            "Stage IDs": stage_ids,
            "Properties": props,
        }

    def done(stage_id: int, name: str, t0: int, t1: int, run: int, cpu_ns: int) -> dict[str, object]:
        return {
            "Event": "SparkListenerStageCompleted",
            "Stage Info": {
                "Stage ID": stage_id,
                "Stage Name": f"{name} at NativeMethodAccessorImpl.java:0",
                "Number of Tasks": 2,
                "Submission Time": t0,
                "Completion Time": t1,
                "Accumulables": [
                    {"Name": "internal.metrics.executorRunTime", "Value": run},
                    {"Name": "internal.metrics.executorCpuTime", "Value": cpu_ns},
                ],
            },
        }

    return [
        {"Event": "SparkListenerApplicationStart"},
        job(0, [0], None),
        done(0, "toArrow", 1_000, 1_400, 700, 30_000_000),
        job(1, [1, 2], "7"),
        done(1, "run", 2_000, 2_500, 900, 200_000_000),
        done(2, "call", 2_500, 3_300, 1_300, 115_000_000),
        {"Event": "SparkListenerStageCompleted", "Stage Info": {"Stage ID": 3, "Stage Name": "x"}},  # failed
    ]


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_stages_are_matched_to_their_batches(tmp_path: Path, codec: str | None) -> None:
    text = "\n".join(json.dumps(e) for e in _events()) + "\n"
    d = tmp_path / "eventlog_v2_app-1"
    d.mkdir()
    path = d / ("events_1_app-1" + (f".{codec}" if codec else ""))
    if codec:
        with pa.CompressedOutputStream(pa.OSFile(str(path), "wb"), codec) as f:
            f.write(text.encode())
    else:
        path.write_text(text)
    assert log_file(tmp_path) == path
    got = stages(log_file(tmp_path))
    assert [(s.stage_id, s.batch, s.name) for s in got] == [
        (0, None, "toArrow"),
        (1, 7, "run"),
        (2, 7, "call"),
    ]
    assert [(s.wall_ms, s.run_ms, s.jvm_cpu_ms) for s in got] == [
        (400, 700, 30.0),
        (500, 900, 200.0),
        (800, 1300, 115.0),
    ]


def test_a_folder_without_a_log_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="spark.eventLog.enabled"):
        log_file(tmp_path)
