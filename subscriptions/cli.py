"""``tidewatch rules explain | check`` (RULES.md).

The subscription commands backed by Postgres (``subscribe``, ``subscriptions ...``) live in
:mod:`subscriptions.store_cli` and are registered from here.  ``tidewatch backtest`` runs the
engine's evaluation code and is registered by :mod:`engine.cli`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from subscriptions import store_cli
from subscriptions.errors import RuleError

rules_app = typer.Typer(help="Check rules and show how they are evaluated.", no_args_is_help=True)


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


@rules_app.command("explain")
def explain_cmd(
    rule: Annotated[
        str,
        typer.Argument(
            help='the rule text, e.g. "SELECT symbol FROM trades GROUP BY symbol HAVING COUNT(*) OVER LAST 60 SECONDS > 200"'
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Print the compiled plan of a rule: atoms, shared structures, index and driving atom, post-check."""
    from subscriptions.compiler import compile_rule, explain
    from tidewatch.settings import get_settings

    try:
        plan = compile_rule(rule, get_settings())
    except RuleError as err:
        _err(f"rule refused (it does not parse or type-check): {err.display()}")
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
    from tidewatch.settings import get_settings

    settings = get_settings()
    bad = 0
    entries = read_rule_file(file)
    for name, lineno, text in entries:
        try:
            plan = compile_rule(text, settings)
        except RuleError as err:
            bad += 1
            _err(f"{file}:{lineno}: rule {name!r}: {err.display()}")
            continue
        how = f"indexed by atom(s) {plan.driver}" if plan.driver else "evaluated over its key domain"
        typer.echo(f"ok  {name}: {plan.stream} by {plan.key}, {how}")
    typer.echo(f"{len(entries) - bad} of {len(entries)} rules ok")
    if bad:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add ``rules`` and the storage commands (``subscribe``, ``subscriptions …``) to the root CLI."""
    app.add_typer(rules_app, name="rules")
    store_cli.register(app)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0)
