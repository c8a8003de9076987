"""engine.runtime.state_codec: the state snapshot format -- exact round trips of a real engine
core and of any nested containers, shared objects kept, and files that would run code refused."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine import core as core_module
from engine.core import EngineCore
from engine.errors import SnapshotUnreadable
from engine.evaluation.evaluator import Evaluator
from engine.messages import SubscriptionChange
from engine.runtime import state_codec
from engine.runtime.state_codec import FORMAT_VERSION, StateNotEncodable, allow, dumps, loads
from subscriptions.compiler import compile_rule
from tests.engine.runtime.snapshots import build, split
from tidewatch.settings import get_settings
from tidewatch.wire.avro import encode_batch

G = 1000
T0 = 1_700_000_000_000
RULES = {
    "rows": "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 20 ROWS > 1100",
    "count": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 10 SECONDS > 12",
    "sum": "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 20 SECONDS >= 900",
    "ask": "SELECT symbol FROM trades WHERE side = 'ASK' GROUP BY symbol "
    "HAVING SUM(size) OVER LAST 5 SECONDS > 200 AND AVG(price) OVER LAST 30 SECONDS < 55",
    "range": "SELECT symbol FROM trades GROUP BY symbol HAVING MAX(price) OVER LAST 15 SECONDS "
    "- MIN(price) OVER LAST 15 SECONDS > 20",
    "low": "SELECT symbol FROM trades GROUP BY symbol HAVING MIN(price) OVER LAST 7 SECONDS < 31",
    "drop": "SELECT symbol FROM trades GROUP BY symbol HAVING LAST(price) OVER LAST 8 SECONDS "
    "< FIRST(price) OVER LAST 8 SECONDS",
    "scan": "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST 10 SECONDS > 8",
    "heavy": "SELECT src_ip FROM packets WHERE protocol = 'TCP' GROUP BY src_ip "
    "HAVING SUM(length) OVER LAST 5 SECONDS > 6000",
}


# ---------------------------------------------------------------- a real engine core
def _events(n_trades: int, n_packets: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    ts = T0 + np.sort(rng.integers(0, 120_000, n_trades))
    pts = T0 + np.sort(rng.integers(0, 120_000, n_packets))
    return {
        "trades": {
            "symbol": np.array([f"S{i}" for i in rng.integers(0, 12, n_trades)], dtype=object),
            "ts": ts.astype(np.int64),
            "price": np.round(rng.uniform(30, 80, n_trades), 2),
            "size": rng.integers(0, 100, n_trades).astype(np.int64),
            "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n_trades),
            "exchange": np.array(["NASDAQ"] * n_trades, dtype=object),
        },
        "packets": {
            "ts": pts.astype(np.int64),
            "src_ip": np.array([f"10.0.0.{i}" for i in rng.integers(0, 8, n_packets)], dtype=object),
            "dst_ip": np.array([f"10.1.0.{i}" for i in rng.integers(0, 4, n_packets)], dtype=object),
            "src_port": rng.integers(1024, 65000, n_packets).astype(np.int64),
            "dst_port": rng.integers(1, 40, n_packets).astype(np.int64),
            "protocol": rng.choice(np.array(["TCP", "UDP"], dtype=object), n_packets),
            "length": rng.integers(40, 1500, n_packets).astype(np.int64),
            "tcp_flags": np.array(["S"] * n_packets, dtype=object),
        },
    }


def _batches(seed: int, n: int = 24) -> list[dict[str, pa.Table]]:
    out = []
    for stream, cols in _events(3000, 2000, seed).items():
        bounds = np.linspace(0, len(cols["ts"]), n + 1).astype(int)
        for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            vals = encode_batch(stream, {k: v[lo:hi] for k, v in cols.items()}).messages()
            tbl = pa.table(
                {
                    "partition": pa.array(np.zeros(hi - lo, np.int32)),
                    "offset": pa.array(np.arange(lo, hi, dtype=np.int64)),
                    "value": pa.array(vals, pa.binary()),
                }
            )
            if len(out) <= b:
                out.append({})
            out[b][stream] = tbl
    return out


def _compile(text: str, plan: object) -> tuple[object, str]:
    p = compile_rule(text, get_settings())
    return p, p.stream


def _core(panes: bool) -> EngineCore:
    return EngineCore(
        pane_ms=G,
        allowed_lateness_ms=1500,
        max_future_ms=10**12,
        evaluator_factory=lambda: Evaluator("shared", ci_p=2, pane_ms=G if panes else None),  # type: ignore[arg-type, return-value]
        compile_rule=_compile,
    )


def _alerts(core: EngineCore, batches: list[dict[str, pa.Table]], first: int) -> list[tuple[Any, ...]]:
    got = []
    for b, recs in enumerate(batches, start=first):
        changes = [SubscriptionChange(n, "upsert", n, t) for n, t in RULES.items()] if b == 0 else []
        if b == 14:  # a rule added after the snapshot: PSoup over the restored history
            changes = [SubscriptionChange("late", "upsert", "late", RULES["sum"].replace("900", "1500"))]
        out = core.process(b, recs, changes)
        got += [(a.id, sorted(a.values.items())) for a in out.alerts]
    return got


@pytest.mark.parametrize("panes", [False, True], ids=["raw", "panes"])
def test_a_restored_core_gives_the_same_alerts_as_the_original(panes: bool) -> None:
    batches = _batches(seed=5)
    core = _core(panes)
    _alerts(core, batches[:10], 0)
    data = core.to_bytes()
    assert data[:8] == state_codec.MAGIC
    restored = EngineCore.from_bytes(data, compile_rule=_compile)
    assert restored is not core and restored.evaluator is not core.evaluator
    assert {k: v for k, v in vars(restored).items() if k != "evaluator" and k != "_compile"}.keys() == {
        k for k in vars(core) if k not in ("evaluator", "_compile")
    }
    assert split(restored.to_bytes())[2] == split(core.to_bytes())[2]  # the same arrays and structures
    rest = _alerts(core, batches[10:], 10)
    assert _alerts(restored, batches[10:], 10) == rest
    kinds = {a[0].split("|")[0] for a in rest}
    assert len(rest) > 30 and {"rows", "count", "sum", "low", "drop", "scan", "heavy", "late"} <= kinds


def test_shared_structures_stay_shared_in_a_restored_evaluator() -> None:
    core = _core(True)
    _alerts(core, _batches(seed=2)[:6], 0)
    ev: Any = EngineCore.from_bytes(core.to_bytes(), compile_rule=_compile).evaluator
    for rule in ev.rules.values():  # a rule's key state and structures are the evaluator's own
        st_ = ev.states[(rule.plan.stream, rule.plan.key)]
        assert rule.state is st_
        assert all(any(s is t for t in st_.structs.values()) for s in rule.agg_structs)
    for g in ev.groups.values():
        assert g.state is ev.states[(g.state.stream, g.state.key)]


def test_every_attribute_of_the_core_is_carried_and_missing_ones_get_defaults() -> None:
    core = _core(False)
    _alerts(core, _batches(seed=3)[:4], 0)
    core.part_max[("trades", 9)] = 123  # any change of any attribute survives
    version, doc, section = split(core.to_bytes())
    root = doc["root"]
    names = root[1::2]
    assert set(names) == set(vars(core)) - core_module._NOT_STATE
    restored = EngineCore.from_bytes(build(doc, section), compile_rule=_compile)
    assert restored.part_max == core.part_max
    # an older snapshot of the same format without an attribute: __init__'s default
    i = names.index("raw_fed")
    del root[1 + 2 * i : 3 + 2 * i]
    assert EngineCore.from_bytes(build(doc, section), compile_rule=_compile).raw_fed == {}
    # an attribute this engine does not have: refused (a newer engine's snapshot)
    root += ["from_the_future", 1]
    with pytest.raises(SnapshotUnreadable, match="from_the_future"):
        EngineCore.from_bytes(build(doc, section), compile_rule=_compile)


# ---------------------------------------------------------------- any nested containers
def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types (NaN equal to NaN), arrays by dtype, shape and contents."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype == object:
            return a.tolist() == b.tolist()
        return a.tobytes() == b.tobytes()
    if isinstance(a, float | np.floating):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


_keys = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
_arrays = hnp.arrays(
    st.sampled_from(
        [
            np.int64,
            np.int32,
            np.uint8,
            np.float64,
            np.float32,
            np.bool_,
            np.complex128,
            ">i4",
            "<U3",
            "S2",
            "M8[ms]",
        ]
    ),
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
)
_str_objects = st.lists(st.none() | st.text(max_size=5), max_size=6).map(
    lambda xs: np.array(xs + ["x"], dtype=object)
)
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10)
    | st.binary(max_size=10)
    | _arrays
    | _str_objects
    | st.builds(np.int16, st.integers(-(2**15), 2**15 - 1))
    | st.builds(np.float64, st.floats()),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(_keys, inner, max_size=4)
        | st.sets(_keys, max_size=4)
        | st.frozensets(_keys, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_any_nested_containers_round_trip_exactly(value: Any) -> None:
    assert _same(loads(dumps(value)), value)


def test_shared_objects_and_cycles_keep_their_identity() -> None:
    arr = np.arange(100_000, dtype=np.int64)
    inner: list[Any] = [1]
    cyc: list[Any] = ["me"]
    cyc.append(cyc)
    d: dict[str, Any] = {"a": arr, "b": arr, "l1": inner, "l2": inner, "cyc": cyc}
    d["self"] = d
    data = dumps(d)
    assert len(data) < 1.1 * arr.nbytes  # the array is written once
    back = loads(data)
    assert back["a"] is back["b"] and back["l1"] is back["l2"] and back["self"] is back
    assert back["cyc"][1] is back["cyc"]
    assert back["a"].flags.writeable and back["a"].tolist() == arr.tolist()


@allow
class _Node:
    def __init__(self, name: str) -> None:
        self.name = name
        self.children: list[_Node] = []
        self.parent: _Node | None = None


def test_objects_with_back_pointers_round_trip() -> None:
    root = _Node("root")
    for i in range(3):
        c = _Node(f"c{i}")
        c.parent = root
        root.children.append(c)
    back = loads(dumps(root))
    assert type(back) is _Node and [c.name for c in back.children] == ["c0", "c1", "c2"]
    assert all(c.parent is back for c in back.children)


def test_ints_of_any_size_even_beyond_what_json_writes() -> None:
    huge = [10**5000 + 7, -(3**20000), {"k": (2**70, 10**4400)}]  # json.dumps refuses > 4300 digits
    assert loads(dumps(huge)) == huge


def test_big_ints_non_finite_floats_and_arrow_tables() -> None:
    t = pa.table({"a": [1, 2, None], "s": ["x", None, "z"]})
    v = [2**200, -(2**64), float("nan"), float("-inf"), -0.0, t, bytearray(b"ab"), np.str_("é")]
    back = loads(dumps(v))
    assert back[0] == 2**200 and back[1] == -(2**64) and math.isnan(back[2]) and back[3] == float("-inf")
    assert math.copysign(1, back[4]) == -1 and back[5].equals(t) and back[6] == bytearray(b"ab")
    assert type(back[7]) is np.str_ and back[7] == "é"


# ---------------------------------------------------------------- refused when written
class _NotAllowed:
    pass


@pytest.mark.parametrize(
    ("value", "type_name", "path"),
    [
        ({"a": [1, {"b": _NotAllowed()}]}, "_NotAllowed", "['a'][1]['b']"),
        ({"f": [print]}, "builtins:builtin_function_or_method", "['f'][0]"),
        ({"x": (1, lambda: 0)}, "builtins:function", "['x'][1]"),
        ({"o": np.array([1, "a"], dtype=object)}, "numpy object array", "['o']"),
        ({"r": np.zeros(2, "i4,f8")}, "numpy array", "['r']"),
    ],
)
def test_what_the_format_does_not_hold_is_refused_when_written(value: Any, type_name: str, path: str) -> None:
    with pytest.raises(StateNotEncodable) as err:
        dumps(value)
    assert type_name in err.value.type_name and err.value.path == path
    assert path in str(err.value)


def test_the_path_names_the_attribute_in_the_engine_state() -> None:
    core = _core(False)
    _alerts(core, _batches(seed=1)[:2], 0)
    core.evaluator.stats["oops"] = _NotAllowed()  # type: ignore[attr-defined]
    with pytest.raises(StateNotEncodable) as err:
        core.to_bytes()
    assert err.value.path == "['evaluator'].stats['oops']"


def test_a_cycle_through_a_tuple_is_refused_when_written() -> None:
    holder: list[Any] = []
    t = (holder,)
    holder.append(t)
    with pytest.raises(StateNotEncodable, match="cycle"):
        dumps(t)


# ---------------------------------------------------------------- refused when read
CALLED: list[str] = []


class Trap:
    """Would record any code of it run while a snapshot is read."""

    def __new__(cls, *a: Any, **k: Any) -> Trap:
        CALLED.append("__new__")
        return super().__new__(cls)

    def __init__(self, *a: Any) -> None:
        CALLED.append("__init__")

    def __setstate__(self, state: Any) -> None:
        CALLED.append("__setstate__")

    def __reduce__(self) -> Any:
        CALLED.append("__reduce__")
        return (Trap, ())


class Quiet:
    """Allowed, with an __init__ and a __setstate__ that must not run when read."""

    def __init__(self) -> None:
        CALLED.append("Quiet.__init__")

    def __setstate__(self, state: Any) -> None:
        CALLED.append("Quiet.__setstate__")


def _doc_with(node: Any, classes: tuple[str, ...] = (), shapes: tuple[Any, ...] = ()) -> bytes:
    doc = {"root": node, "classes": list(classes), "shapes": list(shapes), "buffers": [[0, 3]]}
    return build(doc, b"abc")


@pytest.mark.parametrize(
    "name",
    [
        "os:system",
        "builtins:eval",
        "subprocess:Popen",
        "posix:system",
        "tests.engine.runtime.test_state_codec:Trap",
        "engine.errors:SnapshotUnreadable",  # not a plain class: an exception
        "engine.runtime.state_codec:_Encoder.__init__",
        "engine.core:log",
    ],
)
@pytest.mark.parametrize("tag", ["C", "N"])
def test_a_file_naming_a_class_outside_the_allowlist_is_refused_and_nothing_runs(name: str, tag: str) -> None:
    CALLED.clear()
    node = ["C", 0, ["L", "touch /tmp/pwned"]] if tag == "C" else ["N", 0, 0]
    shapes = ([0, ["args"]],) if tag == "C" else ()
    with pytest.raises(SnapshotUnreadable, match="allowed|class"):
        loads(_doc_with(["L", node], (name,), shapes))
    assert CALLED == []


def test_no_module_outside_the_engine_is_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tw_side_effect.py").write_text(
        "import builtins\nbuiltins.TW_IMPORTED = True\nclass X:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SnapshotUnreadable):
        loads(_doc_with(["C", 0], ("tw_side_effect:X",), ([0, []],)))
    assert "tw_side_effect" not in sys.modules
    assert not hasattr(__builtins__, "TW_IMPORTED") and "TW_IMPORTED" not in dir(__import__("builtins"))


def test_allowed_classes_are_filled_without_running_their_code() -> None:
    allow(Quiet)
    CALLED.clear()
    q = object.__new__(Quiet)
    q.x = [1, 2]  # type: ignore[attr-defined]
    back = loads(dumps(q))
    assert type(back) is Quiet and back.x == [1, 2] and CALLED == []
    with pytest.raises(TypeError):
        allow(Trap)  # its own __new__: it could not be made without running its code


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[: len(d) // 2],
        lambda d: d[:-1],
        lambda d: d[:20],
        lambda d: b"",
        lambda d: b"\x80\x05" + d[2:],  # a pickle's opening
        lambda d: b"TWSTATE\x01" + d[8:],
        lambda d: d + b"\x00",
        lambda d: d[:-5] + bytes([d[-5] ^ 1]) + d[-4:],  # one bit of an array
    ],
    ids=["half", "one-byte-short", "header-only", "empty", "pickle", "magic", "trailing", "bit-flip"],
)
def test_damaged_files_are_refused(damage: Any) -> None:
    data = dumps({"a": np.arange(1000), "b": ["x", 2.5]})
    with pytest.raises(SnapshotUnreadable):
        loads(damage(data))


def test_a_future_format_version_is_refused() -> None:
    _, doc, section = split(dumps({"a": 1}))
    with pytest.raises(SnapshotUnreadable, match=f"version {FORMAT_VERSION + 1}"):
        loads(build(doc, section, version=FORMAT_VERSION + 1))
    assert loads(build(doc, section)) == {"a": 1}


RULE_INFO = [0, ["subscription_id", "name", "text", "stream", "version"]]


@pytest.mark.parametrize(
    ("node", "shapes"),
    [
        (["C", 1, "a", "b", "c", "d", None], (RULE_INFO,)),  # no such shape
        (["C", 0, "a", "b"], (RULE_INFO,)),  # 2 values for 5 attributes
        (["C", 0, "x"], ([0, ["name"]],)),  # fields missing: another layout
        (["C", 0, "x", "a", "b", "c", "d", None], ([0, ["__class__", *RULE_INFO[1]]],)),
        (["C", 0, "a", "b", "c", "d", None], ([0, ["name", "name", "text", "stream", "version"]],)),
        (["C", 0, "a", "b", "c", "d", None], ([3, RULE_INFO[1]],)),  # no such class
        (["N", 0, 0], ()),  # RuleInfo has no native form
    ],
)
def test_malformed_instances_are_refused(node: Any, shapes: tuple[Any, ...]) -> None:
    with pytest.raises(SnapshotUnreadable):
        loads(_doc_with(node, ("engine.messages:RuleInfo",), shapes))
    good = _doc_with(["C", 0, "a", "b", "c", "d", None], ("engine.messages:RuleInfo",), (RULE_INFO,))
    assert loads(good).text == "c"


def test_a_field_added_since_with_a_default_gets_it() -> None:
    """RULE_INFO is RuleInfo's layout before migration 0009 added ``staleness_budget_ms``
    (default None): such a file still loads, the field at its default; a field without a
    default stays required (the cases above)."""
    old = loads(_doc_with(["C", 0, "a", "b", "c", "d", 3], ("engine.messages:RuleInfo",), (RULE_INFO,)))
    assert (old.subscription_id, old.version, old.staleness_budget_ms) == ("a", 3, None)
    now = [0, [*RULE_INFO[1], "staleness_budget_ms"]]
    new = loads(_doc_with(["C", 0, "a", "b", "c", "d", 3, 30_000], ("engine.messages:RuleInfo",), (now,)))
    assert new.staleness_budget_ms == 30_000


@pytest.mark.parametrize(
    "node",
    [
        ["R", 0],
        ["L", ["R", -1]],
        ["T", ["R", 0]],  # a reference into the tuple being read
        ["A", "<i8", [2], 0],  # 3 bytes for 16
        ["A", "|O8", [1], 0],
        ["A", "<i8", [-1], 0],
        ["B", 7],
        ["Q", 1],
        ["D", 1],
        {"a": 1},
        ["f", "1e999"],
        ["O", [2], 2, 0, "string", None, 0, 0],  # 3 bytes of offsets for 2 strings
        ["O", [1], 1, 0, "string", None, None, 0],
        ["O", [1], 1, 0, "binary", None, 0, 0],
        ["C", 0],  # no shapes at all
    ],
)
def test_malformed_documents_are_refused(node: Any) -> None:
    with pytest.raises(SnapshotUnreadable):
        loads(_doc_with(node))


def test_a_document_with_nan_constants_is_refused() -> None:
    _, doc, section = split(dumps([1.0]))
    raw = build(doc, section).replace(b"1.0", b"NaN")
    with pytest.raises(SnapshotUnreadable):
        loads(raw)


def test_the_document_is_json() -> None:
    _, doc, _ = split(dumps({"k": (1, "v")}))
    assert json.loads(json.dumps(doc)) == {
        "root": ["D", "k", ["u", 1, "v"]],
        "classes": [],
        "shapes": [],
        "buffers": [],
    }
