"""The driver's warm-up (engine.runtime.driver_warmup): it runs on every setting of panes and
lookups, its lookups make alerts, both modes agree, and it loads every compiled kernel a real
rule mix's batches use -- checked in fresh interpreters, where nothing is loaded before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.core import EngineCore
from engine.evaluation.evaluator import Evaluator
from engine.rule_evaluator import rule_compiler
from engine.runtime.driver_warmup import RULES, rules_for, warm_driver
from tidewatch.settings import get_settings

ROOT = Path(__file__).resolve().parents[3]
TOPICS = {"trades": "t-trades", "packets": "t-packets", "subscriptions": "t-subs"}


def _core(pane: int, lateness: int, every: int | None) -> EngineCore:
    s = get_settings()
    return EngineCore(
        pane_ms=pane,
        allowed_lateness_ms=lateness,
        max_future_ms=60_000,
        lookup_every_ms=every,
        evaluator_factory=lambda: Evaluator("shared", ci_p=s.ci_p, pane_ms=pane),
        compile_rule=rule_compiler(s),
    )


@pytest.mark.parametrize(
    ("pane", "lateness", "every"),
    [(1000, 5000, None), (500, 0, None), (5000, 2000, 15000), (60_000, 0, None)],
)
def test_both_modes_make_the_same_alerts_on_any_panes(pane: int, lateness: int, every: int | None) -> None:
    """Every rule compiles with windows of the core's panes, lookups run (alerts > 0), and the
    executors' path (pre-aggregated here, merged) makes what the driver's path makes."""
    assert all("{a}" in r or "{b}" in r for r in RULES)  # every rule's windows follow the panes
    assert len(rules_for(pane)) == len(RULES)
    _, driver = warm_driver(lambda: _core(pane, lateness, every), TOPICS, executors=False)
    _, executors = warm_driver(lambda: _core(pane, lateness, every), TOPICS, executors=True)
    assert driver > 0
    assert executors == driver


_LOADED = textwrap.dedent(
    """
    import json, sys, time
    from numba.core.registry import CPUDispatcher
    from engine.core import default_core
    from engine.runtime.driver_warmup import kafka_records, read_alerts, warm_batch, warm_driver
    from tidewatch.settings import get_settings

    s = get_settings()
    topics = {"trades": "t-trades", "packets": "t-packets"}
    executors = sys.argv[2] == "executors"
    if sys.argv[1] == "warm-up":
        warm_driver(lambda: default_core(s), topics, executors=executors)
    else:  # a rule mix of every aggregate and window form, 20 batches of both streams
        from engine.messages import SubscriptionChange
        from tests.engine.rule_mix import RULES_MD_MIX, random_rules

        texts = list(random_rules(300, seed=7).values()) + list(RULES_MD_MIX)
        rules = [SubscriptionChange(f"r{i}", "upsert", f"r{i}", t) for i, t in enumerate(texts)]
        core = default_core(s)
        start = (int(time.time() * 1000) - 600_000) // 1000 * 1000
        for b in range(21):
            recs = kafka_records(topics, start + (b - 1) * 2000, start + b * 2000, 100 + b)
            recs = recs if b else recs.slice(0, 0)
            read_alerts(warm_batch(core, b, recs, topics, rules if b == 0 else [], executors=executors))
    loaded = sorted(
        {
            (f"{v.py_func.__module__}.{v.py_func.__qualname__}", str(sig))
            for name, mod in list(sys.modules.items())
            if name.split(".")[0] in ("engine", "tidewatch")
            for v in list(vars(mod).values())
            if isinstance(v, CPUDispatcher)
            for sig in v.signatures
        }
    )
    print(json.dumps(loaded))
    """
)


def _loaded(what: str, mode: str) -> set[tuple[str, str]]:
    """The (kernel, signature) pairs a fresh interpreter has loaded after ``what``."""
    res = subprocess.run(
        [sys.executable, "-c", _LOADED, what, mode], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return {(k, sig) for k, sig in json.loads(res.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("mode", ["driver", "executors"])
def test_the_warm_up_loads_every_kernel_a_rule_mix_uses(mode: str) -> None:
    """After the warm-up, a real rule mix's first batches call no kernel for the first time: the
    (kernel, signature) pairs they load in a fresh interpreter are all among the warm-up's."""
    warm = _loaded("warm-up", mode)
    real = _loaded("rules", mode)
    assert len(real) > 20  # the mix did run the kernels
    assert real <= warm, f"not loaded by the warm-up: {sorted(real - warm)}"


def test_the_throwaway_core_logs_nothing_other_threads_still_do(caplog: pytest.LogCaptureFixture) -> None:
    """The throwaway core's subscriptions are not announced in the engine's log (they would
    read as the engine's own); a record another thread logs meanwhile still is."""
    import logging
    import threading

    log = logging.getLogger("tidewatch.engine")
    real = log.info
    done = threading.Event()

    def info_and_other(msg: str, *args: object) -> None:  # the first record: another thread logs
        real(msg, *args)
        if not done.is_set():
            done.set()
            t = threading.Thread(target=real, args=("from another thread",))
            t.start()
            t.join()

    with caplog.at_level(logging.INFO, logger="tidewatch.engine"):
        real("subscription before (b) on trades is active")  # this thread, before: kept
        log.info = info_and_other  # type: ignore[method-assign]
        try:
            warm_driver(lambda: _core(1000, 0, None), TOPICS, executors=False)
        finally:
            del log.info
    messages = [r.getMessage() for r in caplog.records]
    assert done.is_set()  # the throwaway core did log
    assert "subscription before (b) on trades is active" in messages
    assert "from another thread" in messages
    assert not [m for m in messages if "warm-up" in m]
