"""Kafka record batches of the engine scenario (tests/engine/support.py) without Kafka, for the
shards' pure tests: trades (bad records mixed in) and packets over two partitions each, the
rules as ``subscriptions`` records, merged in event-time order and cut into micro-batches."""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tests.engine.rule_mix import RULES_MD_MIX, random_rules
from tests.engine.support import RULES, Scenario, make_scenario
from tidewatch.wire.avro import encode_batch

TOPICS = {"trades": "trades", "packets": "packets", "subscriptions": "subscriptions"}
#: rules grouped by the second key field of packets, and a ROWS window: what sharding must keep exact
EXTRA_RULES = {
    "fan_in": "SELECT dst_ip FROM packets GROUP BY dst_ip HAVING COUNT(*) OVER LAST 5 SECONDS > 30",
    "rows": "SELECT symbol FROM trades GROUP BY symbol HAVING AVG(price) OVER LAST 20 ROWS > 56",
    "ago": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER 20 SECONDS TO 10 SECONDS AGO > 6",
    "filter": "SELECT symbol FROM trades GROUP BY symbol "
    "HAVING SUM(size) FILTER (WHERE side = 'ASK') OVER LAST 10 SECONDS > 300 AND MIN(price) OVER LAST 10 SECONDS < 35",
}
#: what the sharded engine is checked with (pure and integration tests): the scenario's rules, the
#: rules above, every RULES.md example and a random mix (tests/engine/rule_mix.py)
SHARD_RULES = {**RULES, **EXTRA_RULES, **RULES_MD_MIX, **random_rules(24)}
LATE = (
    "late_bid",
    "SELECT symbol FROM trades WHERE side = 'BID' GROUP BY symbol HAVING SUM(size) OVER LAST 30 SECONDS > 2500",
)


def _table(rows: Sequence[tuple[str, int, int, int, bytes | None, bytes | None]]) -> pa.Table:
    topic, part, off, ts, key, value = zip(*rows, strict=True) if rows else ([],) * 6
    return pa.table(
        {
            "topic": pa.array(list(topic), pa.string()),
            "partition": pa.array(list(part), pa.int32()),
            "offset": pa.array(list(off), pa.int64()),
            "timestamp": pa.array(list(ts), pa.timestamp("ms")),
            "key": pa.array(list(key), pa.binary()),
            "value": pa.array(list(value), pa.binary()),
        }
    )


def sub_record(sid: str, name: str, text: str) -> tuple[bytes, bytes]:
    return sid.encode(), json.dumps({"id": sid, "name": name, "rule": text, "status": "active"}).encode()


def scenario_batches(
    sc: Scenario | None = None, per_batch: int = 900, late_after: int = 5
) -> tuple[list[pa.Table], dict[str, str]]:
    """The scenario's records as micro-batches (Arrow, RECORD_COLUMNS), every rule of
    SHARD_RULES subscribed in the first batch and LATE in batch ``late_after``; returns the
    batches and rule name -> subscription id."""
    sc = sc or make_scenario()
    rules = SHARD_RULES
    ids = {name: str(uuid.UUID(int=i + 1)) for i, name in enumerate([*rules, LATE[0]])}
    tv = encode_batch("trades", sc.trades).messages()
    pv = encode_batch("packets", sc.packets).messages()
    events: list[tuple[int, int, int]] = [(int(t), 0, i) for i, t in enumerate(sc.trades["ts"])]
    events += [(int(t), 1, i) for i, t in enumerate(sc.packets["ts"])]
    events.sort()
    offsets: dict[tuple[str, int], int] = {}
    out: list[tuple[str, int, int, int, bytes | None, bytes | None]] = []

    def add(topic: str, key: bytes, value: bytes | None, ts: int) -> None:
        p = zlib.crc32(key) % 2
        o = offsets.get((topic, p), 0)
        offsets[(topic, p)] = o + 1
        out.append((topic, p, o, ts, key, value))

    for name, text in rules.items():
        k, v = sub_record(ids[name], name, text)
        add("subscriptions", k, v, sc.t0)
    bad = list(sc.bad_trades)
    every = len(tv) // (len(bad) + 1)
    for ts, stream, i in events:
        if stream == 0:
            add("trades", str(sc.trades["symbol"][i]).encode(), tv[i], ts)
            if i and i % every == 0 and bad:
                add("trades", b"S0", bad.pop(0)[0], ts)
        else:
            add("packets", str(sc.packets["src_ip"][i]).encode(), pv[i], ts)
    for i in range(0, 40, 2):  # late: old packets again at the end (every key field's shard gets them)
        add("packets", str(sc.packets["src_ip"][i]).encode(), pv[i], int(sc.packets["ts"][-1]))
    batches = [_table(out[i : i + per_batch]) for i in range(0, len(out), per_batch)]
    k, v = sub_record(ids[LATE[0]], *LATE)
    late = _table([("subscriptions", 0, 10_000, int(sc.t0), k, v)])
    batches[late_after] = pa.concat_tables([late, batches[late_after]])
    return batches, ids


def alert_rows(alerts: Iterable[Any]) -> list[tuple[str, str, str, int, tuple[tuple[str, Any], ...]]]:
    """Alerts as sortable tuples, values included."""
    return sorted(
        (a.subscription_id, a.key, a.kind, a.as_of, tuple(sorted(a.values.items()))) for a in alerts
    )


def split_tasks(tbl: pa.Table) -> list[pa.Table]:
    """A batch as Spark's tasks read it: one table per (topic, partition)."""
    keys = set(zip(tbl.column("topic").to_pylist(), tbl.column("partition").to_pylist(), strict=True))
    out = []
    for t, p in sorted(keys):
        m = np.array(
            [
                a == t and b == p
                for a, b in zip(
                    tbl.column("topic").to_pylist(), tbl.column("partition").to_pylist(), strict=True
                )
            ]
        )
        out.append(tbl.filter(pa.array(m)))
    return out
