"""The merged pane rows in the evaluator: ``Evaluator.apply_panes`` fed the executor path gives the
same changes, lookup by lookup, as today's driver feeding raw events to ``Evaluator.apply``.

The pane specs come from the evaluator itself (:func:`engine.executors.preagg.key_specs`), so
this also checks that the specs the driver would ship to the executors are the evaluator's.
Two batches; the second's ``late_until`` is the first's last lookup, pending panes carried
over (:meth:`PanePartial.split` / :meth:`PanePartial.merge`), raw events sent for the stream
with a ROWS window.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.decode import Decoded, empty
from engine.evaluation.evaluator import Evaluator
from engine.executors.merge import PanePartial
from engine.executors.output import preaggregate_here
from engine.executors.preagg import batch_params, key_specs
from engine.executors.reference import driver_path
from subscriptions.compiler import compile_rule
from tests.engine.executors.support import (
    BASE,
    MAX_FUTURE,
    TOPICS,
    G,
    kafka_table,
    next_offsets,
    record_strategy,
)

RULES = {
    "count": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 2 SECONDS > 2",
    "ask": "SELECT symbol FROM trades WHERE side = 'ASK' GROUP BY symbol "
    "HAVING SUM(size) OVER LAST 3 SECONDS >= 5 AND AVG(price) OVER LAST 2 SECONDS < 3",
    "up": "SELECT symbol FROM trades GROUP BY symbol HAVING LAST(price) OVER LAST 2 SECONDS > FIRST(price) OVER LAST 2 SECONDS",
    "range": "SELECT symbol FROM trades GROUP BY symbol "
    "HAVING MAX(price) OVER LAST 3 SECONDS - MIN(price) OVER LAST 3 SECONDS > 1",
    "sides": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(DISTINCT side) OVER LAST 2 SECONDS = 2",
    "rows": "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) FILTER (WHERE side = 'BID') OVER LAST 3 ROWS > 5",
    "syn": "SELECT dst_ip FROM packets WHERE protocol = 'TCP' GROUP BY dst_ip HAVING COUNT(*) OVER LAST 2 SECONDS >= 2",
    "heavy": "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST 2 SECONDS > 20",
    "scan": "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST 3 SECONDS >= 2",
}


def _compile(text: str) -> Any:
    if len(inspect.signature(compile_rule).parameters) > 1:
        from tidewatch.settings import get_settings

        return compile_rule(text, get_settings())  # type: ignore[call-arg]
    return compile_rule(text)  # type: ignore[call-arg]


def _evaluator() -> Evaluator:
    ev = Evaluator("shared", ci_p=2, pane_ms=G)
    for name, text in RULES.items():
        ev.add_rule(name, _compile(text))
    return ev


def _concat(a: Decoded, b: Decoded) -> Decoded:
    if not len(a):
        return b
    if not len(b):
        return a
    return Decoded(
        a.stream,
        {k: np.concatenate([a.columns[k], b.columns[k]]) for k in a.columns},
        np.concatenate([a.partition, b.partition]),
        np.concatenate([a.offset, b.offset]),
    )


def _sorted(d: Decoded) -> Decoded:
    return d.take(np.argsort(d.ts, kind="stable")) if len(d) else d


def test_key_specs_are_the_evaluators_pane_specs() -> None:
    ev = _evaluator()
    specs, raw = key_specs(ev)
    assert {(k.stream, k.key) for k in specs} == {
        ("trades", "symbol"),
        ("packets", "dst_ip"),
        ("packets", "src_ip"),
    }
    assert raw == {"trades"}  # the ROWS window
    for ks in specs:
        spec = ev.pane_spec(ks.stream, ks.key)
        assert [s.name for s in ks.sets] == [c.name for c in spec.column_sets]
        for s, c in zip(ks.sets, spec.column_sets, strict=True):
            assert (s.sums, s.minmax, s.firstlast, s.distinct) == (c.sums, c.minmax, c.firstlast, c.distinct)
            assert (s.predicate is None) == (c.predicate is None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=st.lists(record_strategy(), min_size=0, max_size=60),
    second=st.lists(record_strategy(), min_size=0, max_size=60),
    cut=st.sampled_from([BASE + 1000, BASE + 2000]),
)
def test_apply_panes_of_the_executor_path_equals_raw_events(
    first: list[Any], second: list[Any], cut: int
) -> None:
    t1 = kafka_table(first, seed=3)
    t2 = kafka_table(second, next_offsets(t1), seed=4)
    batches = [(t1, None, [BASE, cut]), (t2, cut, list(range(cut + G, BASE + 8 * G, G)))]
    old, new = _evaluator(), _evaluator()
    bare = _evaluator()  # fed the same pane rows without their key codes: ids hashed per row
    specs, raw_streams = key_specs(new)
    pend_raw = {s: empty(s) for s in TOPICS}  # today's pending events
    pend_panes = {(k.stream, k.key): PanePartial.empty(k) for k in specs}
    pend_new_raw = {s: empty(s) for s in TOPICS}
    for b, (tbl, late_until, taus) in enumerate(batches):
        p = batch_params(
            pane_ms=G,
            topics=TOPICS,
            max_future_ms=MAX_FUTURE,
            panes=specs,
            late_until=late_until,
            raw_streams=raw_streams,
        )
        ref = driver_path(tbl, p)
        out = preaggregate_here(tbl, p, batch=b)
        for s in TOPICS:
            pend_raw[s] = _sorted(_concat(pend_raw[s], ref.decoded[s]))
        for ks in specs:
            k = (ks.stream, ks.key)
            pend_panes[k] = PanePartial.merge([pend_panes[k], out.panes[k]])
        for s in raw_streams:
            pend_new_raw[s] = _sorted(_concat(pend_new_raw[s], out.raw[s]))
        for tau in taus:
            for s in TOPICS:  # today: raw events with ts <= tau
                d = pend_raw[s]
                due = d.ts <= tau
                if due.any():
                    old.apply(s, d.take(due).columns)
                pend_raw[s] = d.take(~due)
            raw_due: dict[str, dict[str, np.ndarray] | None] = {}
            for s in raw_streams:
                d = pend_new_raw[s]
                due = d.ts <= tau
                raw_due[s] = d.take(due).columns if due.any() else None
                pend_new_raw[s] = d.take(~due)
            for ks in specs:  # the executor path: pane rows with pane <= tau
                k = (ks.stream, ks.key)
                due_rows, pend_panes[k] = pend_panes[k].split(tau)
                if len(due_rows):
                    rows = due_rows.pane_rows()
                    assert rows.key_codes is not None
                    new.apply_panes(ks.stream, rows, key=ks.key, raw=raw_due.get(ks.stream))
                    rows = dataclasses.replace(rows, key_codes=None)
                    bare.apply_panes(ks.stream, rows, key=ks.key, raw=raw_due.get(ks.stream))
            a, c = old.step(tau).rows(), new.step(tau).rows()
            assert a == c, (b, tau)
            assert bare.step(tau).rows() == c, (b, tau)
            cur = {n: sorted(old.current_ids(n)) for n in RULES}
            assert cur == {n: sorted(new.current_ids(n)) for n in RULES}
            wanted = {n: keys for n, keys in cur.items() if keys}
            if wanted:
                assert old.values_many(wanted, tau) == new.values_many(wanted, tau)
    # the same key ids as from the keys hashed per row, and the retained rows hold no key codes
    assert {k: s._ids for k, s in new.states.items()} == {k: s._ids for k, s in bare.states.items()}
    assert all(r.key_codes is None for us in new._history.units.values() for u in us for r in u.rows.values())
