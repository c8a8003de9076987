"""Type checker of rules: streams, fields, argument kinds, literal types, and size limits.

Runs on the AST of :mod:`subscriptions.rule_parser`; every problem is a
:class:`~subscriptions.errors.RuleError` at the position of the offending node.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from subscriptions import rule_ast as A
from subscriptions.errors import RuleError
from tidewatch.schema import STREAMS, FieldSpec, StreamSpec

if TYPE_CHECKING:
    from tidewatch.settings import Settings

#: aggregate functions that need a numeric field
_NUMERIC_FUNCS = {"SUM", "AVG", "MIN", "MAX", "FIRST", "LAST"}


def _suggest(name: str, options: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class _Checker:
    def __init__(self, rule: A.Rule, text: str, settings: Settings) -> None:
        self.rule = rule
        self.text = text
        self.settings = settings
        self.positions: dict[str, A.Pos] = getattr(rule, "_positions", {})

    def err(self, msg: str, pos: A.Pos, expected: list[str] | tuple[str, ...] = ()) -> RuleError:
        return RuleError.at(self.text, msg, pos, expected)

    # ------------------------------------------------------------------ rule
    def check(self) -> None:
        r = self.rule
        spec = STREAMS.get(r.stream)
        if spec is None:
            raise self.err(
                f"unknown stream {r.stream!r}{_suggest(r.stream, list(STREAMS))}",
                self.positions.get("stream"),
                sorted(STREAMS),
            )
        self.spec = spec
        if r.key not in spec.keys:
            what = "unknown field" if r.key not in spec.fields else "field"
            raise self.err(
                f"{what} {r.key!r} cannot be the key of {spec.name}{_suggest(r.key, spec.keys)}",
                self.positions.get("key"),
                [f"a key of {spec.name}: {', '.join(spec.keys)}"],
            )
        group = getattr(r, "_group_key", r.key)
        if group != r.key:
            raise self.err(
                f"GROUP BY {group} must name the selected key {r.key}",
                self.positions.get("group"),
                [r.key],
            )
        if r.where is not None:
            self.row(r.where)
        aggs = A.iter_aggs(r.having)
        limit = self.settings.max_rule_aggregates
        if len(aggs) > limit:
            raise self.err(
                f"rule has {len(aggs)} aggregates; the limit is {limit}",
                aggs[limit].pos,
                [f"at most {limit} aggregates"],
            )
        if not aggs:
            raise self.err(
                "HAVING needs at least one aggregate (e.g. COUNT(*) OVER LAST 1 MINUTE)",
                r.having.pos,
                ["an aggregate"],
            )
        self.cond(r.having)

    # ------------------------------------------------------------------ fields
    def field(self, name: str, pos: A.Pos) -> FieldSpec:
        f = self.spec.fields.get(name)
        if f is None:
            raise self.err(
                f"unknown field {name!r} on {self.spec.name}{_suggest(name, list(self.spec.fields))}",
                pos,
                [f"a field of {self.spec.name}: {', '.join(self.spec.fields)}"],
            )
        return f

    def literal(self, f: FieldSpec, value: Any, pos: A.Pos, op: str = "=") -> None:
        """Check one literal against the field's type (pos: the literal's position)."""
        if f.numeric and isinstance(value, str):
            raise self.err(
                f"field {f.name!r} is a number; it cannot be compared with the string {value!r}",
                pos,
                ["a number"],
            )
        if not f.numeric and not isinstance(value, str):
            raise self.err(
                f"field {f.name!r} is a string; compare it with a quoted string, not {A.fmt_num(value)}",
                pos,
                ["a string in single quotes"],
            )
        if f.values is not None and op in ("=", "!=") and value not in f.values:
            raise self.err(
                f"{value!r} is not a possible value of {f.name!r}",
                pos,
                [f.values_text or ", ".join(repr(v) for v in f.values)],
            )

    def row(self, c: A.RowCond) -> None:
        if isinstance(c, A.RowCmp):
            f = self.field(c.field, c.pos)
            self.literal(f, c.value, _lp(c, 0), c.op)
        elif isinstance(c, A.RowIn):
            f = self.field(c.field, c.pos)
            for i, v in enumerate(c.values):
                self.literal(f, v, _lp(c, i))
        elif isinstance(c, A.RowBetween):
            f = self.field(c.field, c.pos)
            self.literal(f, c.lo, _lp(c, 0), "between")
            self.literal(f, c.hi, _lp(c, 1), "between")
        elif isinstance(c, (A.RowAnd, A.RowOr)):
            for x in c.items:
                self.row(x)
        elif isinstance(c, A.RowNot):
            self.row(c.item)

    # ------------------------------------------------------------------ HAVING
    def cond(self, c: A.Cond) -> None:
        if isinstance(c, A.Cmp):
            self.expr(c.left)
            self.expr(c.right)
        elif isinstance(c, A.Between):
            self.expr(c.expr)
            self.expr(c.lo)
            self.expr(c.hi)
        elif isinstance(c, (A.And, A.Or)):
            for x in c.items:
                self.cond(x)
        elif isinstance(c, A.Not):
            self.cond(c.item)

    def expr(self, e: A.Expr) -> None:
        if isinstance(e, A.Agg):
            self.agg(e)
        elif isinstance(e, A.BinOp):
            self.expr(e.left)
            self.expr(e.right)
        elif isinstance(e, A.Neg):
            self.expr(e.operand)

    def agg(self, a: A.Agg) -> None:
        if a.field is None and a.func != "COUNT":
            raise self.err(f"{a.func}(*) is not allowed; only COUNT(*)", a.pos, [f"{a.func}(field)"])
        if a.distinct and a.func != "COUNT":
            raise self.err(
                f"DISTINCT is only allowed in COUNT, not in {a.func}", a.pos, ["COUNT(DISTINCT field)"]
            )
        if a.field is None and a.distinct:
            raise self.err("COUNT(DISTINCT *) is not allowed; name a field", a.arg_pos or a.pos, ["a field"])
        if a.field is not None:
            f = self.field(a.field, a.arg_pos or a.pos)
            if a.func in _NUMERIC_FUNCS and not f.numeric:
                numeric = [n for n, s in self.spec.fields.items() if s.numeric]
                raise self.err(
                    f"{a.func}({a.field}) needs a numeric field; {a.field!r} is a string",
                    a.pos,
                    [f"a numeric field of {self.spec.name}: {', '.join(numeric)}"],
                )
        if a.filter is not None:
            self.row(a.filter)


def _lp(c: Any, i: int) -> A.Pos:
    lp = getattr(c, "lit_pos", ())
    return lp[i] if i < len(lp) and lp[i] is not None else c.pos


def check_rule(rule: A.Rule, text: str, settings: Settings) -> None:
    """Raise RuleError if the rule is not well-typed (see module docstring; limits:
    ``settings.max_rule_aggregates``)."""
    _Checker(rule, text, settings).check()


def stream_spec(rule: A.Rule) -> StreamSpec:
    return STREAMS[rule.stream]
