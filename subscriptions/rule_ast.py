"""Typed AST of a rule (RULES.md grammar), produced by :mod:`subscriptions.rule_parser`.

All nodes are frozen dataclasses; ``pos`` (line, column) of the node's first token is kept
for error messages and excluded from equality, hashing and :func:`canonical` text, so two
rules that differ only in layout or keyword case have equal ASTs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from dataclasses import field as dc_field
from typing import Any

Pos = tuple[int, int] | None

#: comparison operators, normalized (``<>`` is parsed as ``!=``)
OPS = (">", ">=", "<", "<=", "=", "!=")
#: op -> op with the operands swapped (a op b  <=>  b swap[op] a)
SWAP = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "=": "=", "!=": "!="}
#: op -> negated op (two-valued, for operands that are never NULL)
NEGATE = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "=": "!=", "!=": "="}

UNIT_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}


def _pos() -> Any:
    return dc_field(default=None, compare=False, repr=False)


# ---------------------------------------------------------------- row conditions (WHERE / FILTER)
@dataclass(frozen=True)
class RowCmp:
    """``field op literal``."""

    field: str
    op: str
    value: str | float
    pos: Pos = _pos()
    lit_pos: tuple[Pos, ...] = dc_field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class RowIn:
    """``field IN (literal, ...)``."""

    field: str
    values: tuple[str | float, ...]
    pos: Pos = _pos()
    lit_pos: tuple[Pos, ...] = dc_field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class RowBetween:
    """``field BETWEEN lo AND hi`` (closed)."""

    field: str
    lo: str | float
    hi: str | float
    pos: Pos = _pos()
    lit_pos: tuple[Pos, ...] = dc_field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class RowAnd:
    items: tuple[RowCond, ...]
    pos: Pos = _pos()


@dataclass(frozen=True)
class RowOr:
    items: tuple[RowCond, ...]
    pos: Pos = _pos()


@dataclass(frozen=True)
class RowNot:
    item: RowCond
    pos: Pos = _pos()


RowCond = RowCmp | RowIn | RowBetween | RowAnd | RowOr | RowNot


# ---------------------------------------------------------------- windows
@dataclass(frozen=True)
class TimeWindow:
    """Time-based window ``(now - start_ms, now - end_ms]``; ``end_ms == 0`` is a suffix window."""

    start_ms: int
    end_ms: int = 0
    pos: Pos = _pos()

    @property
    def suffix(self) -> bool:
        return self.end_ms == 0


@dataclass(frozen=True)
class RowsWindow:
    """Tuple-based window: the key's last ``n`` events (after WHERE and FILTER)."""

    n: int
    pos: Pos = _pos()


Window = TimeWindow | RowsWindow


# ---------------------------------------------------------------- value expressions
@dataclass(frozen=True)
class Num:
    value: float
    pos: Pos = _pos()


@dataclass(frozen=True)
class Agg:
    """``FUNC(arg) [FILTER (WHERE rowcond)] OVER window``; ``field`` is None for ``COUNT(*)``."""

    func: str  # COUNT SUM AVG MIN MAX FIRST LAST
    field: str | None
    distinct: bool
    filter: RowCond | None
    window: Window
    pos: Pos = _pos()
    arg_pos: Pos = dc_field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * /
    left: Expr
    right: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class Neg:
    operand: Expr
    pos: Pos = _pos()


Expr = Num | Agg | BinOp | Neg


# ---------------------------------------------------------------- HAVING conditions
@dataclass(frozen=True)
class Cmp:
    op: str
    left: Expr
    right: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class Between:
    """``expr BETWEEN lo AND hi`` == ``expr >= lo AND expr <= hi`` (two-valued)."""

    expr: Expr
    lo: Expr
    hi: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class And:
    items: tuple[Cond, ...]
    pos: Pos = _pos()


@dataclass(frozen=True)
class Or:
    items: tuple[Cond, ...]
    pos: Pos = _pos()


@dataclass(frozen=True)
class Not:
    item: Cond
    pos: Pos = _pos()


Cond = Cmp | Between | And | Or | Not


@dataclass(frozen=True)
class Rule:
    """A whole rule: ``SELECT key FROM stream [WHERE rowcond] GROUP BY key HAVING cond``."""

    stream: str
    key: str
    where: RowCond | None
    having: Cond
    pos: Pos = _pos()


NODE_TYPES: dict[str, type] = {
    c.__name__: c
    for c in (
        RowCmp,
        RowIn,
        RowBetween,
        RowAnd,
        RowOr,
        RowNot,
        TimeWindow,
        RowsWindow,
        Num,
        Agg,
        BinOp,
        Neg,
        Cmp,
        Between,
        And,
        Or,
        Not,
        Rule,
    )
}


# ---------------------------------------------------------------- (de)serialization
def to_json(node: Any) -> Any:
    """A JSON-able form of an AST node (positions dropped), tagged with the node type."""
    if is_dataclass(node) and not isinstance(node, type):
        out: dict[str, Any] = {"node": type(node).__name__}
        for f in fields(node):
            if f.name in ("pos", "lit_pos", "arg_pos"):
                continue
            out[f.name] = to_json(getattr(node, f.name))
        return out
    if isinstance(node, tuple):
        return [to_json(x) for x in node]
    return node


def from_json(data: Any) -> Any:
    """Inverse of :func:`to_json`."""
    if isinstance(data, dict) and "node" in data:
        cls = NODE_TYPES[data["node"]]
        kwargs = {k: from_json(v) for k, v in data.items() if k != "node"}
        for k, v in kwargs.items():
            if isinstance(v, list):
                kwargs[k] = tuple(v)
        return cls(**kwargs)
    if isinstance(data, list):
        return tuple(from_json(x) for x in data)
    return data


# ---------------------------------------------------------------- canonical text
def _lit(v: str | float) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return fmt_num(v)


def fmt_num(v: float) -> str:
    """Shortest text of a number (integers without a fraction)."""
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def fmt_ms(ms: int) -> str:
    """A duration in the largest unit that divides it."""
    for unit in ("day", "hour", "minute", "second"):
        u = UNIT_MS[unit]
        if ms % u == 0 and ms >= u:
            n = ms // u
            return f"{n} {unit.upper()}{'S' if n != 1 else ''}"
    return f"{ms} MILLISECOND{'S' if ms != 1 else ''}"


def row_text(c: RowCond | None) -> str:
    """Canonical text of a row condition (``TRUE`` for none)."""
    if c is None:
        return "TRUE"
    if isinstance(c, RowCmp):
        return f"{c.field} {c.op} {_lit(c.value)}"
    if isinstance(c, RowIn):
        return f"{c.field} IN ({', '.join(_lit(v) for v in c.values)})"
    if isinstance(c, RowBetween):
        return f"{c.field} BETWEEN {_lit(c.lo)} AND {_lit(c.hi)}"
    if isinstance(c, RowAnd):
        return " AND ".join(_paren_row(x, RowOr) for x in c.items)
    if isinstance(c, RowOr):
        return " OR ".join(row_text(x) for x in c.items)
    if isinstance(c, RowNot):
        return "NOT " + _paren_row(c.item, (RowAnd, RowOr))
    raise TypeError(c)


def _paren_row(c: RowCond, kinds: Any) -> str:
    t = row_text(c)
    return f"({t})" if isinstance(c, kinds) else t


def window_text(w: Window) -> str:
    if isinstance(w, RowsWindow):
        return f"LAST {w.n} ROWS"
    if w.suffix:
        return f"LAST {fmt_ms(w.start_ms)}"
    return f"{fmt_ms(w.start_ms)} TO {fmt_ms(w.end_ms)} AGO"


def expr_text(e: Expr) -> str:
    if isinstance(e, Num):
        return fmt_num(e.value)
    if isinstance(e, Agg):
        arg = "*" if e.field is None else (f"DISTINCT {e.field}" if e.distinct else e.field)
        flt = f" FILTER (WHERE {row_text(e.filter)})" if e.filter is not None else ""
        return f"{e.func}({arg}){flt} OVER {window_text(e.window)}"
    if isinstance(e, Neg):
        return "-" + _paren_expr(e.operand)
    if isinstance(e, BinOp):
        return f"{_paren_expr(e.left)} {e.op} {_paren_expr(e.right)}"
    raise TypeError(e)


def _paren_expr(e: Expr) -> str:
    t = expr_text(e)
    return f"({t})" if isinstance(e, (BinOp, Neg)) else t


def cond_text(c: Cond) -> str:
    if isinstance(c, Cmp):
        return f"{expr_text(c.left)} {c.op} {expr_text(c.right)}"
    if isinstance(c, Between):
        return f"{expr_text(c.expr)} BETWEEN {expr_text(c.lo)} AND {expr_text(c.hi)}"
    if isinstance(c, And):
        return " AND ".join(f"({cond_text(x)})" if isinstance(x, Or) else cond_text(x) for x in c.items)
    if isinstance(c, Or):
        return " OR ".join(cond_text(x) for x in c.items)
    if isinstance(c, Not):
        inner = cond_text(c.item)
        return f"NOT ({inner})"
    raise TypeError(c)


def rule_text(r: Rule) -> str:
    """Canonical one-line text of a rule (re-parses to an equal AST)."""
    where = f" WHERE {row_text(r.where)}" if r.where is not None else ""
    return f"SELECT {r.key} FROM {r.stream}{where} GROUP BY {r.key} HAVING {cond_text(r.having)}"


def iter_aggs(node: Any) -> list[Agg]:
    """Every aggregate of a condition / expression, in textual order (duplicates kept)."""
    out: list[Agg] = []

    def walk(n: Any) -> None:
        if isinstance(n, Agg):
            out.append(n)
        elif isinstance(n, (Cmp, BinOp)):
            walk(n.left)
            walk(n.right)
        elif isinstance(n, Between):
            walk(n.expr)
            walk(n.lo)
            walk(n.hi)
        elif isinstance(n, (And, Or)):
            for x in n.items:
                walk(x)
        elif isinstance(n, Not):
            walk(n.item)
        elif isinstance(n, Neg):
            walk(n.operand)

    walk(node)
    return out
