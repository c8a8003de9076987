"""Parser of the rule language (RULES.md core grammar) with lark's LALR(1) parser.

:func:`parse_rule` turns rule text into the typed AST of :mod:`subscriptions.rule_ast` and runs
the type checker (:mod:`subscriptions.typecheck`); every failure is a
:class:`~subscriptions.errors.RuleError` naming line, column and what was expected.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lark import Lark, Token, Transformer_NonRecursive, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from subscriptions import rule_ast as A
from subscriptions.errors import RuleError

if TYPE_CHECKING:
    from tidewatch.settings import Settings

_GRAMMAR = Path(__file__).with_name("grammar.lark")

#: readable names of the grammar's terminals, for "expected ..." lists
_TERMINAL_NAMES = {
    "COMPOP": "a comparison operator (>, >=, <, <=, =, !=)",
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string in single quotes",
    "UNIT": "a time unit (SECONDS, MINUTES, HOURS, DAYS)",
    "ROWS": "ROWS",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "STAR": "'*'",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "SLASH": "'/'",
    "$END": "the end of the rule",
}


def _readable(terminals: Any) -> list[str]:
    names = {_TERMINAL_NAMES.get(t, t) for t in terminals}
    order = {"the end of the rule": 1}
    return sorted(names, key=lambda s: (order.get(s, 0), s.lower()))


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(
        _GRAMMAR.read_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def _pos_of(x: Any) -> A.Pos:
    if isinstance(x, Token):
        return (int(x.line), int(x.column)) if x.line is not None and x.column is not None else None
    meta = getattr(x, "meta", None)
    if meta is not None and not getattr(meta, "empty", True):
        return (meta.line, meta.column)
    return None


def _unquote(s: str) -> str:
    return s[1:-1].replace("''", "'")


class _Build(Transformer_NonRecursive):
    """Tree -> AST.  Names are case-insensitive (lower-cased); windows are converted to ms."""

    def __init__(self, text: str, settings: Settings) -> None:
        super().__init__()
        self.text = text
        self.settings = settings

    def err(self, msg: str, pos: A.Pos, expected: list[str] | tuple[str, ...] = ()) -> RuleError:
        return RuleError.at(self.text, msg, pos, expected)

    # --- names and literals
    def name(self, items: list[Token]) -> Token:
        tok = items[0]
        return tok.update(value=str(tok).lower())

    def lit_string(self, items: list[Token]) -> tuple[str, A.Pos]:
        return (_unquote(items[0]), _pos_of(items[0]))

    def _finite(self, tok: Token) -> float:
        v = float(tok)
        if not math.isfinite(v):
            raise self.err(f"number {tok} is too large", _pos_of(tok), ["a finite number"])
        return v

    def lit_number(self, items: list[Token]) -> tuple[float, A.Pos]:
        return (self._finite(items[0]), _pos_of(items[0]))

    def lit_negnumber(self, items: list[Token]) -> tuple[float, A.Pos]:
        return (-self._finite(items[-1]), _pos_of(items[-1]))

    # --- row conditions
    def row_cmp(self, items: list[Any]) -> A.RowCmp:
        name, op, (value, vpos) = items
        return A.RowCmp(str(name), _op(op), value, pos=_pos_of(name), lit_pos=(vpos,))

    def row_in(self, items: list[Any]) -> A.RowIn:
        name = items[0]
        lits = [x for x in items[2:] if isinstance(x, tuple)]
        vals = tuple(v for v, _ in lits)
        return A.RowIn(str(name), vals, pos=_pos_of(name), lit_pos=tuple(p for _, p in lits))

    def row_between(self, items: list[Any]) -> A.RowBetween:
        name, _kw, (lo, lpos), _and, (hi, hpos) = items
        return A.RowBetween(str(name), lo, hi, pos=_pos_of(name), lit_pos=(lpos, hpos))

    @v_args(meta=True)
    def row_and(self, meta: Any, items: list[Any]) -> A.RowAnd:
        parts = [x for x in items if not isinstance(x, Token)]
        return A.RowAnd(_flatten(parts, A.RowAnd), pos=(meta.line, meta.column))

    @v_args(meta=True)
    def row_or(self, meta: Any, items: list[Any]) -> A.RowOr:
        parts = [x for x in items if not isinstance(x, Token)]
        return A.RowOr(_flatten(parts, A.RowOr), pos=(meta.line, meta.column))

    def row_not(self, items: list[Any]) -> A.RowNot:
        return A.RowNot(items[1], pos=_pos_of(items[0]))

    def where(self, items: list[Any]) -> Any:
        return items[1]

    def filter(self, items: list[Any]) -> Any:
        return items[2]

    # --- expressions
    def num(self, items: list[Token]) -> A.Num:
        return A.Num(self._finite(items[0]), pos=_pos_of(items[0]))

    @v_args(meta=True)
    def neg(self, meta: Any, items: list[Any]) -> A.Neg:
        return A.Neg(items[-1], pos=(meta.line, meta.column))

    def _bin(self, op: str, meta: Any, items: list[Any]) -> A.BinOp:
        return A.BinOp(op, items[0], items[-1], pos=(meta.line, meta.column))

    @v_args(meta=True)
    def add(self, meta: Any, items: list[Any]) -> A.BinOp:
        return self._bin("+", meta, items)

    @v_args(meta=True)
    def sub(self, meta: Any, items: list[Any]) -> A.BinOp:
        return self._bin("-", meta, items)

    @v_args(meta=True)
    def mul(self, meta: Any, items: list[Any]) -> A.BinOp:
        return self._bin("*", meta, items)

    @v_args(meta=True)
    def div(self, meta: Any, items: list[Any]) -> A.BinOp:
        return self._bin("/", meta, items)

    def func(self, items: list[Token]) -> Token:
        return items[0]

    @v_args(meta=True)
    def arg_star(self, meta: Any, items: list[Any]) -> tuple[None, bool, A.Pos]:
        return (None, False, (meta.line, meta.column) if not meta.empty else None)

    def arg_field(self, items: list[Any]) -> tuple[str, bool, A.Pos]:
        return (str(items[0]), False, _pos_of(items[0]))

    def arg_distinct(self, items: list[Any]) -> tuple[str, bool, A.Pos]:
        return (str(items[1]), True, _pos_of(items[1]))

    def agg(self, items: list[Any]) -> A.Agg:
        func = items[0]
        field, distinct, apos = items[1]
        rest = [x for x in items[2:] if not isinstance(x, Token)]
        flt = rest[0] if len(rest) == 2 else None
        window = rest[-1]
        return A.Agg(str(func).upper(), field, distinct, flt, window, pos=_pos_of(func), arg_pos=apos)

    # --- windows
    def _count(self, tok: Token, what: str, allow_zero: bool = False) -> float:
        v = float(tok)
        if v < 0 or (v == 0 and not allow_zero):
            raise self.err(f"{what} must be positive", _pos_of(tok), ["a positive number"])
        return v

    def _ms(self, n_tok: Token, unit_tok: Token, allow_zero: bool = False) -> int:
        n = self._count(n_tok, "a window length", allow_zero)
        unit = str(unit_tok).lower().rstrip("s")
        ms = n * A.UNIT_MS[unit]
        limit_ms = self.settings.max_rule_window_days * A.UNIT_MS["day"]
        if ms > limit_ms:  # also +inf: the engine keeps raw history as long as the longest window
            raise self.err(
                f"window {n_tok} {unit_tok} is longer than the limit of "
                f"{A.fmt_num(self.settings.max_rule_window_days)} days",
                _pos_of(n_tok),
                [f"a window of at most {A.fmt_num(self.settings.max_rule_window_days)} days"],
            )
        if not float(ms).is_integer():
            raise self.err(
                f"window {n_tok} {unit_tok} is not a whole number of milliseconds",
                _pos_of(n_tok),
                ["a window of whole milliseconds"],
            )
        return int(ms)

    def win_last(self, items: list[Token]) -> A.TimeWindow:
        return A.TimeWindow(self._ms(items[1], items[2]), 0, pos=_pos_of(items[0]))

    def win_hist(self, items: list[Token]) -> A.TimeWindow:
        start = self._ms(items[0], items[1])
        end = self._ms(items[3], items[4], allow_zero=True)
        if start <= end:
            raise self.err(
                f"a historical window 'n TO m AGO' needs n > m; got {items[0]} {items[1]} TO {items[3]} {items[4]} AGO",
                _pos_of(items[0]),
                ["n > m"],
            )
        return A.TimeWindow(start, end, pos=_pos_of(items[0]))

    def win_rows(self, items: list[Token]) -> A.RowsWindow:
        n = self._count(items[1], "a ROWS window")
        limit = self.settings.max_rule_rows
        if n > limit:
            raise self.err(
                f"a ROWS window of {items[1]} rows is larger than the limit of {limit}",
                _pos_of(items[1]),
                [f"at most {limit} rows"],
            )
        if not n.is_integer():
            raise self.err("a ROWS window needs a whole number of rows", _pos_of(items[1]), ["an integer"])
        return A.RowsWindow(int(n), pos=_pos_of(items[0]))

    # --- conditions
    @v_args(meta=True)
    def cmp(self, meta: Any, items: list[Any]) -> A.Cmp:
        left, op, right = items
        return A.Cmp(_op(op), left, right, pos=(meta.line, meta.column))

    @v_args(meta=True)
    def between(self, meta: Any, items: list[Any]) -> A.Between:
        e, kw, lo, _and, hi = items
        return A.Between(e, lo, hi, pos=(meta.line, meta.column))

    @v_args(meta=True)
    def and_(self, meta: Any, items: list[Any]) -> A.And:
        parts = [x for x in items if not isinstance(x, Token)]
        return A.And(_flatten(parts, A.And), pos=(meta.line, meta.column))

    @v_args(meta=True)
    def or_(self, meta: Any, items: list[Any]) -> A.Or:
        parts = [x for x in items if not isinstance(x, Token)]
        return A.Or(_flatten(parts, A.Or), pos=(meta.line, meta.column))

    def not_(self, items: list[Any]) -> A.Not:
        return A.Not(items[1], pos=_pos_of(items[0]))

    # --- rule
    def start(self, items: list[Any]) -> tuple[Any, ...]:
        return tuple(items)


def _op(tok: Token) -> str:
    s = str(tok)
    return "!=" if s == "<>" else s


def _flatten(parts: list[Any], cls: type) -> tuple[Any, ...]:
    out: list[Any] = []
    for p in parts:
        if isinstance(p, cls):
            out.extend(p.items)  # type: ignore[attr-defined]
        else:
            out.append(p)
    return tuple(out)


def _tree_depth(tree: Tree, limit: int) -> tuple[int, A.Pos]:  # type: ignore[type-arg]
    """Deepest nesting of HAVING/WHERE operators (iterative) and the position of the outermost
    node nested deeper than ``limit``."""
    nesting = {
        "row_or",
        "row_and",
        "row_not",
        "or_",
        "and_",
        "not_",
        "add",
        "sub",
        "mul",
        "div",
        "neg",
        "agg",
    }
    flat = {"row_or", "row_and", "or_", "and_"}  # chains of these become one n-ary node
    best = 0
    over: list[tuple[int, int]] = []
    stack: list[tuple[Any, int, str]] = [(tree, 0, "")]
    while stack:
        node, d, parent = stack.pop()
        if not isinstance(node, Tree):
            continue
        same_chain = node.data in flat and node.data == parent
        nd = d + 1 if node.data in nesting and not same_chain else d
        best = max(best, nd)
        if nd == limit + 1 and node.data in nesting and not same_chain:
            p = _pos_of(node)
            if p is not None:
                over.append(p)
        stack.extend((c, nd, str(node.data)) for c in node.children)
    return best, (min(over) if over else None)


def parse_tree(text: str, settings: Settings) -> Tree:  # type: ignore[type-arg]
    """The lark parse tree (syntax only), or RuleError (limits: ``settings.max_rule_*``)."""
    if len(text) > settings.max_rule_chars:
        raise RuleError.at(
            text,
            f"rule is {len(text)} characters long; the limit is {settings.max_rule_chars}",
            _offset_pos(text, settings.max_rule_chars),
            [f"at most {settings.max_rule_chars} characters"],
        )
    if not text.strip():
        raise RuleError.at(text, "empty rule", (1, 1), ["SELECT"])
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    depth, pos = _tree_depth(tree, settings.max_rule_depth)
    if depth > settings.max_rule_depth:
        raise RuleError.at(
            text,
            f"rule nests {depth} levels deep; the limit is {settings.max_rule_depth}",
            pos,
            [f"at most {settings.max_rule_depth} nested operators"],
        )
    return tree


def _offset_pos(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    line = before.count("\n") + 1
    col = offset - (before.rfind("\n") + 1) + 1
    return (line, col)


def _syntax_error(text: str, exc: UnexpectedInput) -> RuleError:
    if isinstance(exc, UnexpectedEOF):
        lines = text.splitlines() or [""]
        line = len(lines)
        col = len(lines[-1]) + 1
        if text.endswith("\n"):
            line, col = len(lines) + 1, 1
        expected = _readable(exc.expected)
        return RuleError(
            "unexpected end of the rule", line, col, lines[line - 1] if line <= len(lines) else "", expected
        )
    line, col = exc.line, exc.column
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        if tok.type == "$END":
            lines = text.splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
            what = "unexpected end of the rule"
        else:
            what = f"unexpected {str(tok)!r}"
        expected = _readable(exc.accepts or exc.expected)
    elif isinstance(exc, UnexpectedCharacters):
        at = exc.pos_in_stream or 0
        ch = text[at] if at < len(text) else ""
        what = f"unexpected character {ch!r}"
        if ch == '"':
            what += " (strings use single quotes)"
        expected = _readable(exc.allowed or ())
    else:  # pragma: no cover - lark has no other kinds
        what, expected = str(exc), []
    return RuleError.at(text, what, (line, col), expected)


def parse_syntax(text: str, settings: Settings) -> A.Rule:
    """Parse rule text to an (unchecked) AST."""
    tree = parse_tree(text, settings)
    try:
        select, key, _from, stream, *rest = _Build(text, settings).transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, RuleError):
            raise exc.orig_exc from None
        raise
    # rest: [where?] GROUP BY key HAVING cond
    where = rest[0] if not isinstance(rest[0], Token) else None
    group_key = rest[-3]
    having = rest[-1]
    rule = A.Rule(str(stream), str(key), where, having, pos=_pos_of(select))
    object.__setattr__(
        rule, "_positions", {"stream": _pos_of(stream), "key": _pos_of(key), "group": _pos_of(group_key)}
    )
    object.__setattr__(rule, "_group_key", str(group_key))
    return rule


def parse_rule(text: str, settings: Settings) -> A.Rule:
    """Parse and type-check rule text; RuleError on any problem (limits: ``settings.max_rule_*``)."""
    from subscriptions.typecheck import check_rule

    rule = parse_syntax(text, settings)
    check_rule(rule, text, settings)
    return rule
