"""A reproducible random rule mix over the engine scenario's events (tests/engine/support.py).

``random_rules(n, seed)``: rules of every aggregate function (COUNT, COUNT(DISTINCT), SUM, AVG,
MIN, MAX, FIRST, LAST), every window form of RULES.md (LAST n SECONDS, n TO m SECONDS AGO,
LAST n ROWS), WHERE and FILTER, AND / OR, over trades (by symbol) and packets (by src_ip and
by dst_ip).  The thresholds are set from the scenario's rates (:data:`RATES`: events per key
and second) so that a rule's result set changes during the scenario rather than being always
empty or always full.  Same ``(n, seed)``, same rules.

``RULES_MD_MIX``: every example of RULES.md verbatim (most stay quiet on the scenario's two and
a half minutes of data: they must not alert either).
"""

from __future__ import annotations

import random

from tests.subscriptions.test_grammar import RULES_MD_EXAMPLES

#: the scenario's events per key and second (make_scenario: 6,000 trades over 150 s and 12
#: symbols; 4,000 packets over 8 source and 4 destination addresses)
RATES = {"symbol": 6000 / 150 / 12, "src_ip": 4000 / 150 / 8, "dst_ip": 4000 / 150 / 4}
#: per stream: (numeric field, its mean, its smallest, its largest) and row conditions with the
#: share of events they keep
FIELDS = {
    "trades": [("price", 55.0, 30.0, 80.0), ("size", 49.5, 0.0, 99.0)],
    "packets": [("length", 769.5, 40.0, 1499.0), ("dst_port", 20.0, 1.0, 39.0)],
}
CONDS = {
    "trades": [("side = 'ASK'", 0.5), ("price > 45", 0.7), ("size BETWEEN 10 AND 60", 0.5)],
    "packets": [("protocol = 'TCP'", 0.5), ("length < 800", 0.52), ("dst_port IN (1, 2, 3, 4, 5)", 0.13)],
}
KEYS = {"trades": ["symbol"], "packets": ["src_ip", "dst_ip"]}

RULES_MD_MIX = {f"rules_md_{i}": text for i, text in enumerate(RULES_MD_EXAMPLES)}


def _window(rng: random.Random) -> tuple[str, float]:
    """A window and how many events per unit rate it holds (seconds, or rows for ROWS)."""
    kind = rng.choice(["last", "last", "ago", "rows"])
    if kind == "last":
        w = rng.choice([3, 5, 8, 10, 15, 20, 30])
        return f"LAST {w} SECONDS", float(w)
    if kind == "ago":
        n = rng.choice([10, 15, 20, 30])
        m = rng.choice([k for k in (2, 5, 8) if k < n])
        return f"{n} SECONDS TO {m} SECONDS AGO", float(n - m)
    rows = rng.choice([5, 10, 20, 40])
    return f"LAST {rows} ROWS", -float(rows)


def _atom(rng: random.Random, stream: str, key: str) -> str:
    """One comparison of an aggregate with a threshold near its typical value."""
    window, span = _window(rng)
    share = 1.0
    filt = ""
    if rng.random() < 0.3:
        cond, share = rng.choice(CONDS[stream])
        filt = f" FILTER (WHERE {cond})"
    # events in the window: a ROWS window holds its rows (when the key has that many)
    n = -span if span < 0 else RATES[key] * span * share
    field, mean, lo, hi = rng.choice(FIELDS[stream])
    func = rng.choice(["COUNT", "DISTINCT", "SUM", "AVG", "MIN", "MAX", "FIRSTLAST"])
    f = rng.uniform(0.85, 1.25)
    if func == "COUNT":
        return f"COUNT(*){filt} OVER {window} > {max(1, round(n * f))}"
    if func == "DISTINCT":
        field = "dst_port" if stream == "packets" else "size"
        return f"COUNT(DISTINCT {field}){filt} OVER {window} >= {max(2, min(round(n * 0.8 * f), 35))}"
    if func == "SUM":
        return f"SUM({field}){filt} OVER {window} > {round(n * mean * f)}"
    if func == "AVG":
        op = rng.choice([">", "<"])
        return f"AVG({field}){filt} OVER {window} {op} {round(mean * (f if op == '>' else 2 - f), 2)}"
    if func == "MIN":
        return f"MIN({field}){filt} OVER {window} < {round(lo + (hi - lo) * rng.uniform(0.02, 0.1), 2)}"
    if func == "MAX":
        return f"MAX({field}){filt} OVER {window} > {round(hi - (hi - lo) * rng.uniform(0.02, 0.1), 2)}"
    op = rng.choice(["<", ">"])
    return f"LAST({field}){filt} OVER {window} {op} FIRST({field}){filt} OVER {window}"


def random_rules(n: int, seed: int = 1) -> dict[str, str]:
    """``n`` rules named ``mix_<i>`` (module docstring)."""
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        stream = rng.choice(["trades", "trades", "packets"])
        key = rng.choice(KEYS[stream])
        where = f" WHERE {rng.choice(CONDS[stream])[0]}" if rng.random() < 0.25 else ""
        cond = _atom(rng, stream, key)
        r = rng.random()
        if r < 0.3:
            cond = f"{cond} AND {_atom(rng, stream, key)}"
        elif r < 0.4:
            cond = f"({cond}) OR ({_atom(rng, stream, key)})"
        out[f"mix_{i}"] = f"SELECT {key} FROM {stream}{where} GROUP BY {key} HAVING {cond}"
    return out
