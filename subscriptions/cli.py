"""``tidewatch rules explain | check`` and ``tidewatch backtest`` (RULES.md).

The subscription commands backed by Postgres (``subscribe``, ``subscriptions ...``) live in
:mod:`subscriptions.store_cli` and are registered from here when present.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from subscriptions.errors import RuleError

rules_app = typer.Typer(help="Check rules and show how they are evaluated.", no_args_is_help=True)


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


@rules_app.command("explain")
def explain_cmd(
    rule: Annotated[str, typer.Argument(help="the rule text")],
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Print the compiled plan of a rule: atoms, shared structures, index and driving atom, post-check."""
    from subscriptions.compiler import compile_rule, explain

    try:
        plan = compile_rule(rule)
    except RuleError as err:
        _err(f"rule does not parse: {err.display()}")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(plan.to_json(), indent=2))
    else:
        typer.echo(explain(plan))


def read_rule_file(path: Path) -> list[tuple[str, int, str]]:
    """(name, line, text) of a rules file: JSONL of {"name", "rule"} or plain text with one rule
    per block (blocks separated by blank lines; ``--`` comment lines ignored)."""
    text = path.read_text()
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    out: list[tuple[str, int, str]] = []
    if first.lstrip().startswith("{"):
        for i, ln in enumerate(lines, start=1):
            if not ln.strip():
                continue
            try:
                obj = json.loads(ln)
                out.append((str(obj["name"]), i, str(obj["rule"])))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise typer.BadParameter(
                    f"{path}:{i}: not a {{'name', 'rule'}} JSON object ({exc})"
                ) from None
        return out
    block: list[str] = []
    start = 0
    for i, ln in enumerate(lines + [""], start=1):
        if ln.strip().startswith("--"):
            continue
        if ln.strip():
            if not block:
                start = i
            block.append(ln)
        elif block:
            out.append((f"rule@{start}", start, "\n".join(block)))
            block = []
    return out


@rules_app.command("check")
def check_cmd(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL or text file of rules")],
) -> None:
    """Validate every rule of a file; exit status 2 if any does not parse or type-check."""
    from subscriptions.compiler import compile_rule

    bad = 0
    entries = read_rule_file(file)
    for name, lineno, text in entries:
        try:
            plan = compile_rule(text)
        except RuleError as err:
            bad += 1
            _err(f"{file}:{lineno}: rule {name!r}: {err.display()}")
            continue
        how = f"indexed by atom(s) {plan.driver}" if plan.driver else "evaluated over its key domain"
        typer.echo(f"ok  {name}: {plan.stream} by {plan.key}, {how}")
    typer.echo(f"{len(entries) - bad} of {len(entries)} rules ok")
    if bad:
        raise typer.Exit(2)


def backtest_cmd(
    rules: Annotated[Path, typer.Option("--rules", exists=True, dir_okay=False, help="RULES.jsonl")],
    events: Annotated[list[str], typer.Option("--events", help="STREAM=FILE.csv (repeatable)")],
    every: Annotated[int, typer.Option("--every", help="lookup period in ms")],
    out: Annotated[Path, typer.Option("--out", help="ALERTS.jsonl to write")],
    strategy: Annotated[
        str, typer.Option("--strategy", help="shared (collective indexes) or naive")
    ] = "shared",
    strict: Annotated[bool, typer.Option("--strict", help="exit 1 on any malformed CSV row")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
) -> None:
    """Run rules over event files with the engine's evaluation code (RULES.md backtest contract)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.gc_tuning import tune_gc
    from subscriptions.backtest import BacktestInputError, RuleFileError, run_backtest
    from tidewatch.settings import get_settings

    tune_gc(get_settings().engine_gc_threshold)  # one alert allocates a few objects: see engine.gc_tuning
    if strategy not in ("shared", "naive"):
        _err("--strategy must be 'shared' or 'naive'")
        raise typer.Exit(2)
    pairs: list[tuple[str, str | Path]] = []
    for spec in events:
        stream, sep, path = spec.partition("=")
        if not sep or not path:
            _err(f"--events expects STREAM=FILE, got {spec!r}")
            raise typer.Exit(2)
        if not Path(path).is_file():
            _err(f"--events {spec}: no such file")
            raise typer.Exit(2)
        pairs.append((stream.strip(), path))

    console = Console(stderr=True)
    shown = {"n": 0}

    def on_malformed(path: str, line: int, reason: str) -> None:
        shown["n"] += 1
        if shown["n"] <= 100:
            console.print(f"[yellow]{path}:{line}: malformed row skipped: {reason}[/yellow]", highlight=False)
        elif shown["n"] == 101:
            console.print("[yellow]... further malformed rows not shown[/yellow]")

    progress = Progress(
        TextColumn("backtest"), BarColumn(), MofNCompleteColumn(), TextColumn("lookups"), TimeElapsedColumn(),
        console=console, disable=quiet or not console.is_terminal, transient=False,
    )  # fmt: skip
    task = progress.add_task("lookups", total=None)

    def on_progress(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    try:
        with progress, out.open("w") as fh:
            result = run_backtest(
                rules, pairs, every, fh, strategy=strategy, on_malformed=on_malformed, strict=strict,
                progress=on_progress,
            )  # fmt: skip
    except RuleFileError as exc:
        _err(str(exc))
        raise typer.Exit(2) from None
    except BacktestInputError as exc:
        _err(f"backtest: {exc}")
        raise typer.Exit(1 if strict and "malformed" in str(exc) else 2) from None
    if result.malformed:
        console.print(f"{result.malformed} malformed row(s) skipped", highlight=False)
    console.print(result.summary(), highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``rules`` and ``backtest`` (and the storage commands when present) to the root CLI."""
    app.add_typer(rules_app, name="rules")
    app.command("backtest")(backtest_cmd)
    try:
        store_cli = importlib.import_module("subscriptions.store_cli")
    except ModuleNotFoundError as exc:
        if exc.name == "subscriptions.store_cli":
            return
        raise
    reg = getattr(store_cli, "register", None)
    if reg is not None:
        reg(app)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0)
