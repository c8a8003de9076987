"""Key detail's charts computed by the engine: the request/answer round trip on real PostgreSQL.

The engine side is the real :class:`engine.sinks.charts.ChartAnswers` thread over a core whose
evaluator was fed the demo's trade rules and 40 minutes of trades as the engine feeds it (pane
rows per one-second batch, with spans); the dashboard side is :mod:`dashboard.engine_charts`
and, through AppTest, the Key detail page.  Checked: the answer equals the series computed
directly (:func:`engine.evaluation.key_series.key_series`); an unknown subscription is answered
by its error code; every chart of every demo rule has data points; with no engine answering,
the page says so and what to do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from dashboard import engine_charts
from dashboard.rules import TEMPLATES, validate
from engine.evaluation.evaluator import Evaluator
from engine.evaluation.key_series import key_series
from engine.evaluation.panes import aggregate
from engine.sinks.charts import UNKNOWN_SUBSCRIPTION, ChartAnswers
from subscriptions.service import SubscriptionService
from tests.dashboard.test_dash_apptest import logged_in
from tests.dashboard.test_dash_detail_demo import _chart_frames
from tidewatch.db.session import make_db_engine
from tidewatch.settings import get_settings

pytestmark = pytest.mark.integration

DEMO_RULES = {name: text for name, text in TEMPLATES.items() if " FROM trades" in text}
SYMBOLS = ["AAPL", "MSFT", "IBM", "NVDA", "AMZN"]
G = 1000


def _feed(ev: Evaluator, minutes: int = 40) -> int:
    """40 minutes of trades (5 symbols, one trade each every 0.5 s), one batch per second as the
    engine's executors mode feeds them; the last lookup time."""
    rng = np.random.default_rng(21)
    now = int(time.time() * 1000) // G * G
    start = now - minutes * 60_000
    prev = -(2**62)
    price = 100 + np.cumsum(rng.normal(0, 0.05, (minutes * 120 + 2, len(SYMBOLS))), axis=0)
    for i, tau in enumerate(range(start + G, now + G, G)):
        ts = np.repeat(np.array([tau - 500, tau], np.int64), len(SYMBOLS))
        n = ts.shape[0]
        cols = {
            "symbol": np.array(SYMBOLS * 2, dtype=object),
            "ts": ts,
            "price": np.round(np.concatenate([price[2 * i], price[2 * i + 1]]), 2),
            "size": rng.integers(1, 400, n).astype(np.int64),
            "side": rng.choice(np.array(["BID", "ASK"], dtype=object), n),
            "exchange": np.array(["NASDAQ"] * n, dtype=object),
        }
        ev.apply_panes("trades", aggregate(cols, ev.pane_spec("trades"), G), span=(prev, tau))
        prev = tau
        ev.step(tau)
    return now


@pytest.fixture
def engine_side(dash_db_url: str, sm: sessionmaker[Session], new_user: Any) -> Iterator[SimpleNamespace]:
    """A user with the demo's trade rules, a core holding them, the answering thread running."""
    settings = get_settings()
    name = new_user("charts")
    svc = SubscriptionService(sm, settings=settings)
    subs = {rule_name: svc.create(name, text, name=rule_name) for rule_name, text in DEMO_RULES.items()}
    ev = Evaluator("shared", ci_p=settings.ci_p, pane_ms=G)
    for rule_name, text in DEMO_RULES.items():
        plan = validate(text, settings).plan
        assert plan is not None
        ev.add_rule(str(subs[rule_name].id), plan)
    core = SimpleNamespace(evaluator=ev, applied_until=None)
    core.applied_until = _feed(ev)
    db = make_db_engine(dash_db_url)
    answers = ChartAnswers(db, settings.model_copy(update={"chart_answer_poll_s": 0.2}))
    answers.start(lambda: core)
    try:
        yield SimpleNamespace(user=name, subs=subs, core=core, answers=answers)
    finally:
        answers.stop()
        db.dispose()


def test_a_request_is_answered_with_the_series_of_the_state_held(
    engine_side: SimpleNamespace, sm: sessionmaker[Session]
) -> None:
    sid = engine_side.subs["High volatility with recent volume surge (Traderbot)"].id
    t0 = time.monotonic()
    ids = engine_charts.request(sm, [(sid, "AAPL"), (uuid.uuid4(), "AAPL")])
    got = engine_charts.wait(sm, ids, 15.0, poll_s=0.05)
    took = time.monotonic() - t0
    ok, unknown = got[ids[0]], got[ids[1]]
    assert ok.answer is not None and ok.error is None
    assert unknown.answer is None and unknown.error == UNKNOWN_SUBSCRIPTION
    core = engine_side.core
    rule = core.evaluator.rules[str(sid)]
    direct = key_series(core.evaluator.retained("trades"), rule.plan, "AAPL", core.applied_until, G).to_json()
    answer = dict(ok.answer)
    for k in ("compute_ms", "pane_ms", "history_ms"):
        answer.pop(k)
    assert answer == direct
    # the 30-minute rule: its whole window, one point per pane (thinned to 600)
    assert answer["times"][-1] == core.applied_until and len(answer["times"]) == 600
    print(f"\n30-minute rule: answered in {took * 1000:.0f} ms, computed in {ok.answer['compute_ms']} ms")
    assert took < 10


def test_every_chart_of_every_demo_rule_comes_from_the_engine(
    engine_side: SimpleNamespace, app_env: str, sm: sessionmaker[Session]
) -> None:
    at = logged_in(sm, engine_side.user, "Key detail")
    at.text_input(key="detail_key").input("AAPL").run()
    at.toggle(key="detail_engine").set_value(True).run(timeout=30)
    assert not at.exception
    plans = [validate(text, get_settings()).plan for text in DEMO_RULES.values()]
    expected = [a.text for plan in plans if plan is not None for a in plan.aggs]
    got = _chart_frames(at)
    assert sorted(t for t, _ in got) == sorted(expected)
    for title, df in got:
        assert len(df) > 0 and df["value"].notna().sum() > 0, title
        assert (df["value"].fillna(0) != 0).any(), title
    assert any("Computed by the engine" in c.value for c in at.caption)
    # the history is the longest window (30 min): the 30-minute aggregates' older points are partial
    assert any((df["window"] == "partial").any() for _, df in got)
    assert not any("did not answer" in w.value for w in at.warning)


def test_the_page_says_so_when_the_engine_does_not_answer(
    app_env: str, sm: sessionmaker[Session], new_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEWATCH_DASHBOARD_CHART_WAIT_S", "1")
    get_settings.cache_clear()
    name = new_user("nochart")
    SubscriptionService(sm, settings=get_settings()).create(name, next(iter(DEMO_RULES.values())), name="r")
    at = logged_in(sm, name, "Key detail")
    at.text_input(key="detail_key").input("AAPL").run()
    at.toggle(key="detail_engine").set_value(True).run(timeout=30)
    assert not at.exception
    assert any("did not answer" in w.value and "tidewatch status" in w.value for w in at.warning)
    assert _chart_frames(at) == []
