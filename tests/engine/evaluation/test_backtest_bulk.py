"""The backtest's bulk alert writer and ``--strategy scan``.

* :class:`engine.evaluation.alert_lines.AlertWriter` writes exactly the bytes of the per-alert
  writer it replaced (``Changes.rows()`` then one ``json.dumps`` line per alert), for random
  alert sets whose rule names and keys hold characters JSON escapes;
* :class:`engine.evaluation.scan.ScanEvaluator` gives exactly the alerts of ``shared`` on random
  rules (the shapes of samples/rules.jsonl, tests/engine/support.py RULES and random ones) and
  random events, raw and pane-fed.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.evaluation.alert_lines import AlertWriter, alert_line, json_quote
from engine.evaluation.backtest import iter_alerts, iter_changes, make_evaluator
from engine.evaluation.evaluator import Evaluator
from engine.evaluation.rules import Changes
from engine.evaluation.scan import ScanEvaluator
from subscriptions.compiler import compile_rule
from tests.engine.evaluation.test_property import packet_events, rules, to_file, trade_events
from tests.engine.support import RULES
from tidewatch.settings import get_settings

SAMPLES = [
    json.loads(line)["rule"]
    for line in (Path(__file__).resolve().parents[3] / "samples" / "rules.jsonl").read_text().splitlines()
    if line.strip()
]

# strings JSON must escape: quotes, backslashes, control characters, DEL, non-ASCII, astral
TEXT = st.text(
    alphabet=st.sampled_from(
        ['"', "\\", "\x00", "\n", "\t", "\x1f", "\x7f", "é", "€", "😀", "/", " ", "a", "B", "0"]
    )
    | st.characters(blacklist_categories=("Cs",)),
    max_size=6,
)


def old_writer(changes: list[Changes]) -> str:
    """The per-alert writer ``run_backtest`` had: Changes.rows() order, json.dumps per line."""
    out = []
    for ch in changes:
        for as_of, rule, key, kind in ch.rows():
            out.append(json.dumps({"as_of": int(as_of), "rule": rule, "key": key, "kind": kind}) + "\n")
    return "".join(out)


@st.composite
def change_sets(draw: Any) -> list[Changes]:
    names = draw(st.lists(TEXT, min_size=1, max_size=5, unique=True))
    keys = draw(st.lists(TEXT, min_size=1, max_size=12, unique=True))
    out = []
    t = draw(st.integers(-5_000, 2_000_000_000_000))
    for _ in range(draw(st.integers(0, 6))):
        t += draw(st.integers(1, 10_000))
        ch = Changes(t)
        used: set[tuple[str, str]] = set()  # a (rule, key) changes at most once per lookup
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["ENTER", "EXIT"]))
            pairs = [
                p
                for p in draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(keys)), max_size=10))
                if p not in used
            ]
            pairs = list(dict.fromkeys(pairs))
            used.update(pairs)
            copy = draw(st.booleans())  # equal strings as distinct objects, as np.full makes them
            ch.add(
                np.array([("." + p[0])[1:] if copy else p[0] for p in pairs], dtype=object),
                np.array([("." + p[1])[1:] if copy else p[1] for p in pairs], dtype=object),
                kind,
            )
        out.append(ch)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=change_sets(), chunk=st.sampled_from([1, 3, 1 << 18]))
def test_bulk_writer_writes_the_per_alert_bytes(changes: list[Changes], chunk: int) -> None:
    expect = old_writer(changes)
    for buf in (io.StringIO(), io.BytesIO()):  # a text stream, and a binary one (the CLI's)
        w = AlertWriter(buf, chunk=chunk)
        for ch in changes:
            w.add(ch)
        w.flush()
        got = buf.getvalue()
        assert (got if isinstance(got, str) else got.decode("ascii")) == expect
        assert w.count == expect.count("\n")


@given(values=st.lists(TEXT, max_size=20))
def test_json_quote_is_json_dumps(values: list[str]) -> None:
    import pyarrow as pa

    assert json_quote(pa.array(values, pa.string())).to_pylist() == [json.dumps(v) for v in values]


def test_equal_strings_held_by_distinct_objects_sort_as_equal() -> None:
    """np.full(n, name, dtype=object) makes one str object per element (as the evaluator does)."""
    ch = Changes(3000)
    ch.add(np.full(1, "a-sum", dtype=object), np.array(["B"], dtype=object), "ENTER")
    ch.add(np.full(2, "b-count", dtype=object), np.array(["Bb", "Ab"], dtype=object), "ENTER")
    ch.add(np.full(2, "b-count", dtype=object), np.array(["Cb", "Ab"[:1] + "a"], dtype=object), "EXIT")
    assert len({id(x) for x in ch.parts[1][0]}) == 2  # the case under test: distinct objects
    buf = io.StringIO()
    w = AlertWriter(buf)
    w.add(ch)
    w.flush()
    assert buf.getvalue() == old_writer([ch])


def test_lone_surrogate_falls_back_to_the_reference() -> None:
    ch = Changes(7)
    ch.add(np.array(["r", "r"], dtype=object), np.array(["\ud800", "a"], dtype=object), "ENTER")
    buf = io.StringIO()
    w = AlertWriter(buf)
    w.add(ch)
    w.flush()
    assert buf.getvalue() == old_writer([ch])
    assert buf.getvalue().splitlines()[1] == alert_line(7, "r", "\ud800", "ENTER")
    raw = io.BytesIO()  # the reference's lines to a binary stream: ASCII (JSON escapes)
    w = AlertWriter(raw)
    w.add(ch)
    w.flush()
    assert raw.getvalue() == old_writer([ch]).encode("ascii")


# ---------------------------------------------------------------- scan == shared
def _alerts(ev: Any, named: list[tuple[str, str]], files: list[Any], every: int) -> list[tuple[Any, ...]]:
    plans = [(n, t, compile_rule(t, get_settings())) for n, t in named]
    return list(iter_alerts(plans, files, every, evaluator=ev))


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    random_rules=st.lists(rules(), max_size=3),
    fixed=st.lists(st.sampled_from(SAMPLES + list(RULES.values())), max_size=5),
    thresholds=st.lists(
        st.tuples(st.sampled_from(["COUNT(*)", "SUM(size)"]), st.integers(0, 60)), max_size=6
    ),
    trades=trade_events(),
    packets=packet_events(),
    every=st.sampled_from([500, 1000]),
    p=st.sampled_from([1, 2]),
    panes=st.booleans(),
)
def test_scan_equals_shared(
    random_rules: list[str],
    fixed: list[str],
    thresholds: list[tuple[str, int]],
    trades: list[dict[str, Any]],
    packets: list[dict[str, Any]],
    every: int,
    p: int,
    panes: bool,
) -> None:
    # threshold rules on a few windows: many rules read the same aggregates
    texts = random_rules + fixed
    texts += [
        f"SELECT symbol FROM trades GROUP BY symbol HAVING {agg} OVER LAST {1 + thr % 3} SECONDS > {thr}"
        for agg, thr in thresholds
    ]
    if not texts:
        return
    named = [(f"r{i}", t) for i, t in enumerate(texts)]
    files = [to_file("trades", trades), to_file("packets", packets)]
    pane = every if panes else None
    shared = _alerts(Evaluator("shared", ci_p=p, pane_ms=pane), named, files, every)
    scan_ev = ScanEvaluator(ci_p=p, pane_ms=pane)
    scan = _alerts(scan_ev, named, files, every)
    assert scan == shared


def test_scan_computes_each_distinct_aggregate_once_per_lookup() -> None:
    trades = [
        {"symbol": s, "ts": t, "price": 1.0, "size": 10, "side": "BID", "exchange": "X"}
        for t in range(0, 5000, 250)
        for s in ("A", "B", "C")
    ]
    named = [
        (f"c{i}", f"SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 2 SECONDS > {i}")
        for i in range(10)
    ] + [
        (f"s{i}", f"SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 2 SECONDS > {i}")
        for i in range(10)
    ]
    files = [to_file("trades", trades)]
    ev = make_evaluator("scan", 2, pane_ms=1000)
    plans = [(n, t, compile_rule(t, get_settings())) for n, t in named]
    changes = list(iter_changes(plans, files, 1000, ev))
    assert isinstance(ev, ScanEvaluator)
    assert ev.stats["aggregates"] == 2 * len(changes)  # COUNT and SUM, not 20 per lookup
    assert sum(len(c) for c in changes) > 0
    assert _alerts(Evaluator("shared", ci_p=2, pane_ms=1000), named, files, 1000) == [
        r for c in changes for r in c.rows()
    ]
