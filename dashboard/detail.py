"""Key detail: the aggregates a rule uses, for one key, over time -- from the raw stream.

:func:`aggregate_series` is pure NumPy: given the key's events (columns of its stream) and
one aggregate of a compiled plan, it evaluates the aggregate at lookup times
``tau`` exactly as RULES.md defines it (WHERE and FILTER applied first; time windows
``(tau - n, tau - m]``; ROWS windows = the last n events with ``ts <= tau``; empty set:
COUNT = SUM = 0, the others NULL).  Work is per lookup time (prefix sums for COUNT / SUM /
AVG, slices for the rest), never per event in Python.

:func:`read_recent` reads the key's recent events from Kafka (the dashboard never talks
to Spark): every partition of the stream's topic from the offset of ``now - lookback``
(``offsets_for_times``) up to its end when the read started, bounded by
``settings.dashboard_detail_max_messages`` -- the NEWEST records within that bound, read in
rounds from the end back, so a capped or timed-out read keeps the latest events and says from
when on it is complete (charts mark the points computed from part of their window); records are filtered by the Kafka message key
when the rule's key is the topic's key (trades: ``symbol``; packets:
``settings.packets_key``), else after decoding.  Each read uses a consumer of its own, closed
at the end, so nothing is left stuck by a broker restart: while the broker is down a read
raises :class:`KafkaUnavailable` (a message for the page) within about ``timeout_s`` / 4, and
the first read after it is back works again.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from dashboard.errors import DashboardError
from engine.evaluation.batches import BatchView
from engine.evaluation.key_series import chart_times as lookup_times
from subscriptions import rule_ast as A
from subscriptions.compiler import AggSpec, Plan
from tidewatch.kafka.client import client_config
from tidewatch.settings import Settings


class KafkaUnavailable(DashboardError, RuntimeError):
    """Kafka did not answer a read of the stream; ``str()`` is a message fit for the page."""


def aggregate_series(stream: str, cols: dict[str, np.ndarray], agg: AggSpec, taus: np.ndarray) -> np.ndarray:
    """The value of ``agg`` at each lookup time (float; NaN for NULL)."""
    taus = np.asarray(taus, np.int64)
    ts_all = np.asarray(cols["ts"], np.int64)
    order = np.argsort(ts_all, kind="stable")  # ties keep arrival order (FIRST / LAST)
    sorted_cols = {k: np.asarray(v)[order] for k, v in cols.items()}
    mask = BatchView(stream, sorted_cols).mask(agg.predicate)
    idx = np.arange(len(order)) if mask is None else np.flatnonzero(mask)
    t = sorted_cols["ts"].astype(np.int64)[idx]
    w = agg.window
    if isinstance(w, A.TimeWindow):
        lo = np.searchsorted(t, taus - w.start_ms, side="right")
        hi = np.searchsorted(t, taus - w.end_ms, side="right")
    else:
        hi = np.searchsorted(t, taus, side="right")
        lo = np.maximum(hi - w.n, 0)
    count = (hi - lo).astype(np.float64)
    if agg.func == "COUNT":
        return count
    raw = sorted_cols[str(agg.field)][idx]
    if agg.func == "DISTINCT":
        codes = pd.factorize(raw)[0]
        return np.array([len(np.unique(codes[a:b])) for a, b in zip(lo, hi, strict=True)], np.float64)
    v = raw.astype(np.float64)
    out = np.full(len(taus), np.nan)
    has = hi > lo
    if agg.func in ("SUM", "AVG"):
        cs = np.concatenate([[0.0], np.cumsum(v)])
        s = cs[hi] - cs[lo]
        if agg.func == "SUM":
            return s
        out[has] = s[has] / count[has]
    elif agg.func == "FIRST":
        out[has] = v[lo[has]]
    elif agg.func == "LAST":
        out[has] = v[hi[has] - 1]
    elif agg.func in ("MIN", "MAX"):
        f = np.min if agg.func == "MIN" else np.max
        for i in np.flatnonzero(has):
            out[i] = f(v[lo[i] : hi[i]])
    else:
        raise ValueError(f"unknown aggregate {agg.func}")
    return out


def longest_window_ms(aggs: list[AggSpec]) -> int:
    """How far back the aggregates read (ROWS windows count as 0: they need the key's history)."""
    return max((a.window.start_ms for a in aggs if isinstance(a.window, A.TimeWindow)), default=0)


@dataclass(frozen=True)
class StreamRead:
    """What :func:`read_recent` got: the key's events as columns, whether the read stopped short
    of the lookback, and from which event time (ms) on it is complete (None: all of it)."""

    cols: dict[str, np.ndarray]
    truncated: bool
    complete_from_ms: int | None = None


def newest_starts(ranges: dict[int, tuple[int, int]], budget: int) -> dict[int, int]:
    """Where to start reading each partition's ``[lo, hi)`` so that at most ``budget`` records are
    read in all, the newest ones: each partition gives up its oldest records in proportion to
    its share of the total (partitions fill at about the same rate, so the cut falls at about
    the same time in each)."""
    total = sum(hi - lo for lo, hi in ranges.values())
    if total <= budget:
        return {p: lo for p, (lo, _hi) in ranges.items()}
    return {p: max(lo, hi - (budget * (hi - lo)) // total) for p, (lo, hi) in ranges.items()}


def chunks(starts: dict[int, int], ends: dict[int, int], rounds: int) -> list[dict[int, tuple[int, int]]]:
    """``[start, end)`` of each partition cut into ``rounds`` pieces, the newest pieces first (a
    read that runs out of time keeps the newest records, not the oldest)."""
    out: list[dict[int, tuple[int, int]]] = []
    for k in range(rounds):
        piece: dict[int, tuple[int, int]] = {}
        for p, lo in starts.items():
            hi = ends[p]
            n = hi - lo
            a, b = lo + (n * (rounds - k - 1)) // rounds, lo + (n * (rounds - k)) // rounds
            if b > a:
                piece[p] = (a, b)
        if piece:
            out.append(piece)
    return out


def _newest_ts(stream: str, values: list[bytes]) -> int | None:
    """The largest event time among a few records (None when none decodes)."""
    from engine.dead_letter import DeadLetters
    from engine.decode import decode_records

    if not values:
        return None
    n = len(values)
    table = pa.table(
        {
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "value": pa.array(values, pa.binary()),
        }
    )
    d = decode_records(stream, table, late_until=None, max_future_ms=10**12, dead=DeadLetters())
    ts = np.asarray(d.columns.get("ts", []), np.int64) if len(d) else np.zeros(0, np.int64)
    return int(ts.max()) if len(ts) else None


def recent_events(
    stream: str,
    key_field: str,
    key: str | None,
    lookback_ms: int,
    settings: Settings,
    timeout_s: float = 20.0,
) -> tuple[dict[str, np.ndarray], bool]:
    """The key's events (every key's when ``key`` is None) of the last ``lookback_ms`` from
    Kafka; ``(columns, truncated)`` (:func:`read_recent` without its completeness time)."""
    r = read_recent(stream, key_field, key, lookback_ms, settings, timeout_s)
    return r.cols, r.truncated


#: records per round of :func:`read_recent` (newest round first)
ROUND_RECORDS = 100_000


def read_recent(
    stream: str,
    key_field: str,
    key: str | None,
    lookback_ms: int,
    settings: Settings,
    timeout_s: float = 20.0,
) -> StreamRead:
    """The key's events (every key's when ``key`` is None) of the last ``lookback_ms`` from Kafka,
    the NEWEST first: each partition from ``offsets_for_times(now - lookback_ms)`` to its end
    when the read started, at most ``settings.dashboard_detail_max_messages`` records in all
    (:func:`newest_starts`), read in rounds from the newest back (:func:`chunks`) until done or
    ``timeout_s`` is spent.  When it stops short, ``complete_from_ms`` is the event time from
    which on every partition was read whole (the newest event time among the first records of
    the oldest rounds read whole; a partition's events arrive in about time order)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    from engine.dead_letter import DeadLetters
    from engine.decode import decode_records

    st = settings
    topic = st.topic_trades if stream == "trades" else st.topic_packets
    topic_key = "symbol" if stream == "trades" else st.packets_key
    by_kafka_key = key is not None and key_field == topic_key
    want = (key or "").encode()
    c = Consumer(
        {
            "bootstrap.servers": st.kafka_bootstrap,
            **client_config(st, "dashboard"),  # SASL/SCRAM in the scram mode
            "group.id": f"tidewatch-dashboard-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    parts: list[int] = []
    offs: list[int] = []
    vals: list[bytes] = []
    truncated = False
    # per partition: the oldest record of the oldest round read whole (its event time bounds
    # what was read completely)
    first_val: dict[int, bytes] = {}
    wait = max(1.0, timeout_s / 4)  # each metadata call; the read itself gets timeout_s
    try:
        try:
            meta = c.list_topics(topic, timeout=wait)
            tmeta = meta.topics.get(topic)
            if tmeta is None or (
                tmeta.error is not None and tmeta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            ):
                return StreamRead({}, False)
            if tmeta.error is not None:  # e.g. no leader yet, right after a broker restart
                raise KafkaException(tmeta.error)
            start_ms = int(time.time() * 1000) - lookback_ms
            tps = [TopicPartition(topic, p, start_ms) for p in sorted(tmeta.partitions)]
            found = c.offsets_for_times(tps, timeout=wait)
            ends = {
                p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=wait)[1]
                for p in tmeta.partitions
            }
        except KafkaException as exc:
            err = exc.args[0] if exc.args else exc
            reason = err.str() if isinstance(err, KafkaError) else str(err)
            raise KafkaUnavailable(
                f"Kafka ({st.kafka_bootstrap}) does not answer, so the {stream} stream cannot be read "
                f"now ({reason}). Try again in a moment."
            ) from exc
        ranges = {
            tp.partition: (tp.offset, ends[tp.partition])
            for tp in found
            if 0 <= tp.offset < ends[tp.partition]
        }
        if not ranges:
            return StreamRead({}, False)
        starts = newest_starts(ranges, st.dashboard_detail_max_messages)
        truncated = any(starts[p] > lo for p, (lo, _hi) in ranges.items())
        total = sum(ends[p] - starts[p] for p in starts)
        deadline = time.monotonic() + timeout_s
        for piece in chunks(starts, ends, max(1, -(-total // ROUND_RECORDS))):
            if time.monotonic() >= deadline:
                truncated = True
                break
            c.assign([TopicPartition(topic, p, a) for p, (a, _b) in piece.items()])
            todo = {p: b for p, (_a, b) in piece.items()}
            firsts = {p: a for p, (a, _b) in piece.items()}
            piece_first: dict[int, bytes] = {}
            while todo and time.monotonic() < deadline:
                for m in c.consume(num_messages=5000, timeout=0.5):
                    if m.error() is not None:
                        continue
                    p, o = m.partition(), m.offset()
                    if p is None or o is None or p not in todo or o >= todo[p]:
                        continue
                    value = m.value()
                    if o == firsts.get(p) and value is not None:
                        piece_first[p] = value
                    if o >= todo[p] - 1:
                        del todo[p]
                    if by_kafka_key and m.key() != want:
                        continue
                    if value is not None:
                        parts.append(p)
                        offs.append(o)
                        vals.append(value)
            if todo:  # out of time inside this round: what was read of it stays, it is not whole
                truncated = True
                break
            first_val.update(piece_first)
    finally:
        c.close()
    complete_from = _newest_ts(stream, list(first_val.values())) if truncated else None
    if not vals:
        return StreamRead({}, truncated, complete_from)
    table = pa.table(
        {
            "partition": pa.array(parts, pa.int32()),
            "offset": pa.array(offs, pa.int64()),
            "value": pa.array(vals, pa.binary()),
        }
    )
    d = decode_records(stream, table, late_until=None, max_future_ms=10**12, dead=DeadLetters())
    cols = d.columns
    if key is not None and not by_kafka_key and len(d):
        keep = np.asarray(cols[key_field]) == key
        cols = {k: np.asarray(v)[keep] for k, v in cols.items()}
    return StreamRead(cols, truncated, complete_from)


def detail_frames(
    stream: str,
    cols: dict[str, np.ndarray],
    aggs: list[AggSpec],
    span_ms: int,
    pane_ms: int,
    now_ms: int | None = None,
    complete_from_ms: int | None = None,
) -> dict[str, pd.DataFrame]:
    """For each aggregate text: a (time, value, window) frame over the last ``span_ms`` up to
    ``now_ms`` (default: the last event), at pane boundaries.  Running to *now* shows a key that
    went quiet: its windowed aggregates fall back as its events leave the windows.

    ``complete_from_ms`` (a read that stopped short, :class:`StreamRead`): a point whose time
    window reaches back before it is marked ``window = "partial"`` (computed from part of its
    window), the others ``"whole"``; a ROWS window is partial when it holds fewer than its n
    events."""
    if not cols or len(cols.get("ts", [])) == 0:
        return {}
    ts = np.asarray(cols["ts"], np.int64)
    t_to = int(ts.max()) if now_ms is None else max(int(now_ms), int(ts.max()))
    taus = lookup_times(max(int(ts.min()), t_to - span_ms), t_to, pane_ms)
    out: dict[str, pd.DataFrame] = {}
    when = pd.to_datetime(taus, unit="ms", utc=True)
    for a in aggs:
        vals = aggregate_series(stream, cols, a, taus)
        partial = np.zeros(len(taus), bool)
        if complete_from_ms is not None:
            w = a.window
            if isinstance(w, A.TimeWindow):
                partial = taus - w.start_ms < complete_from_ms
            else:
                partial = np.searchsorted(np.sort(ts), taus, side="right") < w.n
        window = np.where(partial, "partial", "whole")
        out[a.text] = pd.DataFrame({"time": when, "value": vals, "kind": "stream", "window": window})
    return out


def preview_keys(
    plan: Plan, cols: dict[str, np.ndarray], pane_ms: int, ci_p: int
) -> tuple[list[str], int | None]:
    """Keys satisfying ``plan`` at the last pane boundary of ``cols`` (all keys' recent events),
    evaluated by the backtest evaluator -- the engine's own code -- over those events
    (``ci_p``: its collective indexes' parameter, ``settings.ci_p``)."""
    from engine.evaluation.evaluator import Evaluator

    if not cols or len(cols.get("ts", [])) == 0:
        return [], None
    ts = np.asarray(cols["ts"])
    now = int(ts.max()) // pane_ms * pane_ms
    # like the engine: only events at or before the lookup time are applied, in ts order
    due = np.flatnonzero(ts <= now)
    due = due[np.argsort(ts[due], kind="stable")]
    ev = Evaluator(strategy="shared", ci_p=ci_p)
    ev.add_rule("preview", plan)
    if len(due):
        ev.apply(plan.stream, {k: np.asarray(v)[due] for k, v in cols.items()})
    return sorted(ev.lookup(now).get("preview", set())), now
