"""The engine's state snapshot: :mod:`engine.runtime.state_codec` against the pickle it replaced.

Builds an :class:`engine.core.EngineCore` the way ``bench/engine_bench.py --core`` does (the
pane-fed evaluator, ``--rules`` rules of :func:`bench.engine_bench.make_mixed_rules` plus COUNT
DISTINCT and ROWS rules, ``--events`` encoded records in batches of ``--max-offsets``), then
times, best of ``--repeat``: serializing the state (``EngineCore.to_bytes``; the old way: the
evaluator pickled with its algorithms' structures through their ``to_bytes``, then the whole
state pickled, protocol 5), its size, and restoring it (``from_bytes`` / ``pickle.loads``).
No services needed.

    .venv/bin/python bench/snapshot_bench.py --rules 2000 --events 300000
"""

from __future__ import annotations

import argparse
import io
import pickle
import sys
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


def best(fn: Any, repeat: int) -> tuple[float, float, Any]:
    """Best wall and best CPU seconds of ``repeat`` calls (CPU: this process only -- the figure
    that does not depend on what else the machine runs), and the result."""
    wall, cpu, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", type=int, default=2000)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--keys", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=2000.0, help="events/s of event time")
    ap.add_argument("--max-offsets", type=int, default=20_000, help="records per batch")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    import pyarrow as pa

    from engine.core import EngineCore, make_evaluator, rule_compiler
    from engine.messages import SubscriptionChange
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
    old_to_bytes(core)  # warm up both (first calls compile / initialize)
    EngineCore.from_bytes(core.to_bytes(), rule_compiler(settings))
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
