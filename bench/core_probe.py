"""What the engine-core probes share (``bench/cow_probe.py``, ``bench/growth_probe.py``): the
live benchmark's workload as arguments, and the engine core built over it -- the driver's decode
path and state, no Spark, no I/O."""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.engine_bench import make_events, make_mixed_rules, subscribed_core


def add_workload_args(ap: argparse.ArgumentParser, *, keys: int, stream: str) -> None:
    """``--rules --keys --stream --rate --batch``: the live run's mix, rate and batch size."""
    ap.add_argument("--rules", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=keys)
    ap.add_argument("--stream", choices=["trades", "packets"], default=stream)
    ap.add_argument("--rate", type=float, default=50_000.0)
    ap.add_argument("--batch", type=int, default=25_000, help="events per batch (the live run's)")


def build_core(a: argparse.Namespace, events: int) -> tuple[Any, list[bytes]]:
    """The engine core subscribed to ``a.rules`` rules of the live mix over ``events`` events of
    ``a.stream`` (``a.keys`` keys at ``a.rate``), its collector tuned and its state frozen as the
    engine's; and the events' Avro messages (feed them with ``engine_bench.record_table``)."""
    from engine.runtime.gc_tuning import freeze_state, tune_gc
    from tidewatch.settings import get_settings
    from tidewatch.wire.avro import encode_batch

    settings = get_settings()
    cols = make_events(a.stream, events, a.keys, a.rate, int(time.time() * 1000) - 600_000, seed=3)
    texts = make_mixed_rules(a.rules, a.stream, cols, events / a.rate)
    msgs = encode_batch(a.stream, cols).messages()
    tune_gc(settings.engine_gc_threshold)
    core = subscribed_core(settings, texts, allowed_lateness_ms=500)
    freeze_state()
    return core, msgs
