"""Today's driver path on a batch of Kafka records: the oracle of the executor path.

What ``EngineApp`` / ``EngineCore`` do with a batch's records in the driver, given the same
:class:`~engine.executors.preagg.BatchParams`: split by topic, :func:`engine.decode.decode_records`
per event stream (``late`` against ``late_until``, dead letters with the batch-start
``watermark``), then :func:`engine.evaluation.panes.aggregate` of each stream's valid events for
every key spec, predicates evaluated by the evaluator's ``BatchView`` (what
``Evaluator.pane_spec`` gives).  Used by the tests and ``bench/preagg_bench.py``; the engine
itself does not call it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from engine.dead_letter import DeadLetters
from engine.decode import Decoded, decode_records, empty
from engine.evaluation.panes import PaneRows, PaneSpec, aggregate
from engine.executors.preagg import BatchParams, _batch_view, column_sets


@dataclass
class DriverBatch:
    decoded: dict[str, Decoded]  # stream -> valid, not-late events (arrival order)
    dead: DeadLetters
    panes: dict[tuple[str, str], PaneRows]  # (stream, key field) -> pane rows


def split_topics(records: pa.Table, params: BatchParams) -> dict[str, pa.Table]:
    """Each event stream's records (empty when none)."""
    out = {}
    for stream, topic in params.topics:
        if "topic" not in records.column_names:
            out[stream] = records
            continue
        mask = pc.equal(records.column("topic"), topic)
        out[stream] = records.filter(mask)
    return out


def decode(records: pa.Table, params: BatchParams) -> tuple[dict[str, Decoded], DeadLetters]:
    """Decode + validate each stream's records as the driver does (``EngineCore.process``)."""
    dead = DeadLetters()
    decoded = {}
    for stream, recs in split_topics(records, params).items():
        decoded[stream] = (
            decode_records(
                stream,
                recs,
                late_until=params.late_until,
                max_future_ms=params.max_future_ms,
                dead=dead,
                watermark=params.watermark,
            )
            if recs.num_rows
            else empty(stream)
        )
    return decoded, dead


def pane_rows(decoded: dict[str, Decoded], params: BatchParams) -> dict[tuple[str, str], PaneRows]:
    """``aggregate`` of each stream's events for every key spec of ``params``."""
    out = {}
    views = {s: _batch_view()(s, d.columns) for s, d in decoded.items()}
    for ks in params.panes:
        d = decoded.get(ks.stream) or empty(ks.stream)
        view = views.get(ks.stream) or _batch_view()(ks.stream, d.columns)
        out[(ks.stream, ks.key)] = aggregate(
            d.columns, PaneSpec(ks.key, column_sets(ks, view.mask)), params.pane_ms
        )
    return out


def driver_path(records: pa.Table, params: BatchParams) -> DriverBatch:
    """Decode, dead letters and pane rows of ``records``, all in this process."""
    decoded, dead = decode(records, params)
    return DriverBatch(decoded, dead, pane_rows(decoded, params))
