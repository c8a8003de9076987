"""``bench/storm_bench.py`` on a small storm: the one-core and the sharded paths run and make the
same number of alerts (what its side-by-side figures rest on). No services."""

from __future__ import annotations

import re
import sys

import pytest

from bench import storm_bench

ARGS = ["--rules", "40", "--keys", "300", "--events-per-s", "2000", "--seconds", "6", "--warm", "2"]


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], extra: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["storm_bench.py", *ARGS, *extra])
    storm_bench.main()
    got = re.search(r"timed batches, ([\d,]+) alerts", capsys.readouterr().out)
    assert got, "the bench printed no alert count"
    return int(got.group(1).replace(",", ""))


def test_the_sharded_storm_makes_the_one_core_alerts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _run(monkeypatch, capsys, [])
    assert one > 1000
    assert _run(monkeypatch, capsys, ["--shards", "2"]) == one
