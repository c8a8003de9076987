"""Compiler of rules to evaluation plans (which shared structures and index serve a rule).

A :class:`Plan` holds, for a checked rule:

* ``aggs`` -- its distinct aggregates, each with the shared per-key structure that answers it:
  one structure per (stream, key field, predicate = WHERE AND FILTER, attribute, kind), shared
  by every rule that needs it (Arasu & Widom 2004, section 3: R-INT for COUNT / SUM / AVG /
  FIRST / LAST, a MIN/MAX structure, a COUNT DISTINCT structure after Golab et al. 2003);
* ``atoms`` -- the comparisons of HAVING after NOT has been pushed down to them (negation
  normal form, ``cond``), each marked *indexable* when it is a threshold on COUNT or on SUM of a
  non-negative field over a suffix time window whose range excludes 0, with the collective
  index (section 4: CI-COUNT / CI-SUM) that serves it;
* ``driver`` -- the indexable atoms whose index lookups yield a superset of the rule's answer
  (one atom for a conjunction, one per disjunct for a disjunction), and ``why`` it was chosen;
* the post-check: the whole condition evaluated exactly on the candidates.

Rules with no driver are evaluated over their key domain (RULES.md: keys with an event in
``(now - W, now]``) from the shared per-key structures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from subscriptions import rule_ast as A
from subscriptions.rule_parser import parse_rule
from tidewatch.schema import STREAMS

if TYPE_CHECKING:
    from tidewatch.settings import Settings

PLAN_VERSION = 1


# ---------------------------------------------------------------- predicates
def combine_predicates(*conds: A.RowCond | None) -> A.RowCond | None:
    """WHERE AND FILTER as one canonical row condition (flattened, deduplicated, sorted)."""
    items: list[A.RowCond] = []
    for c in conds:
        if c is None:
            continue
        items.extend(c.items if isinstance(c, A.RowAnd) else (c,))
    uniq = {A.row_text(x): x for x in items}
    if not uniq:
        return None
    ordered = [uniq[k] for k in sorted(uniq)]
    return ordered[0] if len(ordered) == 1 else A.RowAnd(tuple(ordered))


# ---------------------------------------------------------------- plan parts
@dataclass(frozen=True)
class AggSpec:
    """One distinct aggregate of a rule and the shared structure that answers it."""

    id: int
    func: str  # COUNT SUM AVG MIN MAX FIRST LAST DISTINCT (COUNT(DISTINCT f))
    field: str | None  # None for COUNT
    predicate: A.RowCond | None  # WHERE AND FILTER
    window: A.Window
    text: str

    @property
    def pred_key(self) -> str:
        return A.row_text(self.predicate)

    @property
    def structure(self) -> tuple[str, str, str]:
        """(kind, predicate text, attribute) of the shared per-key structure."""
        if self.func == "COUNT":
            return ("count", self.pred_key, "*")
        if self.func in ("SUM", "AVG", "FIRST", "LAST"):
            return ("values", self.pred_key, str(self.field))
        if self.func in ("MIN", "MAX"):
            return ("minmax", self.pred_key, str(self.field))
        return ("distinct", self.pred_key, str(self.field))


@dataclass(frozen=True)
class Atom:
    """A comparison of the condition in negation normal form (``negated``: NOT of it)."""

    id: int
    op: str
    left: A.Expr
    right: A.Expr
    negated: bool
    text: str
    indexable: bool = False
    reason: str = ""
    #: for indexable atoms: the collective index ("count" | "sum", predicate text, attribute)
    index: tuple[str, str, str] | None = None
    agg_id: int | None = None
    window_ms: int = 0
    lo: float | None = None
    hi: float | None = None
    lo_strict: bool = True
    hi_strict: bool = True
    #: selectivity score (the event rate a key must sustain, see choose_driver)
    score: float = 0.0


# condition in NNF: ("and", [..]) | ("or", [..]) | ("atom", atom_id)
NNF = Any


@dataclass
class Plan:
    """The compiled form of a rule (see module docstring)."""

    text: str
    rule: A.Rule
    aggs: list[AggSpec]
    atoms: list[Atom]
    cond: NNF
    driver: list[int]
    why: str
    domain_ms: int | None  # W, the longest time window; None when the rule only has ROWS windows
    #: expression trees of atoms reference aggregates by AggSpec id through this map
    agg_ids: dict[str, int] = field(default_factory=dict)

    @property
    def stream(self) -> str:
        return self.rule.stream

    @property
    def key(self) -> str:
        return self.rule.key

    @property
    def indexed(self) -> bool:
        return bool(self.driver)

    @property
    def single_atom(self) -> bool:
        """The whole condition is the driving atom itself (post-check = exact value in range)."""
        return self.cond == ("atom", self.driver[0]) if len(self.driver) == 1 else False

    def agg_id(self, agg: A.Agg) -> int:
        return self.agg_ids[agg_key(agg, self.rule.where)]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able description (also stored with the subscription; see :meth:`from_json`)."""
        return {
            "version": PLAN_VERSION,
            "text": self.text,
            "canonical": A.rule_text(self.rule),
            "rule": A.to_json(self.rule),
            "stream": self.stream,
            "key": self.key,
            "domain_ms": self.domain_ms,
            "aggregates": [
                {
                    "id": a.id,
                    "text": a.text,
                    "structure": list(a.structure),
                    "window": A.window_text(a.window),
                }
                for a in self.aggs
            ],
            "atoms": [
                {
                    "id": t.id,
                    "text": t.text,
                    "indexable": t.indexable,
                    "reason": t.reason,
                    "index": list(t.index) if t.index else None,
                    "window_ms": t.window_ms,
                    "range": [t.lo, t.hi, t.lo_strict, t.hi_strict] if t.indexable else None,
                    "score": t.score,
                }
                for t in self.atoms
            ],
            "cond": _nnf_json(self.cond),
            "driver": list(self.driver),
            "why": self.why,
            "post_check": "the whole HAVING condition, exactly, on "
            + ("the index candidates" if self.driver else "every key of the key domain"),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | str) -> Plan:
        """Rebuild a plan from :meth:`to_json` output (the AST is stored; the rest is re-derived)."""
        obj: dict[str, Any] = json.loads(data) if isinstance(data, str) else data
        if obj.get("version") != PLAN_VERSION:
            raise ValueError(f"unsupported plan version {obj.get('version')!r}")
        rule = A.from_json(obj["rule"])
        return build_plan(rule, obj["text"])


def _nnf_json(n: NNF) -> Any:
    if n[0] == "atom":
        return n[1]
    return {n[0]: [_nnf_json(x) for x in n[1]]}


def agg_key(agg: A.Agg, where: A.RowCond | None) -> str:
    """Identity of an aggregate within a rule (COUNT(field) == COUNT(*): fields are never NULL)."""
    pred = A.row_text(combine_predicates(where, agg.filter))
    func = "DISTINCT" if agg.distinct else agg.func
    fld = None if func == "COUNT" else agg.field
    return f"{func}|{fld}|{pred}|{A.window_text(agg.window)}"


# ---------------------------------------------------------------- helpers over expressions
def const_value(e: A.Expr) -> float | None:
    """Value of an aggregate-free expression (NaN for NULL, e.g. division by zero); None if not constant."""
    if isinstance(e, A.Num):
        return e.value
    if isinstance(e, A.Agg):
        return None
    if isinstance(e, A.Neg):
        v = const_value(e.operand)
        return None if v is None else -v
    if isinstance(e, A.BinOp):
        a, b = const_value(e.left), const_value(e.right)
        if a is None or b is None:
            return None
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        return math.nan if b == 0 or math.isnan(b) else a / b
    raise TypeError(e)


def null_free(e: A.Expr) -> bool:
    """True when the expression can never be NULL (no division, only COUNT / SUM aggregates)."""
    if isinstance(e, A.Num):
        return True
    if isinstance(e, A.Agg):
        return e.func in ("COUNT", "SUM")
    if isinstance(e, A.Neg):
        return null_free(e.operand)
    if isinstance(e, A.BinOp):
        return e.op != "/" and null_free(e.left) and null_free(e.right)
    raise TypeError(e)


def to_nnf(c: A.Cond, negate: bool = False) -> Any:
    """Push NOT down to the comparisons (valid: the logic is two-valued, see RULES.md).

    Returns a tree of ("and"|"or", [...]) and ("cmp", op, left, right, negated) leaves;
    BETWEEN becomes two comparisons.
    """
    if isinstance(c, A.Cmp):
        return ("cmp", c.op, c.left, c.right, negate)
    if isinstance(c, A.Between):
        both = A.And((A.Cmp(">=", c.expr, c.lo), A.Cmp("<=", c.expr, c.hi)))
        return to_nnf(both, negate)
    if isinstance(c, A.Not):
        return to_nnf(c.item, not negate)
    if isinstance(c, (A.And, A.Or)):
        is_and = isinstance(c, A.And) != negate
        kids = [to_nnf(x, negate) for x in c.items]
        kind = "and" if is_and else "or"
        flat: list[Any] = []
        for k in kids:
            flat.extend(k[1] if k[0] == kind else [k])
        return (kind, flat)
    raise TypeError(c)


# ---------------------------------------------------------------- compile
def compile_rule(text: str, settings: Settings) -> Plan:
    """Parse, check and compile rule text; RuleError when it is not a valid rule (limits:
    ``settings.max_rule_*``)."""
    return build_plan(parse_rule(text, settings), text)


def build_plan(rule: A.Rule, text: str) -> Plan:
    spec = STREAMS[rule.stream]
    agg_ids: dict[str, int] = {}
    aggs: list[AggSpec] = []
    for a in A.iter_aggs(rule.having):
        k = agg_key(a, rule.where)
        if k in agg_ids:
            continue
        agg_ids[k] = len(aggs)
        func = "DISTINCT" if a.distinct else a.func
        aggs.append(
            AggSpec(
                id=len(aggs),
                func=func,
                field=None if func == "COUNT" else a.field,
                predicate=combine_predicates(rule.where, a.filter),
                window=a.window,
                text=A.expr_text(a),
            )
        )
    time_windows = [a.window.start_ms for a in aggs if isinstance(a.window, A.TimeWindow)]
    domain_ms = max(time_windows) if time_windows else None

    atoms: list[Atom] = []

    def leaf(node: Any) -> NNF:
        _, op, left, right, negated = node
        if negated and null_free(left) and null_free(right):
            op, negated = A.NEGATE[op], False
        atom = _classify(len(atoms), op, left, right, negated, rule, agg_ids, spec)
        atoms.append(atom)
        return ("atom", atom.id)

    def walk(node: Any) -> NNF:
        if node[0] == "cmp":
            return leaf(node)
        return (node[0], [walk(x) for x in node[1]])

    cond = walk(to_nnf(rule.having))
    driver, why = choose_driver(cond, atoms)
    return Plan(text, rule, aggs, atoms, cond, driver, why, domain_ms, agg_ids)


def _classify(
    i: int,
    op: str,
    left: A.Expr,
    right: A.Expr,
    negated: bool,
    rule: A.Rule,
    agg_ids: dict[str, int],
    spec: Any,
) -> Atom:
    text = f"{A.expr_text(left)} {op} {A.expr_text(right)}"
    if negated:
        text = f"NOT ({text})"
    base: dict[str, Any] = dict(id=i, op=op, left=left, right=right, negated=negated, text=text)
    if negated:
        return Atom(**base, reason="NOT of a comparison that may be NULL is true on keys without events")  # type: ignore[arg-type]
    if isinstance(left, A.Agg) and const_value(right) is not None:
        agg, c = left, const_value(right)
    elif isinstance(right, A.Agg) and const_value(left) is not None:
        agg, c, op = right, const_value(left), A.SWAP[op]
    else:
        return Atom(**base, reason="not a threshold (an aggregate compared with a constant)")  # type: ignore[arg-type]
    assert c is not None
    if agg.distinct or agg.func not in ("COUNT", "SUM"):
        return Atom(
            **base, reason=f"{'COUNT(DISTINCT)' if agg.distinct else agg.func} has no collective index"
        )  # type: ignore[arg-type]
    if agg.func == "SUM" and not spec.fields[agg.field].non_negative:
        return Atom(**base, reason=f"SUM of {agg.field}, which may be negative")  # type: ignore[arg-type]
    if not isinstance(agg.window, A.TimeWindow) or not agg.window.suffix:
        return Atom(**base, reason="not a suffix time window (LAST n unit)")  # type: ignore[arg-type]
    if math.isnan(c):
        return Atom(**base, reason="threshold is NULL (never true)")  # type: ignore[arg-type]
    if math.isinf(c):  # a constant that overflowed (e.g. 1e308 * 10): the post-check compares exactly
        return Atom(**base, reason="threshold is infinite (the constant overflows)")  # type: ignore[arg-type]
    lo: float | None = None
    hi: float | None = None
    lo_strict = hi_strict = True
    if op == ">":
        lo = c
    elif op == ">=":
        lo, lo_strict = c, False
    elif op == "<":
        hi = c
    elif op == "<=":
        hi, hi_strict = c, False
    elif op == "=":
        lo, hi, lo_strict, hi_strict = c, c, False, False
    else:
        return Atom(**base, reason="!= is satisfied by keys without events (value 0)")  # type: ignore[arg-type]
    if lo is None or lo < 0 or (lo == 0 and not lo_strict):
        return Atom(
            **base, reason=f"satisfied when {agg.func} = 0, i.e. by keys without events in the window"
        )  # type: ignore[arg-type]
    where = combine_predicates(rule.where, agg.filter)
    pred = A.row_text(where)
    if agg.func == "COUNT":
        index = ("count", pred, "*")
        typical = 1.0
    else:
        index = ("sum", pred, str(agg.field))
        typical = spec.fields[agg.field].typical
    T = agg.window.start_ms
    score = lo / (T / 1000.0) / typical
    return Atom(
        **base,  # type: ignore[arg-type]
        indexable=True,
        reason=f"threshold on {agg.func} over a suffix window, range excludes 0",
        index=index,
        agg_id=agg_ids[agg_key(agg, rule.where)],
        window_ms=T,
        lo=lo,
        hi=hi,
        lo_strict=lo_strict,
        hi_strict=hi_strict,
        score=score,
    )


def choose_driver(cond: NNF, atoms: list[Atom]) -> tuple[list[int], str]:
    """Pick the indexable atoms whose candidates are a superset of the rule's answer.

    A conjunction can be driven by any one conjunct that can be driven; a disjunction only
    when every disjunct can (the candidates are the union).  Among the choices we take the
    one with the highest *selectivity score*: the lower bound of the threshold divided by the
    window length and, for SUM, by a typical per-event value of the field (schema.FieldSpec):
    the event rate a key must sustain to be returned, so the fewest keys qualify.  A union
    scores as its weakest member; ties go to fewer lookups.
    """

    def best(n: NNF) -> tuple[float, list[int]] | None:
        if n[0] == "atom":
            a = atoms[n[1]]
            return (a.score, [a.id]) if a.indexable else None
        opts = [best(x) for x in n[1]]
        if n[0] == "and":
            good = [o for o in opts if o is not None]
            if not good:
                return None
            return max(good, key=lambda o: (o[0], -len(o[1])))
        if any(o is None for o in opts):
            return None
        ids: list[int] = []
        for o in opts:
            assert o is not None
            ids.extend(x for x in o[1] if x not in ids)
        return (min(o[0] for o in opts if o is not None), ids)

    b = best(cond)
    if b is None:
        reasons = "; ".join(f"atom {a.id} ({a.text}): {a.reason}" for a in atoms if not a.indexable)
        return [], (
            "no set of indexable atoms is implied by the condition, so the rule is evaluated over its "
            "key domain from the shared per-key structures" + (f" [{reasons}]" if reasons else "")
        )
    score, ids = b
    n_index = sum(1 for a in atoms if a.indexable)
    if len(ids) == 1:
        why = (
            f"atom {ids[0]} is implied by the condition and has the highest selectivity score "
            f"({score:.4g}: threshold / window seconds{' / typical value' if atoms[ids[0]].index[0] == 'sum' else ''}) "  # type: ignore[index]
            f"of the {n_index} indexable atom(s)"
        )
    else:
        why = (
            f"the condition is a disjunction; every disjunct implies one of atoms {ids}, so the union of "
            f"their index candidates is a superset of the answer (score {score:.4g})"
        )
    return ids, why


# ---------------------------------------------------------------- explain
def explain(plan: Plan) -> str:
    """Readable text of a plan."""
    lines = [
        f"rule      {A.rule_text(plan.rule)}",
        f"stream    {plan.stream}, key {plan.key}",
        "domain    "
        + (
            f"keys with >= 1 {plan.stream} event (before WHERE) in (now - {A.fmt_ms(plan.domain_ms)}, now]"
            if plan.domain_ms is not None
            else "every key seen so far (the rule has only ROWS windows)"
        ),
        "aggregates (shared per-key structures):",
    ]
    kinds = {
        "count": "R-INT counts",
        "values": "R-INT running sums + values",
        "minmax": "MIN/MAX structure",
        "distinct": "COUNT DISTINCT structure",
    }
    for a in plan.aggs:
        kind, pred, attr = a.structure
        lines.append(f"  [{a.id}] {a.text}")
        lines.append(
            f"       structure: {kinds[kind]} of {plan.stream} by {plan.key}, WHERE {pred}, attribute {attr}"
        )
    lines.append("atoms (condition in negation normal form):")
    for t in plan.atoms:
        mark = "indexable" if t.indexable else "post-check only"
        lines.append(f"  ({t.id}) {t.text}")
        if t.indexable:
            assert t.index is not None
            lo = "(" if t.lo_strict else "["
            hi = ")" if t.hi_strict else "]"
            rng = f"{lo}{A.fmt_num(t.lo) if t.lo is not None else '-inf'}, {A.fmt_num(t.hi) if t.hi is not None else 'inf'}{hi}"
            ci = "CI-COUNT" if t.index[0] == "count" else "CI-SUM"
            lines.append(
                f"       {mark}: {ci} of {plan.stream} by {plan.key}, WHERE {t.index[1]}, attribute {t.index[2]}; "
                f"window {A.fmt_ms(t.window_ms)}, range {rng}, score {t.score:.4g}"
            )
        else:
            lines.append(f"       {mark}: {t.reason}")
    lines.append(f"condition {_nnf_text(plan.cond)}")
    if plan.driver:
        lines.append(f"driver    atom(s) {', '.join(str(i) for i in plan.driver)}: {plan.why}")
        lines.append("post-check the whole condition, exactly, on the index candidates (and the key domain)")
    else:
        lines.append(f"driver    none: {plan.why}")
        lines.append("post-check the whole condition, exactly, on every key of the key domain")
    return "\n".join(lines)


def _nnf_text(n: NNF) -> str:
    if n[0] == "atom":
        return f"({n[1]})"
    sep = " AND " if n[0] == "and" else " OR "
    return "[" + sep.join(_nnf_text(x) for x in n[1]) + "]"
