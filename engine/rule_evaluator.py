"""What the engine's core needs from an evaluator, and the evaluator and rule compiler it uses.

:class:`RuleEvaluator` is the interface :class:`engine.core.EngineCore` talks to (the shared
evaluator, :class:`engine.evaluation.evaluator.Evaluator`; tests give stand-ins);
:func:`make_evaluator` and :func:`rule_compiler` build the engine's from the settings.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from engine.evaluation.rules import Changes
    from tidewatch.settings import Settings

__all__ = ["RuleEvaluator", "Values", "make_evaluator", "rule_compiler"]

#: what :meth:`RuleEvaluator.values` gives per key: aggregate text -> value (None for NULL)
Values = dict[str, float | int | str | None]


class RuleEvaluator(Protocol):
    """What the engine needs from an evaluator: :class:`engine.evaluation.evaluator.Evaluator`
    (tests give stand-ins).  The state it holds is snapshotted with the engine's
    (:meth:`EngineCore.to_bytes`), so it must be made of what :mod:`engine.runtime.state_codec`
    writes (classes of ``engine.``, or registered with its ``allow``)."""

    def add_rule(self, name: str, plan: Any, history: Any = None) -> None: ...
    def remove_rule(self, name: str) -> None: ...
    def apply(self, stream: str, batch: dict[str, np.ndarray]) -> None: ...

    def step(self, now: int, skip: frozenset[str] = ...) -> Changes:
        """Look every rule up at ``now`` but those of ``skip`` (given only when not empty: the
        overload policy's, whose change state stays as it was); the changes of each rule's result
        since its previous lookup (a rule added since then: from an empty result)."""
        ...

    def evaluate_now(self, name: str, now: int) -> set[str]:
        """PSoup: the result of rule ``name`` at ``now`` from the state held, without touching
        the change state :meth:`step` reports against."""
        ...

    def current_ids(self, name: str) -> list[str]:
        """The result of rule ``name`` at its last :meth:`step`, as key values."""
        ...

    def values(self, name: str, keys: Iterable[str], now: int) -> dict[str, Values]:
        """The aggregates rule ``name`` compares, per key at ``now`` (what made an alert fire)."""
        ...

    def values_many(self, wanted: Mapping[str, list[str]], now: int) -> dict[str, dict[str, Values]]:
        """:meth:`values` of many rules at once: ``{rule: {key: values}}``."""
        ...

    @property
    def nbytes(self) -> int:
        """Approximate bytes held."""
        ...


def make_evaluator(settings: Settings) -> RuleEvaluator:
    """The shared-strategy evaluator configured by ``settings``, fed one row per (key, pane)
    (``pane_ms``, Golab et al.'s basic windows): the engine looks up at pane boundaries only,
    so pane rows give the same answers as raw events."""
    from engine.evaluation.evaluator import Evaluator

    return Evaluator(
        strategy="shared",
        ci_p=settings.ci_p,
        history_ms=settings.engine_history_ms,
        pane_ms=settings.pane_ms,
    )


def rule_compiler(settings: Settings) -> Callable[[str, Any], tuple[Any, str]]:
    """The engine's ``compile_rule``: (plan, stream) of a rule, from its JSON plan when given,
    else compiled from its text (with the rule language limits of ``settings``)."""

    def compile_rule(text: str, plan_json: Any) -> tuple[Any, str]:
        from subscriptions import compiler

        if plan_json is not None:
            plan = compiler.Plan.from_json(plan_json if isinstance(plan_json, str) else json.dumps(plan_json))
        else:
            plan = compiler.compile_rule(text, settings)
        return plan, str(plan.stream)

    return compile_rule
