"""engine.runtime.state_capture's CaptureCache: a capture that reuses the nodes of the immutable
objects (the compiled rules) of the previous capture gives the bytes of one that walks them all,
whatever changed between the two (rules added and removed, batches, shared objects met first,
shapes numbered otherwise, the walk's numbering shifted)."""

from __future__ import annotations

import time
import types
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from engine.core import EngineCore
from engine.messages import SubscriptionChange
from engine.runtime.state_capture import CaptureCache, capture, immutable
from engine.runtime.state_codec import StateNotEncodable, allow, dumps, loads
from tests.engine.runtime import test_state_codec as codec_tests

_FIXED_TIME = types.SimpleNamespace(time=lambda: 1_790_000_000.0, localtime=time.gmtime)


@pytest.fixture(autouse=True)
def fixed_zip_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``np.savez`` stamps its zip entries with the time of day: fixed, so that two snapshots of
    one state are the same bytes."""
    monkeypatch.setattr(zipfile, "time", _FIXED_TIME)


@allow
@dataclass
class Frozen:
    a: Any
    b: Any = None


immutable(Frozen)


@allow
@dataclass
class Other:
    x: Any


def _same(root: Any, cache: CaptureCache) -> bytes:
    """The bytes of a capture of ``root`` with ``cache``, checked against one without."""
    data = b"".join(capture(root, cache).finish())
    assert data == dumps(root)
    return data


# ---------------------------------------------------------------- an engine core
@pytest.mark.parametrize("panes", [False, True], ids=["raw", "panes"])
def test_a_core_captured_with_the_cache_gives_the_bytes_of_a_full_walk(panes: bool) -> None:
    batches = codec_tests._batches(seed=5)
    core = codec_tests._core(panes)
    codec_tests._alerts(core, batches[:10], 0)
    cache = CaptureCache()
    rules = len(core.evaluator.rules)  # type: ignore[attr-defined]
    cold = _same(core._state(), cache)
    assert (cache.hits, cache.misses) == (0, rules)
    assert _same(core._state(), cache) == cold  # warm: every plan reused
    assert (cache.hits, cache.misses, cache.moved) == (rules, 0, 0)
    assert b"".join(core.capture().finish()) == core.to_bytes()
    assert b"".join(core.capture().finish()) == core.to_bytes()
    # batches (the walk's numbering shifts: plans renumbered), a rule added at batch 14
    codec_tests._alerts(core, batches[10:16], 10)
    _same(core._state(), cache)
    assert cache.misses == 1 and cache.hits == rules
    # rules removed and replaced (a new plan for a name the cache knew)
    core.process(
        16, batches[16], [SubscriptionChange("count", "delete"), SubscriptionChange("late", "delete")]
    )
    _same(core._state(), cache)
    assert cache.misses == 0 and cache.hits == rules - 1
    text = codec_tests.RULES["sum"].replace("900", "700")
    core.process(17, batches[17], [SubscriptionChange("sum", "upsert", "sum", text, version=2)])
    data = _same(core._state(), cache)
    assert cache.misses == 1 and cache.hits == rules - 2
    for b in range(18, 20):
        core.process(b, batches[b], [])
        data = _same(core._state(), cache)
        assert cache.misses == 0
    restored = EngineCore.from_bytes(data, compile_rule=codec_tests._compile)
    for _ in range(2):
        assert b"".join(restored.capture().finish()) == restored.to_bytes()


def test_a_restored_core_captures_with_the_cache_to_the_same_bytes() -> None:
    core = codec_tests._core(True)
    codec_tests._alerts(core, codec_tests._batches(seed=5)[:8], 0)
    restored = EngineCore.from_bytes(core.to_bytes(), compile_rule=codec_tests._compile)
    for _ in range(2):
        assert b"".join(restored.capture().finish()) == restored.to_bytes()


# ---------------------------------------------------------------- what must not be reused
def test_an_object_of_the_subtree_met_before_it_is_a_reference_not_a_reuse() -> None:
    inner = Other([1, 2, 3])
    f = Frozen(inner, [inner, (4, 5)])
    cache = CaptureCache()
    _same({"f": f}, cache)
    _same({"f": f}, cache)
    assert cache.hits == 1
    _same({"first": inner, "f": f}, cache)  # inner met first: an R node in f's node
    assert (cache.hits, cache.misses) == (0, 1)
    _same({"first": [inner], "f": f, "again": f}, cache)  # inner met first again: reused
    assert (cache.hits, cache.moved) == (1, 1)
    _same({"f": f, "after": inner}, cache)  # inner met in f now
    assert (cache.hits, cache.misses) == (0, 1)
    _same({"f": f, "after": inner}, cache)
    assert cache.hits == 1


def test_a_subtree_pointing_outside_itself_is_reused_one_holding_buffers_is_not() -> None:
    outside = Other("x")
    f = Frozen(outside)
    g = Frozen(np.arange(10), b"bytes")
    h = Frozen(np.array(["a", None], dtype=object))
    cache = CaptureCache()
    _same([outside, f, g, h], cache)
    for _ in range(2):
        _same([outside, f, g, h], cache)
        assert (cache.hits, cache.misses) == (1, 2) and list(cache.entries) == [id(f)]
    _same([f, outside], cache)  # outside not met before f: walked in it
    assert (cache.hits, cache.misses) == (0, 1)
    _same([f, outside], cache)
    assert cache.hits == 1
    _same([(outside,), [f, outside]], cache)
    assert cache.misses == 1


def test_the_numbering_shifts_and_the_shapes_change_between_captures() -> None:
    shared = Other(1.5)
    f = Frozen(shared, {"s": shared, "t": (shared, 2**70), "n": float("nan")})
    cache = CaptureCache()
    _same([f], cache)
    _same([Other([1]), [2], f], cache)  # two more nodes first: renumbered
    assert (cache.hits, cache.moved) == (1, 1)
    _same([f], cache)
    assert (cache.hits, cache.moved) == (1, 0)
    _same([{"Other first": Other(3)}, f], cache)  # Other's shape now numbered before Frozen's
    _same([Frozen(1), f], cache)  # Frozen(a, b) numbered first by another instance
    _same([Other(2), f, f], cache)
    back = loads(_same([f, f], cache))
    assert back[0] is back[1] and back[0].a is back[0].b["s"]


def test_the_strict_document_of_a_reused_subtree() -> None:
    t = ("a", 5)
    f = Frozen([t, t, ("b", 2**70)], (1.5, "s"))
    cache = CaptureCache()
    _same([f, "9" * 5000], cache)
    _same([f, "9" * 5000, 10**5000 + 7], cache)
    assert cache.hits == 1
    _same([t, f, 10**5000 + 7], cache)
    back = loads(dumps([f, 10**5000]))
    assert back[0].a[0] is back[0].a[1]


@settings(max_examples=150, deadline=None)
@given(codec_tests._values, codec_tests._values)
def test_any_values_in_immutable_objects_give_the_bytes_of_a_full_walk(v: Any, w: Any) -> None:
    f, g = Frozen(v, w), Frozen(w)
    cache = CaptureCache()
    for root in ([f], [f, g], [g, f], [w, f, g], [Other(v), [f], {"g": g}], [f, f, g], [f]):
        _same(root, cache)


def test_a_cycle_through_a_tuple_is_refused_with_the_cache_too() -> None:
    f = Frozen(None)
    t = (f, 1)
    f.b = t
    cache = CaptureCache()
    _same([f], cache)
    _same([f], cache)
    assert cache.hits == 1
    for root in ([t], [[t], f]):
        with pytest.raises(StateNotEncodable):
            capture(root, cache)
        with pytest.raises(StateNotEncodable):
            dumps(root)
    _same([f, t], cache)


def test_immutable_objects_inside_immutable_objects() -> None:
    shared = Other([1.5])
    f = Frozen(shared, (shared, 2**70))
    outer = Frozen(f, [f, Other(1), shared])
    cache = CaptureCache()
    roots = ([outer], [f, outer], [[0], outer], [[0], [1], f, outer], [outer, f], [shared, outer], [outer])
    for root in (*roots, *roots[::-1]):
        _same(root, cache)
    _same([f], cache)
    _same([[0], outer], cache)  # f reused (renumbered) in outer's walk, outer cached with it
    _same([[0], [1], outer], cache)
    assert cache.hits == 1 and cache.moved == 1
