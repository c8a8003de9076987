"""The random rule mix the sharded engine is checked with (tests/engine/rule_mix.py): every rule
compiles, every function and window form of RULES.md is in it, it is the same for the same seed,
and its rules' result sets change on the scenario's events (a mix that never alerts, or alerts
for every key at every lookup, would check little)."""

from __future__ import annotations

from collections import Counter

from subscriptions.compiler import compile_rule
from tests.engine.rule_mix import RULES_MD_MIX, random_rules
from tests.engine.support import backtest, make_scenario
from tidewatch.settings import get_settings

MIX = random_rules(24)


def test_the_mix_compiles_and_covers_the_language() -> None:
    s = get_settings()
    for text in [*MIX.values(), *RULES_MD_MIX.values()]:
        compile_rule(text, s)
    text = " ".join(MIX.values())
    for part in ("COUNT(*)", "COUNT(DISTINCT", "SUM(", "AVG(", "MIN(", "MAX(", "FIRST(", "LAST("):
        assert part in text, part
    for part in (" SECONDS AGO", " ROWS", "FILTER (WHERE", " WHERE ", " AND ", " OR ", "FROM packets"):
        assert part in text, part
    assert "GROUP BY dst_ip" in text and "GROUP BY src_ip" in text and "GROUP BY symbol" in text
    assert random_rules(24) == MIX and random_rules(24, seed=2) != MIX


def test_most_of_the_mix_enters_and_exits_on_the_scenario() -> None:
    sc = make_scenario()
    rules = {**MIX, **RULES_MD_MIX}
    for i, name in enumerate(rules):
        sc.sub_ids[name] = f"r{i}"
    alerts = backtest(sc, rules, sc.max_ts)
    kinds = Counter((rule, kind) for rule, _, kind, _ in alerts)
    both = [n for n in MIX if kinds[(sc.sub_ids[n], "ENTER")] and kinds[(sc.sub_ids[n], "EXIT")]]
    assert len(both) >= len(MIX) * 2 // 3, (len(both), kinds)
    assert kinds[(sc.sub_ids["rules_md_0"], "ENTER")]  # Arasu & Widom's Example 2.1 fires here
