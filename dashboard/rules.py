"""Rule editor logic: templates (the examples of RULES.md), live validation, the plan, thresholds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from subscriptions import rule_ast as A
from subscriptions.compiler import Plan, compile_rule, const_value, explain
from subscriptions.errors import RuleError
from tidewatch.settings import Settings

#: The "examples that must work" of RULES.md, offered as templates in the editor.
TEMPLATES: dict[str, str] = {
    "Volume over 5 minutes (Arasu & Widom, Example 2.1)": (
        "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 300 SECONDS > 1000"
    ),
    "NASDAQ short-term downward momentum (Traderbot)": (
        "SELECT symbol FROM trades WHERE exchange = 'NASDAQ' GROUP BY symbol\n"
        "HAVING LAST(price) OVER LAST 20 MINUTES BETWEEN 20 AND 200\n"
        "   AND LAST(price) OVER LAST 20 MINUTES < 0.98 * FIRST(price) OVER LAST 20 MINUTES\n"
        "   AND SUM(size) FILTER (WHERE side = 'ASK') OVER LAST 2 MINUTES >= 0.7 * SUM(size) OVER LAST 2 MINUTES"
    ),
    "High volatility with recent volume surge (Traderbot)": (
        "SELECT symbol FROM trades GROUP BY symbol\n"
        "HAVING LAST(price) OVER LAST 30 MINUTES BETWEEN 20 AND 200\n"
        "   AND MAX(price) OVER LAST 30 MINUTES - MIN(price) OVER LAST 30 MINUTES > 0.03 * LAST(price) OVER LAST 30 MINUTES\n"
        "   AND AVG(size) OVER LAST 5 MINUTES > 4 * AVG(size) OVER LAST 30 MINUTES"
    ),
    "Average size 1 to 2 minutes ago (historical window)": (
        "SELECT symbol FROM trades GROUP BY symbol HAVING AVG(size) OVER 2 MINUTES TO 1 MINUTE AGO > 500"
    ),
    "SYN flood towards a host": (
        "SELECT dst_ip FROM packets WHERE protocol = 'TCP' AND tcp_flags = 'S'\n"
        "GROUP BY dst_ip HAVING COUNT(*) OVER LAST 10 SECONDS > 500"
    ),
    "Port scan": (
        "SELECT src_ip FROM packets GROUP BY src_ip HAVING COUNT(DISTINCT dst_port) OVER LAST 60 SECONDS > 100"
    ),
    "Heavy hitter": (
        "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST 1 MINUTE > 10000000"
    ),
}

#: The demo account's subscriptions (``tidewatch up``): the trade templates, the volume one with a
#: threshold for the demo feed (docs/feeds.md, "Demo feed"): RULES.md's ``> 1000`` over 5 minutes
#: held for 1,633 of its 3,000 symbols (≈ 570 alerts a minute); ``> 60000``, for about 30.
DEMO_SUBSCRIPTIONS: dict[str, str] = {
    name: text.replace("OVER LAST 300 SECONDS > 1000", "OVER LAST 300 SECONDS > 60000")
    for name, text in TEMPLATES.items()
    if " FROM trades" in text
}


@dataclass(frozen=True)
class Threshold:
    """``aggregate op value`` taken from one comparison of a rule (for charts)."""

    aggregate: str
    op: str
    value: float


@dataclass
class Validation:
    ok: bool
    plan: Plan | None = None
    explain: str = ""
    message: str = ""
    line: int = 0
    column: int = 0
    display: str = ""
    expected: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """One line: ``line L, column C: message``."""
        return (
            f"line {self.line}, column {self.column}: {self.message}" if not self.ok else "the rule is valid"
        )


def validate(text: str, settings: Settings) -> Validation:
    """Parse, type-check and compile ``text`` (limits: ``settings.max_rule_*``); the parser's
    message and position on failure."""
    limit = settings.max_rule_chars
    if not text or not text.strip():
        return Validation(False, message="the rule is empty", line=1, column=1, display="the rule is empty")
    if len(text) > limit:
        msg = f"the rule is {len(text)} characters long; the limit is {limit}"
        return Validation(False, message=msg, line=1, column=1, display=msg)
    try:
        plan = compile_rule(text, settings)
    except RuleError as err:
        return Validation(
            False,
            message=err.message,
            line=err.line,
            column=err.column,
            display=err.display(),
            expected=list(err.expected),
        )
    except RecursionError:
        msg = "the rule is nested too deeply"
        return Validation(False, message=msg, line=1, column=1, display=msg)
    return Validation(True, plan=plan, explain=explain(plan))


_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "=": "=", "!=": "!="}


def thresholds(plan: Plan) -> list[Threshold]:
    """Every comparison of an aggregate with a constant (``SUM(size) OVER ... > 1000``), as
    ``(aggregate text, op, value)`` with the aggregate on the left; NOT-ed comparisons skipped."""
    out: list[Threshold] = []
    for atom in plan.atoms:
        if atom.negated:
            continue
        left, right, op = atom.left, atom.right, atom.op
        if isinstance(right, A.Agg) and not isinstance(left, A.Agg):
            left, right, op = right, left, _FLIP.get(op, op)
        if not isinstance(left, A.Agg):
            continue
        c = const_value(right)
        if c is None or math.isnan(c):
            continue
        out.append(Threshold(plan.aggs[plan.agg_id(left)].text, op, float(c)))
    return out
