"""Kafka-shaped record batches with good and bad records, split into tasks, and the comparisons
between the executor path (:mod:`engine.executors`) and today's driver path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from hypothesis import strategies as st

from engine.dead_letter import DeadLetters
from engine.decode import Decoded
from engine.evaluation.panes import PaneRows
from engine.executors.preagg import BatchParams, KeySpec, SetSpec, batch_params
from subscriptions import rule_ast as A
from tidewatch.wire.avro import encode_batch

G = 1000
BASE = 1_700_000_000_000
KAFKA_TS = BASE + 5_000  # every record's Kafka timestamp
MAX_FUTURE = 2_000  # ts > BASE + 7_000 is "future"
TOPICS = {"trades": "tw-trades", "packets": "tw-packets"}
SUBS = "tw-subscriptions"

#: ts offsets from BASE: pane edges and their neighbours, so ties and boundaries are frequent
TS = [0, 1, 2, 500, 999, 1000, 1001, 1500, 1999, 2000, 2001, 2999, 3000, 3001, 4500, 6999]
#: prices with exact-sum traps (0.1 + 0.2, a value next to 2.5, a large one), ties and zeros
PRICES = [0.1, 0.2, 0.3, 2.5, 2.5000000000000004, 3.0, 1e15, 7.25, 0.0]
SYMBOLS = ["AAA", "BBB", "CCC", "DDD"]
IPS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]

TRADE_SPEC = KeySpec(
    "trades",
    "symbol",
    (
        SetSpec(
            "all",
            None,
            sums=("price", "size"),
            minmax=("price",),
            firstlast=("price", "size"),
            distinct=("side", "size"),
        ),
        SetSpec(
            "side = 'ASK'",
            A.RowCmp("side", "=", "ASK"),
            sums=("size",),
            minmax=("price", "size"),
            firstlast=("price",),
            distinct=("exchange", "price"),
        ),
        SetSpec("size > 3", A.RowCmp("size", ">", 3.0), sums=("price",)),  # a set with no FIRST/LAST
        SetSpec("count only", A.RowIn("symbol", ("AAA", "CCC"))),
    ),
)
PACKET_SPECS = (
    KeySpec(
        "packets",
        "src_ip",
        (SetSpec("all", None, sums=("length",), firstlast=("length",), distinct=("dst_port",)),),
    ),
    KeySpec(
        "packets",
        "dst_ip",
        (
            SetSpec(
                "protocol = 'TCP'",
                A.RowCmp("protocol", "=", "TCP"),
                sums=("length", "src_port"),
                minmax=("length",),
                firstlast=("dst_port",),
                distinct=("protocol", "src_ip"),
            ),
        ),
    ),
)

#: a record: (topic role, partition, ts offset index, key index, price index, size, side, badness)
BAD = {0: "undecodable", 1: "truncated", 2: "negative size", 3: "NaN price", 4: "empty key", 5: "future"}


def record_strategy() -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(
        st.sampled_from(["trades", "trades", "trades", "packets", "subs"]),
        st.integers(0, 2),
        st.integers(0, len(TS) - 1),
        st.integers(0, 3),
        st.integers(0, len(PRICES) - 1),
        st.integers(0, 6),
        st.booleans(),
        st.integers(0, 24),  # 0-5: a bad record of BAD's kind; the rest good
    )


def _trade(ts: int, key: int, price: float, size: int, ask: bool, bad: int) -> dict[str, Any]:
    return {
        "symbol": "" if bad == 4 else SYMBOLS[key],
        "ts": ts + 10_000_000 if bad == 5 else ts,
        "price": float("nan") if bad == 3 else price,
        "size": -size - 1 if bad == 2 else size,
        "side": "ASK" if ask else "BID",
        "exchange": ["NYSE", "NASDAQ"][size % 2],
    }


def _packet(ts: int, key: int, price: float, size: int, ask: bool, bad: int) -> dict[str, Any]:
    return {
        "ts": ts + 10_000_000 if bad == 5 else ts,
        "src_ip": "" if bad == 4 else IPS[key % 3],
        "dst_ip": IPS[(key + size) % 3],
        "src_port": 1000 + size,
        "dst_port": 80 if ask else 443,
        "protocol": "TCP" if size % 3 else "UDP",
        "length": -size - 1 if bad == 2 else int(price * 4) % 1500 + size,
        "tcp_flags": "S",
    }


def kafka_table(
    recs: list[tuple[Any, ...]], first_offset: dict[tuple[str, int], int] | None = None, seed: int = 0
) -> pa.Table:
    """The Kafka rows of ``recs`` (offsets consecutive per (topic, partition) in list order,
    continuing from ``first_offset``), rows shuffled: a source interleaves partitions."""
    nxt = dict(first_offset or {})
    rows: list[tuple[str, int, int, bytes | None, bytes | None]] = []
    for role, part, ts_i, key, price_i, size, ask, bad in recs:
        topic = SUBS if role == "subs" else TOPICS[role]
        off = nxt.get((topic, part), 0)
        nxt[(topic, part)] = off + 1
        ts = BASE + TS[ts_i]
        if role == "subs":
            rows.append(
                (topic, part, off, f"sub{key}".encode(), f'{{"id": "sub{key}", "op": "pause"}}'.encode())
            )
            continue
        rec = (_trade if role == "trades" else _packet)(ts, key, PRICES[price_i], size, ask, bad)
        value = encode_batch(role, {k: [v] for k, v in rec.items()}).messages()[0]
        if bad == 0:
            value = b"\x00garbage" + value[5:]
        elif bad == 1:
            value = value[:-2]
        rows.append((topic, part, off, f"k{key}".encode(), value))
    order = np.random.default_rng(seed).permutation(len(rows))
    rows = [rows[i] for i in order]
    return kafka_rows(rows)


def next_offsets(tbl: pa.Table) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for t, p, o in zip(
        tbl.column("topic").to_pylist(),
        tbl.column("partition").to_pylist(),
        tbl.column("offset").to_pylist(),
        strict=True,
    ):
        out[(t, p)] = max(out.get((t, p), 0), o + 1)
    return out


def params(
    late_until: int | None = None,
    watermark: int | None = None,
    raw: tuple[str, ...] = (),
    chunk_rows: int = 2_000_000,
) -> BatchParams:
    return batch_params(
        pane_ms=G,
        topics=TOPICS,
        max_future_ms=MAX_FUTURE,
        panes=(TRADE_SPEC, *PACKET_SPECS),
        late_until=late_until,
        watermark=watermark,
        raw_streams=raw,
        chunk_rows=chunk_rows,
    )


def tasks(tbl: pa.Table, assign: np.ndarray, pieces: int) -> list[list[pa.RecordBatch]]:
    """The rows of ``tbl`` by task (``assign[i]``: row i's task), each task's rows cut into up to
    ``pieces`` record batches (mapInArrow's iterator)."""
    out = []
    for k in range(int(assign.max()) + 1 if len(assign) else 0):
        sub = tbl.filter(pa.array(assign == k))
        if not sub.num_rows:
            continue
        cuts = np.linspace(0, sub.num_rows, min(pieces, sub.num_rows) + 1).astype(int)
        out.append(
            [
                sub.slice(a, b - a).combine_chunks().to_batches()[0]
                for a, b in zip(cuts[:-1], cuts[1:], strict=True)
                if b > a
            ]
        )
    return out


# ---------------------------------------------------------------- comparisons
def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float64).view(np.int64)


def assert_pane_rows_equal(got: PaneRows, want: PaneRows, label: str = "") -> None:
    """Same rows in the same order, same values (bits; MIN/MAX by value, COUNT DISTINCT pairs
    as a multiset per row -- see engine.executors.merge); the keys' codes, where ``got`` carries
    them, exactly those of ``pd.factorize(got.keys)``."""
    assert list(got.keys) == list(want.keys), label
    if got.key_codes is not None:
        codes, uniques = pd.factorize(np.asarray(got.keys, dtype=object), sort=False)
        np.testing.assert_array_equal(got.key_codes[0], codes, f"{label} key codes")
        assert got.key_codes[0].dtype == np.int64, label
        assert list(got.key_codes[1]) == list(uniques), f"{label} key uniques"
    np.testing.assert_array_equal(got.pane, want.pane, label)
    np.testing.assert_array_equal(got.total, want.total, label)
    assert set(got.sets) == set(want.sets), label
    for name, w in want.sets.items():
        g = got.sets[name]
        lab = f"{label} set {name!r}"
        np.testing.assert_array_equal(g.count, w.count, lab)
        assert set(g.sums) == set(w.sums) and set(g.exact) == set(w.exact), lab
        for f in w.sums:
            np.testing.assert_array_equal(_bits(g.sums[f]), _bits(w.sums[f]), f"{lab} SUM({f})")
            np.testing.assert_array_equal(g.exact[f][0], w.exact[f][0], f"{lab} exact SUM({f}) hi")
            np.testing.assert_array_equal(g.exact[f][1], w.exact[f][1], f"{lab} exact SUM({f}) lo")
        for name_, gv, wv in (("MIN", g.mins, w.mins), ("MAX", g.maxs, w.maxs)):
            assert set(gv) == set(wv), lab
            for f in wv:
                np.testing.assert_array_equal(gv[f], wv[f], f"{lab} {name_}({f})")  # NaN == NaN here
        for name_, gv, wv in (("FIRST", g.first, w.first), ("LAST", g.last, w.last)):
            assert set(gv) == set(wv), lab
            for f in wv:
                np.testing.assert_array_equal(_bits(gv[f]), _bits(wv[f]), f"{lab} {name_}({f})")
        assert set(g.distinct) == set(w.distinct), lab
        for f in w.distinct:
            assert _pairs(g.distinct[f]) == _pairs(w.distinct[f]), f"{lab} DISTINCT({f})"


def _pairs(d: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[tuple[int, Any, int]]:
    r, v, m = d
    return sorted(zip(np.asarray(r).tolist(), np.asarray(v).tolist(), np.asarray(m).tolist(), strict=True))


def assert_dead_equal(got: DeadLetters, want: DeadLetters) -> None:
    for name in want.__dataclass_fields__:
        assert getattr(got, name) == getattr(want, name), name


def assert_decoded_equal(got: Decoded, want: Decoded) -> None:
    np.testing.assert_array_equal(got.partition, want.partition)
    np.testing.assert_array_equal(got.offset, want.offset)
    assert list(got.columns) == list(want.columns)
    for k, v in want.columns.items():
        assert got.columns[k].dtype == v.dtype, k
        if v.dtype.kind == "f":
            np.testing.assert_array_equal(_bits(got.columns[k]), _bits(v), k)
        else:
            np.testing.assert_array_equal(got.columns[k], v, k)


@dataclass
class Expected:
    """What the driver derives from the raw records besides pane rows (per batch)."""

    events: dict[str, int]
    part_max: dict[tuple[str, int], int]
    ts_min: dict[str, int]
    offsets: dict[str, dict[str, list[int]]]


def expected(tbl: pa.Table, decoded: dict[str, Decoded]) -> Expected:
    events = {s: len(d) for s, d in decoded.items()}
    part_max: dict[tuple[str, int], int] = {}
    ts_min: dict[str, int] = {}
    for s, d in decoded.items():
        for p, t in zip(d.partition.tolist(), d.ts.tolist(), strict=True):
            part_max[(s, p)] = max(part_max.get((s, p), t), t)
            ts_min[s] = min(ts_min.get(s, t), t)
    offsets: dict[str, dict[str, list[int]]] = {}
    for t, p, o in zip(
        tbl.column("topic").to_pylist(),
        tbl.column("partition").to_pylist(),
        tbl.column("offset").to_pylist(),
        strict=True,
    ):
        lo, hi = offsets.setdefault(t, {}).get(str(p), [o, o])
        offsets[t][str(p)] = [min(lo, o), max(hi, o)]
    return Expected(events, part_max, ts_min, offsets)


def kafka_rows(rows: Sequence[tuple[str, int, int, bytes | None, bytes | None]]) -> pa.Table:
    """Kafka-shaped records (topic, partition, offset, key, value), as Spark's Kafka source gives them."""
    return pa.table(
        {
            "topic": pa.array([r[0] for r in rows], pa.string()),
            "partition": pa.array([r[1] for r in rows], pa.int32()),
            "offset": pa.array([r[2] for r in rows], pa.int64()),
            "timestamp": pa.array([KAFKA_TS * 1000] * len(rows), pa.timestamp("us", tz="UTC")),
            "key": pa.array([r[3] for r in rows], pa.binary()),
            "value": pa.array([r[4] for r in rows], pa.binary()),
        }
    )


def read_logged(log: list[pa.Table], ranges: dict[str, dict[str, list[int]]]) -> pa.Table:
    """ "Kafka" for a re-read by offsets: the records of ``ranges`` (``{topic: {partition: [first,
    last]}}``, inclusive) from the batches written so far (``log``)."""
    every = pa.concat_tables(log)
    keep = np.zeros(every.num_rows, bool)
    top, part, off = (np.asarray(every.column(c).to_pylist()) for c in ("topic", "partition", "offset"))
    for t, ps in ranges.items():
        for p, (a, z) in ps.items():
            keep |= (top == t) & (part == int(p)) & (off >= a) & (off <= z)
    return every.filter(pa.array(keep))
