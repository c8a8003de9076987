"""The engine's state snapshot: :mod:`engine.runtime.state_codec` against the pickle it replaced.

Builds an :class:`engine.core.EngineCore` the way ``bench/engine_bench.py --core`` does (the
pane-fed evaluator, ``--rules`` rules of :func:`bench.engine_bench.make_mixed_rules` plus COUNT
DISTINCT and ROWS rules, ``--events`` encoded records in batches of ``--max-offsets``), then
times, best of ``--repeat``: serializing the state (``EngineCore.to_bytes``; the old way: the
evaluator pickled with its algorithms' structures through their ``to_bytes``, then the whole
state pickled, protocol 5), its size, and restoring it (``from_bytes`` / ``pickle.loads``).
No services needed.

The two phases of the engine's snapshot side by side (:mod:`engine.runtime.state_capture`):
``EngineCore.capture`` -- what the evaluation thread does -- against ``Captured.finish`` plus
writing the pieces to a file (``atomic_write``, ``fsync``: what the writer thread does) and
against ``to_bytes`` (both phases and a join, the one-phase cost of before).  CPU seconds are
per thread (``time.thread_time``); "total" is both phases' CPU.  Then the GIL: the background
part run in a thread while the main thread runs a pure-Python loop, whose pace is reported as
a share of its pace alone (what an evaluation thread keeps while a snapshot is finished).

    .venv/bin/python bench/snapshot_bench.py --rules 2000 --events 300000
"""

from __future__ import annotations

import argparse
import functools
import io
import pickle
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine_bench import make_events, make_mixed_rules  # noqa: E402


class _OldPickler(pickle.Pickler):
    """The snapshot pickler the engine used before the state codec (for comparison only)."""

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if cls.__module__.startswith("engine.algorithms") and callable(getattr(cls, "from_bytes", None)):
            return (cls.from_bytes, (obj.to_bytes(),))
        return NotImplemented


def old_to_bytes(core: Any) -> bytes:
    buf = io.BytesIO()
    _OldPickler(buf, protocol=5).dump(core.evaluator)
    state = {k: v for k, v in vars(core).items() if k not in ("_compile", "evaluator")}
    return pickle.dumps({"evaluator": buf.getvalue(), **state}, protocol=5)


def old_from_bytes(data: bytes) -> Any:
    doc = pickle.loads(data)
    return pickle.loads(doc["evaluator"]), doc


def best(fn: Any, repeat: int, clock: Any = time.process_time) -> tuple[float, float, Any]:
    """Best wall and best CPU seconds of ``repeat`` calls (CPU: this process only -- the figure
    that does not depend on what else the machine runs -- or ``clock``'s, e.g.
    ``time.thread_time``: the calling thread's), and the result."""
    wall, cpu, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), clock()
        out = fn()
        wall.append(time.perf_counter() - t)
        cpu.append(clock() - c)
    return min(wall), min(cpu), out


def _spin(until: Any) -> tuple[int, float]:
    """Rounds of a small pure-Python loop until ``until()`` (the evaluation thread's stand-in)."""
    n, t = 0, time.perf_counter()
    while not until():
        sum(i * i for i in range(200))
        n += 1
    return n, time.perf_counter() - t


def gil_share(work: Any) -> tuple[float, float]:
    """(seconds of ``work`` in a thread, the main thread's loop pace meanwhile as a share of its
    pace alone for one second)."""
    deadline = time.perf_counter() + 1.0
    n0, s0 = _spin(lambda: time.perf_counter() >= deadline)
    th = threading.Thread(target=work)
    t = time.perf_counter()
    th.start()
    n1, s1 = _spin(lambda: not th.is_alive())
    th.join()
    return time.perf_counter() - t, (n1 / s1) / (n0 / s0)


def two_phases(core: Any, repeat: int) -> None:
    """Capture (calling thread) vs finish + write (writer thread) vs to_bytes, and the GIL.

    The capture reuses the compiled rules' nodes of the core's previous capture
    (``engine.runtime.state_capture.CaptureCache``): the first capture of a core walks them all
    ("first capture"); "capture" is the best of ``repeat`` after it; "after a rule change" is
    the capture after one more rule was added (an empty batch: the walk's numbering shifts,
    every reused node is renumbered)."""
    from engine.messages import SubscriptionChange
    from engine.runtime.snapshot_writer import atomic_write

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "000000000001.bin"
        dw, dc, data = best(core.to_bytes, repeat, time.thread_time)
        fw0, fc0, first = best(core.capture, 1, time.thread_time)
        first.finish()  # as the writer thread would, before the next capture
        del first
        cw, cc, cap = best(core.capture, repeat, time.thread_time)
        fw, fc, pieces = best(cap.finish, repeat, time.thread_time)
        ww, wc, _ = best(functools.partial(atomic_write, path, pieces), repeat, time.thread_time)
        assert path.stat().st_size == len(data)  # the same file (savez stamps its zip entries with the time)
        del pieces
        shares = [gil_share(lambda: atomic_write(path, cap.finish())) for _ in range(repeat)]
        text = "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST 30 SECONDS > 12345"
        core.process(
            core.last_batch + 1, {}, [SubscriptionChange("bench-extra", "upsert", "bench-extra", text)]
        )
        aw, ac, after = best(core.capture, 1, time.thread_time)
        assert sum(memoryview(p).nbytes for p in after.finish()) == len(core.to_bytes())
    print(
        f"two phases ({len(data) / 1e6:.1f} MB): to_bytes {dw:.3f} s wall / {dc:.3f} s CPU | capture "
        f"(evaluation thread) {cw:.3f} / {cc:.3f} s | finish {fw:.3f} / {fc:.3f} s + write and fsync "
        f"{ww:.3f} / {wc:.3f} s (writer thread) | total CPU capture + finish + write "
        f"{cc + fc + wc:.3f} s"
    )
    print(
        f"capture, evaluation thread, wall / CPU: first capture of the core {fw0:.3f} / {fc0:.3f} s | "
        f"best of {repeat} after it {cw:.3f} / {cc:.3f} s | after a rule change {aw:.3f} / {ac:.3f} s"
    )
    print(
        "GIL: finish + write in a thread while a pure-Python loop runs in the main thread (each "
        "run: its wall seconds, the loop's pace as a share of its pace alone): "
        + ", ".join(f"{w:.3f} s {sh:.0%}" for w, sh in shares)
    )


def build_core(a: argparse.Namespace) -> Any:
    """The engine core of the benchmark's arguments (see the module's docstring)."""
    import pyarrow as pa

    from engine.core import EngineCore
    from engine.messages import SubscriptionChange
    from engine.rule_evaluator import make_evaluator, rule_compiler
    from tidewatch.settings import get_settings
    from tidewatch.wire.avro import encode_batch

    settings = get_settings()
    stream = "packets"
    cols = make_events(stream, a.events, a.keys, a.rate, int(time.time() * 1000) - 60_000, seed=3)
    texts = make_mixed_rules(a.rules, stream, cols, a.events / a.rate)
    texts += [
        "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST 60 SECONDS > 40",
        "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST 100 ROWS > 90000",
    ]
    msgs = encode_batch(stream, cols).messages()
    core = EngineCore(
        pane_ms=settings.pane_ms,
        allowed_lateness_ms=2000,
        max_future_ms=10**12,
        evaluator_factory=lambda: make_evaluator(settings),
        compile_rule=rule_compiler(settings),
    )
    core.process(0, {}, [SubscriptionChange(f"m{i}", "upsert", f"m{i}", x) for i, x in enumerate(texts)])
    n = len(msgs)
    t = time.perf_counter()
    for b, lo in enumerate(range(0, n, a.max_offsets), start=1):
        hi = min(n, lo + a.max_offsets)
        tbl = pa.table(
            {
                "partition": pa.array(np.zeros(hi - lo, np.int32)),
                "offset": pa.array(np.arange(lo, hi, dtype=np.int64)),
                "value": pa.array(msgs[lo:hi], pa.binary()),
            }
        )
        core.process(b, {stream: tbl}, [])
    print(
        f"state: {len(texts):,} rules over {n:,} {stream} events ({a.keys:,} keys) built in "
        f"{time.perf_counter() - t:.0f} s; state_nbytes {core.state_nbytes() / 1e6:.0f} MB, "
        f"{core.pending_events:,} events pending",
        flush=True,
    )
    return core


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", type=int, default=2000)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--keys", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=2000.0, help="events/s of event time")
    ap.add_argument("--max-offsets", type=int, default=20_000, help="records per batch")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-pickle", action="store_true", help="only the codec: no pickle, no restore")
    a = ap.parse_args()

    from engine.core import EngineCore
    from engine.rule_evaluator import rule_compiler
    from tidewatch.settings import get_settings

    core = build_core(a)
    settings = get_settings()
    EngineCore.from_bytes(core.to_bytes(), rule_compiler(settings))  # warm up (compile / initialize)
    two_phases(core, a.repeat)
    if a.no_pickle:
        print("command:", " ".join(sys.argv))
        return
    old_to_bytes(core)
    s_new, c_new, new = best(core.to_bytes, a.repeat)
    r_new, rc_new, _ = best(lambda: EngineCore.from_bytes(new, rule_compiler(settings)), a.repeat)
    s_old, c_old, old = best(lambda: old_to_bytes(core), a.repeat)
    r_old, rc_old, _ = best(lambda: old_from_bytes(old), a.repeat)
    for name, size, s, c, r, rc in (
        ("state codec", len(new), s_new, c_new, r_new, rc_new),
        ("old pickle ", len(old), s_old, c_old, r_old, rc_old),
    ):
        print(
            f"{name}: {size / 1e6:.1f} MB; serialize {s:.3f} s wall / {c:.3f} s CPU "
            f"({size / 1e6 / c:.0f} MB/s); restore {r:.3f} s wall / {rc:.3f} s CPU"
        )
    print("command:", " ".join(sys.argv))


if __name__ == "__main__":
    main()
