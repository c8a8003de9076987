"""engine.core: a partition no event has come from yet, with records written but not readable.

Records of several partitions -- even of one Kafka transaction -- become visible partition by
partition, so the first batch of a backlog may hold one stream's events and not yet the other's.
Such a partition (``waiting``: its high watermark is past the batch's end offset) holds the
watermark for one batch; a partition nothing was written to holds nothing."""

from __future__ import annotations

from engine.core import EngineCore
from tests.engine.test_core import G, compile_rule, make_core, records_on

P1 = [("trades", 1)]


def test_a_waiting_partition_holds_the_watermark_for_one_batch() -> None:
    core = make_core()  # lateness 2 s
    # batch 0: only partition 0's records are visible, spanning 60 s; partition 1's are not yet
    out = core.process(0, records_on([(0, ["A"] * 2, [10_000, 70_000], 0)]), [], P1)
    assert core.watermark is None and core.applied_until is None and not out.lookups
    # batch 1: partition 1's first records, from the start of the same span: not late
    out = core.process(1, records_on([(1, ["B"] * 2, [10_500, 69_000], 0)]), [], [])
    assert out.dead.counts()["late"] == 0 and out.events["trades"] == 2
    assert core.watermark == 69_000 - 2 * G and not core.unheard


def test_without_the_hold_the_first_records_of_a_late_partition_are_late() -> None:
    """The same batches with nothing waiting: what happened before (the failure the hold fixes)."""
    core = make_core()
    core.process(0, records_on([(0, ["A"] * 2, [10_000, 70_000], 0)]), [], [])
    out = core.process(1, records_on([(1, ["B"] * 2, [10_500, 69_000], 0)]), [])
    assert out.dead.counts()["late"] == 1 and out.dead.source_offset == [0]  # ts 10,500 <= 68,000


def test_a_partition_nothing_was_written_to_holds_nothing() -> None:
    """A sparse stream and an unused topic: the first trades are looked up at once."""
    core = make_core()
    core.process(0, records_on([(0, ["A"] * 3, [10_000, 11_000, 15_000], 0)]), [], [])
    assert core.watermark == 13_000 and core.applied_until == 13_000


def test_a_waiting_partition_holds_only_once() -> None:
    core = make_core()
    core.process(0, records_on([(0, ["A"], [10_000], 0)]), [], P1)
    assert core.watermark is None
    core.process(1, records_on([(0, ["A"], [20_000], 1)]), [], P1)  # still not readable: no more
    assert core.watermark == 20_000 - 2 * G and core.applied_until == 18_000
    # a batch with no events does not use the hold up
    core2 = make_core()
    core2.process(0, records_on([(0, [], [], 0)]), [], P1)
    core2.process(1, records_on([(0, ["A"], [10_000], 0)]), [], P1)
    assert core2.watermark is None


def test_a_partition_added_later_holds_once() -> None:
    core = make_core()
    core.process(0, records_on([(0, ["A"], [10_000], 0), (1, ["B"], [10_000], 0)]), [], [])
    assert core.watermark == 8_000
    core.process(1, records_on([(0, ["A"], [30_000], 1), (1, ["B"], [30_000], 1)]), [], [("trades", 2)])
    assert core.watermark == 8_000
    core.process(2, records_on([(2, ["C"], [12_000], 0)]), [], [])
    assert core.watermark == 12_000 - 2 * G and not core.unheard


def test_the_hold_state_survives_a_snapshot() -> None:
    """A restored engine must not hold a second time for a partition it already waited for once."""
    core = make_core()
    core.process(0, records_on([(0, ["A"], [10_000], 0)]), [], P1)
    assert core.watermark is None and core.unheard == {("trades", 1): 1}
    restored = EngineCore.from_bytes(core.to_bytes(), compile_rule=compile_rule)
    assert restored.unheard == core.unheard
    for c in (core, restored):
        c.process(1, records_on([(0, ["A"], [20_000], 1)]), [], P1)
    assert restored.watermark == core.watermark == 18_000
