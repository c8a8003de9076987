"""Overload by policy: when input outruns the engine, space the lookups of the subscriptions that
declared a staleness budget, loosest budget first, before latency grows for everyone
(docs/engine.md "Overload").  Pure functions and plain data, no I/O: the core
(:class:`engine.core.EngineCore`) holds the controller's state, the app
(:meth:`engine.app.EngineApp._evaluate`) feeds it each batch's load.

**The contract.**  Every event is applied exactly, always; only *when* a subscription is looked up
changes.  A subscription with stride ``k`` is looked up at the lookup times ``tau`` with
``tau % (k * L) == 0`` (``L``: the lookup period, ``engine_lookup_every_ms`` or ``pane_ms``) --
a grid.  Every stride a subscription can have divides its largest, ``M`` (:func:`chain`: the
largest ``2**a * 3**b`` with ``M * L <= budget``), so every multiple of ``M * L`` is one of its
lookup times whatever the strides do from batch to batch, and the gap between two of its lookups
never exceeds ``M * L <= budget``.  (Arbitrary strides would not do: after a lookup at 3 s with
stride 3, a change to stride 4 skips 4 s -- it fell in the stride-3 batch -- and waits until 8 s.)  Its first lookup after it was
added is never skipped; a subscription without a budget always has stride 1 (every lookup); its
changes at a lookup are the changes since its previous lookup (:meth:`Evaluator.step
<engine.evaluation.evaluator.Evaluator.step>`'s ``skip``), so the alert log equals the backtest
at the lookup times actually used (:func:`schedule`, :func:`engine.evaluation.backtest.iter_changes`).

**The controller** (:func:`decide`) keeps one integer, the degradation ``level``; the strides are
a pure function of it and of the active subscriptions' budgets (:func:`strides_at`): the steps of
:func:`ladder` taken in order -- the loosest budget's subscriptions first, their stride raised
step by step (x2, then x3) up to ``M``, then the next budget's -- and undone in reverse.  The load
signal is the batch's *utilisation*: its evaluation time over the trigger interval.  Above
``engine_overload_high`` the level rises by one step per batch; below ``engine_overload_low`` for
``engine_overload_patience`` batches in a row it falls by one (hysteresis: the marks apart, and
patience on the way down).  Utilisation, not the lag behind the wall clock: it does not depend on
the events' clock (a replay, a backfill or a synthetic feed with old timestamps would read as
overload forever), and it rises as soon as the engine cannot finish a batch within its trigger
interval, before the lag grows.  With no budget anywhere the ladder is empty: level 0, no stride,
the engine exactly as without the policy.

**Exact on restart.**  The strides a batch used are committed with it (``engine_batches.strides``)
and a replay of that batch uses them, never a new decision; the level is part of the core's
snapshot (after a restart the decisions go on from the snapshot's level).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidewatch.settings import Settings


@dataclass(frozen=True)
class Marks:
    """The controller's settings: ``engine_overload_high``, ``engine_overload_low``,
    ``engine_overload_patience`` (:meth:`of`)."""

    high: float = 0.9
    low: float = 0.5
    patience: int = 3

    @classmethod
    def of(cls, settings: Settings) -> Marks:
        return cls(
            settings.engine_overload_high, settings.engine_overload_low, settings.engine_overload_patience
        )


@dataclass
class Overload:
    """The controller's state (in the core's snapshot): the degradation level (steps of
    :func:`ladder` taken) and how many batches in a row were below the low mark."""

    level: int = 0
    calm: int = 0


def chain(m: int) -> list[int]:
    """The strides a subscription allowed at most ``m`` lookup periods apart steps through: up to
    the largest ``M = 2**a * 3**b <= m``, doubling ``a`` times then tripling ``b`` times -- each
    divides ``M``, so every multiple of ``M * L`` is a lookup time whatever the stride (the
    grid's bound, module docstring).  Empty for ``m < 2``."""
    best, a = (1, 0, 0), 0
    while 2**a <= m:
        b = 0
        while 2**a * 3**b <= m:
            best = max(best, (2**a * 3**b, a, b))
            b += 1
        a += 1
    out, k = [], 1
    for f in [2] * best[1] + [3] * best[2]:
        k *= f
        out.append(k)
    return out


def ladder(budgets: Mapping[str, int | None], every: int) -> list[tuple[tuple[str, ...], int]]:
    """The steps of degradation in order, each ``(subscriptions, stride)``: per distinct budget,
    loosest first, the subscriptions with that budget through the strides of
    :func:`chain` ``(budget // every)``.  Subscriptions whose budget is below two lookup periods
    (or None) never degrade: no step."""
    classes: dict[int, list[str]] = {}
    for sid, b in budgets.items():
        if b is not None and b // every >= 2:
            classes.setdefault(int(b), []).append(sid)
    return [(tuple(sorted(classes[b])), k) for b in sorted(classes, reverse=True) for k in chain(b // every)]


def strides_at(level: int, budgets: Mapping[str, int | None], every: int) -> dict[str, int]:
    """``{subscription: stride}`` (> 1 only) at degradation ``level``: the first ``level`` steps
    of :func:`ladder`, each raising its subscriptions' stride."""
    out: dict[str, int] = {}
    for sids, k in ladder(budgets, every)[: max(0, level)]:
        out.update(dict.fromkeys(sids, k))
    return out


def batch_strides(
    level: int, budgets: Mapping[str, int], every: int, given: Mapping[str, int] | None = None
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """A batch's strides -- ``given`` (a replay: the ones the batch committed), else those of
    ``level`` (:func:`strides_at`) -- and its degraded subscriptions, each ``{"every_ms": stride *
    every, "budget_ms": its budget}`` (``engine_metrics.degraded``, Health's list)."""
    if given is None:
        given = strides_at(level, budgets, every) if level else {}
    use = {sid: int(k) for sid, k in given.items() if k > 1}
    return use, {s: {"every_ms": k * every, "budget_ms": int(budgets.get(s, 0))} for s, k in use.items()}


def decide(state: Overload, load: float | None, top: int, marks: Marks) -> Overload:
    """The controller's state after a batch of utilisation ``load`` (None: unknown, no change),
    ``top`` the number of steps there are (``len(ladder(...))``): one step up above the high
    mark, one down after ``patience`` batches in a row below the low mark; within ``[0, top]``."""
    level = min(max(state.level, 0), top)
    if top == 0:
        return Overload()
    if load is None:
        return Overload(level, state.calm)
    if load > marks.high:
        return Overload(min(level + 1, top), 0)
    if load < marks.low:
        calm = state.calm + 1
        return Overload(level - 1, 0) if calm >= marks.patience and level > 0 else Overload(level, calm)
    return Overload(level, 0)


def by_stride(strides_: Mapping[str, int]) -> dict[int, frozenset[str]]:
    """The strided subscriptions by stride (what :func:`skipped` reads)."""
    out: dict[int, set[str]] = {}
    for sid, k in strides_.items():
        if k > 1:
            out.setdefault(int(k), set()).add(sid)
    return {k: frozenset(v) for k, v in out.items()}


def skipped(
    groups: Mapping[int, frozenset[str]], tau: int, every: int, exempt: Iterable[str] = ()
) -> frozenset[str]:
    """The subscriptions not looked up at ``tau``: those of stride ``k`` (``groups``, from
    :func:`by_stride`) with ``tau % (k * every) != 0``, but the ``exempt`` ones (first lookups).
    One set operation per distinct stride, nothing per subscription."""
    off = [sids for k, sids in groups.items() if tau % (k * every)]
    if not off:
        return frozenset()
    out = frozenset().union(*off)
    return out.difference(exempt) if exempt else out


def schedule(
    batches: Iterable[tuple[Iterable[int], Mapping[str, int]]],
    every: int,
    first: Mapping[str, int] | None = None,
) -> Callable[[int], frozenset[str]]:
    """The lookup schedule an engine followed, ``tau -> subscriptions skipped at tau`` (the
    backtest's ``skip``, :func:`engine.evaluation.backtest.iter_changes`), from its batches'
    lookup times and the strides each batch recorded (``engine_batches.strides``).  ``first``:
    each subscription's first lookup time (never skipped); None: every subscription was active
    before the first lookup, so nobody is skipped at the earliest lookup time."""
    at: dict[int, dict[int, frozenset[str]]] = {}
    for taus, st in batches:
        groups = by_stride(st)
        for tau in taus:
            at[int(tau)] = groups
    start = min(at, default=0)

    def skip(tau: int) -> frozenset[str]:
        if first is None and tau == start:
            return frozenset()
        off = skipped(at.get(tau, {}), tau, every)
        return frozenset(s for s in off if first is None or first.get(s) != tau)

    return skip
