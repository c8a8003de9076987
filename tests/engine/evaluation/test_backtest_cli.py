"""``tidewatch backtest``, ``rules explain`` and ``rules check`` exactly as RULES.md says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from engine import cli as engine_cli
from engine.evaluation.backtest import EventFile, load_events, lookup_times
from subscriptions import cli as subscriptions_cli

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "samples"


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    a = typer.Typer()

    @a.callback()
    def _root() -> None:
        """test root"""

    subscriptions_cli.register(a)
    engine_cli.register(a)
    return a


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def write_rules(path: Path, rules: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"name": n, "rule": r}) + "\n" for n, r in rules.items()))
    return path


TRADES_HEADER = "exchange,ts,symbol,price,size,side\n"  # any order


def test_backtest_writes_alerts_in_order_and_strategies_agree(
    app: typer.Typer, runner: CliRunner, tmp_path: Path
) -> None:
    rules = write_rules(
        tmp_path / "rules.jsonl",
        {
            "b-count": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 2 SECONDS >= 2",
            "a-sum": "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(size) OVER LAST 3 SECONDS > 100",
        },
    )
    events = tmp_path / "t.csv"
    events.write_text(
        TRADES_HEADER
        + "X,1500,B,1,60,BID\n"
        + "X,1700,A,1,60,BID\n"
        + "X,2100,B,1,60,ASK\n"
        + "X,2100,A,1,10,ASK\n"
        + "X,5200,A,1,1,ASK\n"
    )
    outs = {}
    for strategy in ("shared", "naive", "scan"):
        out = tmp_path / f"{strategy}.jsonl"
        res = runner.invoke(
            app,
            ["backtest", "--rules", str(rules), "--events", f"trades={events}", "--every", "1000", "--out", str(out),
             "--strategy", strategy],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        outs[strategy] = out.read_text()
        assert "5 events" in res.output and "lookups" in res.output and "alerts" in res.output
        assert "events/s" in res.output
    assert outs["shared"] == outs["naive"] == outs["scan"]
    lines = [json.loads(x) for x in outs["shared"].splitlines()]
    # lookups at 1000, 2000, ..., 6000 (t0 = 1000, the first tau >= 5200 is 6000)
    # 2000: A sum 60, B sum 60, counts 1 -> nothing; 3000: B (1500, 2100) count 2 sum 120; A count 2 sum 70
    # 4000: window (2000, 4000] B 1 event, A 1 -> b-count exits; a-sum (1000, 4000] B 120 stays
    # 5000: a-sum (2000, 5000]: B 60 -> exit
    assert lines == [
        {"as_of": 3000, "rule": "a-sum", "key": "B", "kind": "ENTER"},
        {"as_of": 3000, "rule": "b-count", "key": "A", "kind": "ENTER"},
        {"as_of": 3000, "rule": "b-count", "key": "B", "kind": "ENTER"},
        {"as_of": 4000, "rule": "b-count", "key": "A", "kind": "EXIT"},
        {"as_of": 4000, "rule": "b-count", "key": "B", "kind": "EXIT"},
        {"as_of": 5000, "rule": "a-sum", "key": "B", "kind": "EXIT"},
    ]
    assert list(lines[0]) == ["as_of", "rule", "key", "kind"]


def test_lookup_times() -> None:
    f = EventFile("trades", {"ts": __import__("numpy").array([1500, 5200])})
    assert list(lookup_times([f], 1000)) == [1000, 2000, 3000, 4000, 5000, 6000]
    g = EventFile("trades", {"ts": __import__("numpy").array([2000, 4000])})
    assert list(lookup_times([g], 1000)) == [2000, 3000, 4000]
    h = EventFile("trades", {"ts": __import__("numpy").array([-1500, 0])})
    assert list(lookup_times([h], 1000)) == [-2000, -1000, 0]


def test_rule_that_does_not_parse_exits_2_with_position(
    app: typer.Typer, runner: CliRunner, tmp_path: Path
) -> None:
    rules = write_rules(
        tmp_path / "rules.jsonl",
        {
            "ok": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 2 SECONDS >= 2",
            "broken": "SELECT symbol FROM trades GROUP BY symbol HAVING SUM(prize) OVER LAST 2 SECONDS >= 2",
        },
    )
    events = tmp_path / "t.csv"
    events.write_text(TRADES_HEADER + "X,1500,B,1,60,BID\n")
    out = tmp_path / "out.jsonl"
    res = runner.invoke(
        app,
        [
            "backtest",
            "--rules",
            str(rules),
            "--events",
            f"trades={events}",
            "--every",
            "1000",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 2
    assert "rule 'broken' refused: line 1, column 54" in res.output
    assert "did you mean 'price'" in res.output
    assert "expected" in res.output


def test_malformed_rows_are_reported_and_skipped(app: typer.Typer, runner: CliRunner, tmp_path: Path) -> None:
    rules = write_rules(
        tmp_path / "rules.jsonl",
        {"c": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 5 SECONDS >= 2"},
    )
    events = tmp_path / "t.csv"
    events.write_text(
        TRADES_HEADER
        + "X,1000,A,1,10,BID\n"  # line 2
        + "X,1100,A,abc,10,BID\n"  # line 3: bad price
        + "X,1200,A,1,10\n"  # line 4: too few fields
        + "X,1300,A,1,-5,BID\n"  # line 5: negative size
        + "X,1400,A,1,5,SELL\n"  # line 6: bad side
        + "X,1500,A,1,2.5,BID\n"  # line 7: fractional size
        + "X,,A,1,2,BID\n"  # line 8: no ts
        + "X,1600,A,1,10,ASK\n"  # line 9
        + "X,1700,A,1,90071992547409930,ASK\n"  # line 10: size above 2**53 (sums not exact)
        + "X,1800,A,-1e300,1,ASK\n"  # line 11: price above 2**53 in magnitude
    )
    out = tmp_path / "out.jsonl"
    args = [
        "backtest",
        "--rules",
        str(rules),
        "--events",
        f"trades={events}",
        "--every",
        "1000",
        "--out",
        str(out),
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    for line in (3, 4, 5, 6, 7, 8, 10, 11):
        assert f"t.csv:{line}:" in res.output
    for line in (2, 9):
        assert f"t.csv:{line}:" not in res.output
    assert "8 malformed" in res.output
    # kept: ts 1000 and 1600; lookups at 1000 and 2000 (the first tau >= 1600)
    assert [json.loads(x)["kind"] for x in out.read_text().splitlines()] == ["ENTER"]
    res = runner.invoke(app, args + ["--strict"])
    assert res.exit_code == 1


def test_load_events_reads_any_column_order_and_types(tmp_path: Path) -> None:
    p = tmp_path / "p.csv"
    p.write_text(
        "tcp_flags,length,protocol,dst_port,src_port,dst_ip,src_ip,ts\n"
        ",60,UDP,53,1111,10.0.0.2,10.0.0.1,2000\n"
        "S,40,TCP,80,1112,10.0.0.2,10.0.0.1,1000\n"
    )
    f = load_events("packets", p)
    assert list(f.cols["ts"]) == [1000, 2000]
    assert list(f.cols["tcp_flags"]) == ["S", ""]
    assert f.cols["length"].dtype.kind == "i"


def test_missing_header_field_is_an_error(app: typer.Typer, runner: CliRunner, tmp_path: Path) -> None:
    rules = write_rules(
        tmp_path / "r.jsonl",
        {"c": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 5 SECONDS >= 2"},
    )
    events = tmp_path / "t.csv"
    events.write_text("ts,symbol,price\n1,A,2\n")
    res = runner.invoke(app, ["backtest", "--rules", str(rules), "--events", f"trades={events}", "--every", "1000",
                              "--out", str(tmp_path / "o.jsonl")])  # fmt: skip
    assert res.exit_code == 2
    assert "size" in res.output and "side" in res.output


def test_strict_exit_1_is_for_malformed_rows_only(
    app: typer.Typer, runner: CliRunner, tmp_path: Path
) -> None:
    """The exit code follows the error's type (MalformedRows), not its text: a file whose name
    says "malformed" but lacks a header field is unusable input, exit 2 also under --strict."""
    rules = write_rules(
        tmp_path / "r.jsonl",
        {"c": "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 5 SECONDS >= 2"},
    )
    events = tmp_path / "malformed.csv"
    events.write_text("ts,symbol,price\n1,A,2\n")
    res = runner.invoke(app, ["backtest", "--rules", str(rules), "--events", f"trades={events}", "--every", "1000",
                              "--out", str(tmp_path / "o.jsonl"), "--strict"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "malformed.csv" in res.output


def test_sample_files_backtest(app: typer.Typer, runner: CliRunner, tmp_path: Path) -> None:
    """The README's worked example: both strategies, identical files, some alerts of every rule."""
    outs = []
    for strategy in ("shared", "naive"):
        out = tmp_path / f"{strategy}.jsonl"
        res = runner.invoke(
            app,
            ["backtest", "--rules", str(SAMPLES / "rules.jsonl"), "--events", f"trades={SAMPLES / 'trades.csv'}",
             "--events", f"packets={SAMPLES / 'packets.csv'}", "--every", "1000", "--out", str(out),
             "--strategy", strategy],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    rules_seen = {json.loads(x)["rule"] for x in outs[0].splitlines()}
    assert rules_seen == {json.loads(x)["name"] for x in (SAMPLES / "rules.jsonl").read_text().splitlines()}


def test_rules_explain(app: typer.Typer, runner: CliRunner) -> None:
    res = runner.invoke(
        app,
        [
            "rules",
            "explain",
            "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST 1 MINUTE > 10000000",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "CI-SUM" in res.output and "driver" in res.output
    res = runner.invoke(
        app,
        [
            "rules",
            "explain",
            "--json",
            "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(length) OVER LAST 1 MINUTE > 1",
        ],
    )
    assert json.loads(res.output)["driver"] == [0]
    res = runner.invoke(
        app,
        [
            "rules",
            "explain",
            "SELECT src_ip FROM packets GROUP BY src_ip HAVING SUM(lenght) OVER LAST 1 MINUTE > 1",
        ],
    )
    assert res.exit_code == 2
    assert "did you mean 'length'" in res.output and res.output.startswith("rule refused")
    # a type error is refused as a parse error is, and not called one
    res = runner.invoke(
        app,
        [
            "rules",
            "explain",
            "SELECT symbol FROM trades GROUP BY symbol HAVING AVG(side) OVER LAST 5 MINUTES > 1",
        ],
    )
    assert res.exit_code == 2 and "refused" in res.output and "numeric" in res.output


def test_rules_check(app: typer.Typer, runner: CliRunner, tmp_path: Path) -> None:
    res = runner.invoke(app, ["rules", "check", str(SAMPLES / "rules.jsonl")])
    assert res.exit_code == 0, res.output
    text = tmp_path / "rules.txt"
    text.write_text(
        "-- two rules, the second broken\n"
        "SELECT symbol FROM trades GROUP BY symbol\nHAVING COUNT(*) OVER LAST 1 MINUTE > 5\n\n"
        "SELECT symbol FROM trades GROUP BY symbol\nHAVING COUNT(*) OVER LAST 1 FORTNIGHT > 5\n"
    )
    res = runner.invoke(app, ["rules", "check", str(text)])
    assert res.exit_code == 2
    assert "1 of 2 rules ok" in res.output
    assert "rules.txt:5" in res.output
    assert "line 2, column 29" in res.output  # FORTNIGHT
