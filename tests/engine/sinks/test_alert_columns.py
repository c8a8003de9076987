"""A batch's alert columns say what the Alert objects say: ids, the subscriptions' UUID text, the
values' JSON text exactly as ``json.dumps`` writes it (the text the sinks always stored), the ENTER
flags; built once per list (the PostgreSQL and Kafka sinks share them). No services."""

from __future__ import annotations

import enum
import json
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.messages import Alert, AlertBlock, AlertSeq, LookupBlock
from engine.runtime import state_codec
from engine.sinks.alert_columns import AlertColumns, split_bytes, subscription_uuid, typed_json

SUBS = [str(uuid.UUID(int=7)), "not-a-uuid", str(uuid.UUID(int=9)).upper(), "déjà vu"]


class Level(enum.IntEnum):
    HIGH = 3


AWKWARD: list[dict[str, Any]] = [
    {},
    {"COUNT(*) OVER LAST 10 SECONDS": 13, "AVG(price)": 1234.56},
    {"a": None, "b": float("nan"), "c": float("inf"), "d": float("-inf"), "e": True},
    {'é"\\\n': -0.0, "tiny": 1e-7, "big": 1e16, "huge": 10**20, "neg": -3, "exp": 1.5e300},
    {"np": np.float64(2.5), "enum": Level.HIGH, "third": 1 / 3},
]


def _alerts() -> list[Alert]:
    return [
        Alert(SUBS[i % 4], f"r{i}", "trades", ["K", "", "a,b", "q\"", "ü"][i % 5], "ENTER" if i % 3 else "EXIT",
              1_763_900_000_000 + i * 7 - (i % 4) * 1000, AWKWARD[i % len(AWKWARD)])
        for i in range(60)
    ]  # fmt: skip


def test_columns_say_what_the_alerts_say() -> None:
    alerts = _alerts()
    c = AlertColumns.of(alerts)
    assert len(c) == 60
    assert c.ids.to_pylist() == [a.id for a in alerts]
    assert c.values_json.to_pylist() == [json.dumps(a.values) for a in alerts]
    assert c.subscription_uuid_text.to_pylist() == [str(subscription_uuid(a.subscription_id)) for a in alerts]
    assert c.present.tolist() == [a.kind == "ENTER" for a in alerts]
    assert c.as_of.tolist() == [a.as_of for a in alerts]
    assert c.counts.tolist() == [len(a.values) for a in alerts]
    bits, null = c.value_floats
    flat = [x for a in alerts for x in a.values.values()]
    assert null.tolist() == [x is None for x in flat]
    assert [float(b) for b, n in zip(bits.view(np.float64), null, strict=True) if not n] == pytest.approx(
        [float(x) for x in flat if x is not None], nan_ok=True
    )


def test_columns_are_built_once_per_list_and_rows_keep_their_ids() -> None:
    alerts = _alerts()
    c = AlertColumns.of(alerts)
    assert AlertColumns.of(alerts) is c and AlertColumns.of(c) is c
    assert AlertColumns.of(list(alerts)) is not c  # another list: built again
    rows = [{"id": f"given-{i}", "subscription_id": SUBS[0], "key": "K", "kind": "EXIT", "as_of": i,
             "values": {"x": i}} for i in range(3)]  # fmt: skip
    r = AlertColumns.of(rows)
    assert r.ids.to_pylist() == ["given-0", "given-1", "given-2"]
    assert r.rule_name.to_pylist() == ["", "", ""] and r.values_json.to_pylist()[2] == '{"x": 2}'


def test_labels_that_are_not_strings_are_encoded_as_json_encodes_them() -> None:
    alerts = [Alert(SUBS[0], "r", "s", "k", "ENTER", 1, {1: 2.0, None: 3})]  # type: ignore[dict-item]
    assert AlertColumns.of(alerts).values_json.to_pylist() == [json.dumps(alerts[0].values)]


def test_a_missing_field_is_refused_and_bytes_are_split_as_sliced() -> None:
    with pytest.raises(ValueError, match="key"):
        AlertColumns.of([{"id": "i", "subscription_id": "s", "key": None, "kind": "ENTER", "as_of": 1}])
    data = np.frombuffer(b"abcdef", np.uint8)
    assert split_bytes(data, np.array([0, 2, 2, 6])) == [b"ab", b"", b"cdef"]


def _same_columns(a: AlertColumns, b: AlertColumns) -> None:
    for name in (
        "subscription_id",
        "rule_name",
        "stream",
        "key",
        "kind",
        "ids",
        "subscription_uuid_text",
        "values_json",
    ):
        assert getattr(a, name).to_pylist() == getattr(b, name).to_pylist(), name
    assert a.as_of.tolist() == b.as_of.tolist() and a.counts.tolist() == b.counts.tolist()
    assert a.value_labels is not None and b.value_labels is not None
    assert a.value_labels.to_pylist() == b.value_labels.to_pylist()
    for x, y in zip(a.value_floats, b.value_floats, strict=True):
        assert x.tolist() == y.tolist()
    assert a.present.tolist() == b.present.tolist()
    assert a.top_subscriptions() == b.top_subscriptions()


def test_columns_of_the_cores_blocks_are_the_columns_of_their_alerts() -> None:
    """An :class:`AlertSeq` of blocks (as the core makes them) and runs of Alert objects: its
    columns, read block by block, equal those of its Alert objects, value JSON and bits included."""
    labels = [
        "COUNT(*) OVER LAST 10 SECONDS",
        "AVG(price) OVER LAST 5 SECONDS",
        "MAX(price) OVER LAST 5 SECONDS",
    ]
    seq = AlertSeq(_alerts()[:7])
    for i in range(12):
        n, m = 1 + i % 4, i % 4
        cols: list[list[Any]] = [
            [None if (i + j) % 5 == 0 else (j * 3 if c == 0 else j / 7 - 2.5) for j in range(n)]
            for c in range(m)
        ]
        keys = [f"k{j}" for j in range(n)]
        kinds = ["ENTER" if j % 2 else "EXIT" for j in range(n)]
        seq.add_block(
            AlertBlock(SUBS[i % 4], f"r{i}", "trades", 1_763_900_000_000 + i, keys, kinds, labels[:m], cols)
        )
        if i == 5:
            seq.extend(_alerts()[20:31])
    got = AlertColumns.of(seq)
    assert AlertColumns.of(seq) is got  # once per sequence, as for a list
    assert not got.values  # read from the blocks: no per-alert dict made
    _same_columns(got, AlertColumns.of(list(seq)))


_VALUE = st.one_of(st.none(), st.integers(-(10**6), 10**6), st.floats(allow_nan=False, width=64))


def _block(draw: st.DrawFn, tau: int) -> AlertBlock:
    """A block as the core makes it in a storm of many subscriptions: one subscription at lookup
    time ``tau``, one to three alerts, 0-3 labels, values None / int / float."""
    labels = ["COUNT(*) OVER LAST 10 SECONDS", "AVG(price)", "MAX(x)"]
    n, m = draw(st.integers(1, 3)), draw(st.integers(0, 3))
    sid = draw(st.sampled_from(SUBS))
    vals = [[draw(_VALUE) for _ in range(n)] for _ in range(m)]
    keys = [draw(st.sampled_from(["a", "b", "", 'ü,"'])) for _ in range(n)]
    kinds = [draw(st.sampled_from(["ENTER", "EXIT"])) for _ in range(n)]
    return AlertBlock(sid, f"r-{sid[:3]}", "trades", tau, keys, kinds, labels[:m], vals)


@st.composite
def _blocks_only(draw: st.DrawFn) -> AlertSeq:
    """Blocks alone (:func:`_block`), as the core makes them in a storm of many subscriptions."""
    seq = AlertSeq()
    for tau in range(draw(st.integers(1, 12))):
        seq.add_block(_block(draw, 10 * tau))
    return seq


@given(_blocks_only())
@settings(max_examples=150, deadline=None)
def test_columns_of_blocks_alone_are_the_columns_of_their_alerts(seq: AlertSeq) -> None:
    """The blocks-only path (one pass per field over all blocks) against the Alert objects'."""
    got = AlertColumns.of(seq, slot=None)
    assert not got.values  # no per-alert dict made
    _same_columns(got, AlertColumns.of(list(seq), slot=None))


@st.composite
def _blocks_and_runs(draw: st.DrawFn) -> AlertSeq:
    """Blocks (as the core makes them) and runs of Alert objects (as a reader makes them, their
    values awkward ones too) in any order: runs of several blocks, runs of several alerts."""
    seq = AlertSeq()
    for tau in range(draw(st.integers(1, 10))):
        if not draw(st.booleans()):
            seq.add_block(_block(draw, 10 * tau))
            continue
        sid = draw(st.sampled_from(SUBS))
        for j in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["ENTER", "EXIT"]))
            vals = draw(st.sampled_from([*AWKWARD, {"n": draw(_VALUE)}]))
            seq.append(Alert(sid, "loose", "trades", f"z{j}", kind, 10 * tau, vals))
    return seq


@given(_blocks_and_runs())
@settings(max_examples=150, deadline=None)
def test_columns_of_blocks_and_runs_of_alerts_are_the_columns_of_their_alerts(seq: AlertSeq) -> None:
    """A mixed sequence, split into runs (blocks by the one-pass path, Alert objects as a list's)
    and joined, against its Alert objects read as one list; the entries' Python values kept."""
    got = AlertColumns.of(seq, slot=None)
    _same_columns(got, AlertColumns._build(list(seq)))
    assert got.value_items == [x for a in seq for x in a.values.values()]
    kinds = {isinstance(b, list) for b in seq.blocks()}
    if len(kinds) == 2:  # blocks and runs: joined through the tables, no per-alert dict kept
        assert not got.values
        assert AlertColumns.of(seq, slot=None).alerts() == list(seq)


@st.composite
def _lookups_blocks_and_runs(draw: st.DrawFn) -> AlertSeq:
    """What the core makes -- one block of many subscriptions per lookup time (:class:`LookupBlock`)
    -- alone or among blocks of one subscription and runs of Alert objects."""
    seq = AlertSeq()
    mixed = draw(st.booleans())
    for tau in range(draw(st.integers(1, 8))):
        what = draw(st.sampled_from(["lookup", "block", "run"] if mixed else ["lookup"]))
        if what == "lookup":
            blocks = [_block(draw, 10 * tau) for _ in range(draw(st.integers(0, 5)))]
            for i, b in enumerate(blocks):
                b.subscription_id = SUBS[i % len(SUBS)] if i < len(SUBS) else f"sub-{i}"
            seq.add_block(LookupBlock.of_blocks(blocks))
        elif what == "block":
            seq.add_block(_block(draw, 10 * tau))
        else:
            vals = draw(st.sampled_from([*AWKWARD, {"n": draw(_VALUE)}]))
            seq.append(Alert(draw(st.sampled_from(SUBS)), "loose", "trades", "z", "ENTER", 10 * tau, vals))
    return seq


@given(_lookups_blocks_and_runs())
@settings(max_examples=150, deadline=None)
def test_columns_of_lookup_blocks_are_the_columns_of_their_alerts(seq: AlertSeq) -> None:
    """The core's lookup blocks (alone: gathered by NumPy and Arrow; among other blocks and runs:
    joined) against their Alert objects read as one list; the entries' Python values kept."""
    got = AlertColumns.of(seq, slot=None)
    _same_columns(got, AlertColumns._build(list(seq)))
    want = [x for a in seq for x in a.values.values()]
    assert got.value_items == want and list(map(type, got.value_items or ())) == list(map(type, want))
    tags = [{type(None): 0, int: 1, float: 2}.get(type(x)) for x in want]  # None / int / float
    typed = None not in tags and all(abs(x) < 2**53 for x in want if type(x) is int)
    assert (got.value_tags is not None) == typed
    assert not typed or got.value_tags is not None and got.value_tags.tolist() == tags
    if all(isinstance(b, LookupBlock) for b in seq.blocks()):
        assert not got.values  # no per-alert dict made
        assert got.typed is not None or not len(seq)  # nor a Python object per value


def test_blocks_alone_with_a_label_that_is_not_a_string_are_read_as_alerts() -> None:
    seq = AlertSeq()
    seq.add_block(AlertBlock(SUBS[1], "r2", "trades", 6, ["a", "b"], ["EXIT", "ENTER"], [7], [[1, None]]))  # type: ignore[list-item]
    got = AlertColumns.of(seq, slot=None)
    assert got.values == [a.values for a in seq]  # built from the Alert objects, as before
    assert got.values_json.to_pylist() == [json.dumps(a.values) for a in seq]


def test_blocks_beside_a_label_that_is_not_a_string_are_read_as_alerts() -> None:
    seq = AlertSeq([Alert(SUBS[0], "r", "trades", "k", "ENTER", 5, {7: 1.5})])  # type: ignore[dict-item]
    seq.add_block(AlertBlock(SUBS[1], "r2", "trades", 6, ["a", "b"], ["EXIT", "ENTER"], ["n"], [[1, None]]))
    got = AlertColumns.of(seq, slot="probe")
    assert got.values == [a.values for a in seq]  # built from the Alert objects, as before
    assert got.values_json.to_pylist() == [json.dumps(a.values) for a in seq]


def test_lookup_blocks_with_a_label_that_is_not_a_string_are_read_as_alerts() -> None:
    block = AlertBlock(SUBS[1], "r2", "trades", 6, ["a", "b"], ["EXIT", "ENTER"], [7], [[1, None]])  # type: ignore[list-item]
    seq = AlertSeq()
    seq.add_block(LookupBlock.of_blocks([block]))
    got = AlertColumns.of(seq, slot=None)
    assert got.values == [a.values for a in seq] == [{7: 1}, {7: None}]  # from the Alert objects
    assert got.values_json.to_pylist() == [json.dumps(a.values) for a in seq]


@st.composite
def _shard_outputs(draw: st.DrawFn) -> list[AlertSeq]:
    """Alert sequences as shards' cores make them: blocks of one subscription at one lookup
    time (lookup times ascending within a shard), runs of Alert objects among them."""
    taus = sorted(draw(st.lists(st.integers(0, 6), min_size=1, max_size=8)))
    labels = ["COUNT(*) OVER LAST 10 SECONDS", "AVG(price)", "MAX(x)"]
    value = st.one_of(st.none(), st.integers(-(10**6), 10**6), st.floats(allow_nan=False, width=64))
    shards = []
    for _ in range(draw(st.integers(1, 3))):
        seq = AlertSeq()
        for tau in taus:
            if draw(st.booleans()):
                continue
            n, m = draw(st.integers(1, 4)), draw(st.integers(0, 3))
            sid = draw(st.sampled_from(SUBS))
            vals = [[draw(value) for _ in range(n)] for _ in range(m)]
            keys = [draw(st.sampled_from(["a", "b", "", 'ü,"'])) for _ in range(n)]
            kinds = [draw(st.sampled_from(["ENTER", "EXIT"])) for _ in range(n)]
            seq.add_block(AlertBlock(sid, f"r-{sid[:3]}", "trades", tau, keys, kinds, labels[:m], vals))
            if draw(st.booleans()):
                seq.append(Alert(sid, "loose", "trades", "z", "EXIT", tau, {"n": draw(value)}))
        shards.append(seq)
    return shards


@given(_shard_outputs())
@settings(max_examples=150, deadline=None)
def test_shards_tables_merged_and_sorted_are_the_columns_of_the_alerts_sorted(shards: list[AlertSeq]) -> None:
    """What a sharded batch's driver does -- each shard's columns to two Arrow tables, through the
    wire format, joined and stably sorted by ``as_of`` -- against the brute force: the shards'
    Alert objects one after another, sorted by ``as_of`` with Python's stable sort."""
    want = sorted((a for seq in shards for a in seq), key=lambda a: a.as_of)
    parts = []
    for seq in shards:
        if not len(seq):
            continue
        back = state_codec.loads(state_codec.dumps(AlertColumns.of(seq, slot="probe").to_tables()))
        parts.append(AlertColumns.from_tables(*back))
    got = AlertColumns.concat(parts).sorted_by_as_of()
    assert len(got) == len(want)
    if want:
        _same_columns(got, AlertColumns.of(want, slot="probe"))
    made = got.alerts()
    assert made == want  # every field but the values (not compared by Alert's ==) ...
    assert [json.dumps(a.values) for a in made] == [json.dumps(a.values) for a in want]  # ... and these
    merged = AlertSeq()
    merged.add_block(got)
    assert list(merged) == want
    if want:  # the sinks read the block as it is
        assert AlertColumns.of(merged, slot="probe") is got


def test_tables_that_do_not_fit_together_are_refused() -> None:
    rows, items = AlertColumns.of(_alerts()[:5], slot="probe").to_tables()
    with pytest.raises(ValueError, match="value entries"):
        AlertColumns.from_tables(rows, items.slice(1))


def _typed(values: list[float | int | None]) -> tuple[np.ndarray, np.ndarray]:
    tags = np.array([0 if v is None else 1 if type(v) is int else 2 for v in values], np.int8)
    return np.array([0.0 if v is None else float(v) for v in values], np.float64), tags


@given(st.lists(st.one_of(_VALUE, st.floats(width=64), st.integers(-(2**53), 2**53)), max_size=60))
@settings(max_examples=300, deadline=None)
def test_typed_values_json_text_is_json_dumps_of_each(values: list[float | int | None]) -> None:
    """:func:`typed_json` (Arrow's casts) writes each typed value as ``json.dumps`` does: every
    float hypothesis draws (NaN, infinities, signed zeros, subnormals, exponents both ways)."""
    assert typed_json(*_typed(values)).to_pylist() == [json.dumps(v) for v in values]


def test_typed_values_json_text_over_every_magnitude() -> None:
    """The same over a million doubles: prices to the cent, every decade from 1e-8 to 1e20 around
    repr's switch to exponents (1e-4, 1e16), raw bit patterns, whole numbers."""
    rng = np.random.default_rng(7)
    n = 200_000
    floats = np.concatenate([
        np.round(rng.uniform(0, 1e5, n), 2),
        10 ** rng.uniform(-8, 20, n) * rng.choice([-1, 1], n),
        rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64),
        rng.integers(-(10**12), 10**12, n).astype(np.float64),
        np.array([1e-4, np.nextafter(1e-4, 0), 1e16, np.nextafter(1e16, 0), 0.0, -0.0, 5.0]),
    ])  # fmt: skip
    values: list[float | int | None] = floats.tolist()
    assert typed_json(*_typed(values)).to_pylist() == [json.dumps(v) for v in values]


@given(st.lists(st.tuples(st.uuids(), st.sampled_from([str, lambda s: s.upper(), lambda s: "{" + s + "}", lambda s: s.replace("-", "")])), min_size=1, max_size=8))  # fmt: skip
@settings(max_examples=100, deadline=None)
def test_subscription_uuid_text_of_ids_written_any_way(ids: list[tuple[uuid.UUID, Any]]) -> None:
    """Ids already a UUID's text are taken as they are; any other way of writing one (upper case,
    braces, no hyphens) is read as its UUID: the text is the UUID's either way."""
    alerts = [Alert(how(str(u)), "r", "trades", "k", "ENTER", 1, {}) for u, how in ids]
    got = AlertColumns.of(alerts).subscription_uuid_text.to_pylist()
    assert got == [str(u) for u, _ in ids]
