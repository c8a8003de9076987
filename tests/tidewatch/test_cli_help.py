"""Every ``tidewatch … --help`` reads as help for a user: no Sphinx cross-reference roles or
reStructuredText literals of the docstrings' developer notes (those go after Typer's ``\\f``),
and no paragraph cut short at the source's line breaks (:func:`tidewatch.cli.reflow`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from tidewatch.cli import app, reflow

#: what a docstring written for Sphinx shows that a terminal user should not see
DEVELOPER_MARKUP = re.compile(r":(class|mod|func|meth|attr|data|exc):`|``")


def _paths(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command's path under ``cmd`` (Typer's groups carry ``commands``)."""
    yield path
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _paths(sub, (*path, name))


PATHS = list(_paths(typer.main.get_command(app)))


def test_the_walk_finds_the_nested_commands() -> None:
    assert ("engine", "run") in PATHS
    assert len(PATHS) > 20


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "tidewatch")
def test_help_has_no_developer_markup(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    found = DEVELOPER_MARKUP.findall(result.output)
    assert not found, f"`tidewatch {' '.join(path)} --help` shows {found}:\n{result.output}"


def test_the_check_finds_markup() -> None:
    assert DEVELOPER_MARKUP.search("the stop (:class:`StopGate`)")
    assert DEVELOPER_MARKUP.search("see ``tidewatch status``")
    assert not DEVELOPER_MARKUP.search("see `tidewatch status`")


def _command(path: tuple[str, ...]) -> Any:
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "tidewatch")
def test_help_paragraphs_are_not_cut_at_the_sources_line_breaks(path: tuple[str, ...]) -> None:
    shown = (_command(path).help or "").partition("\f")[0]
    for para in shown.split("\n\n"):
        for line in para.splitlines()[1:]:
            assert line.lstrip().startswith(("* ", "- ", "• ")) or line.startswith("    "), (
                f"`tidewatch {' '.join(path)} --help` breaks a paragraph before {line!r}"
            )


def test_a_paragraph_reads_on_one_line_in_a_wide_terminal() -> None:
    out = CliRunner().invoke(app, ["engine", "run", "--help"], env={"COLUMNS": "300"}).output
    assert "stops the streaming query between two batches, then Spark." in out


def test_reflow_joins_lines_and_keeps_lists_examples_and_notes() -> None:
    text = """Summary line.

    A paragraph wrapped
    at the source's width.

    * an item
      its second line
    * another item

    Run it as:
        tidewatch up --workers 2

    \b
    kept
    as is
    \f
    Developer notes
    stay as written."""
    assert reflow(text) == (
        "Summary line.\n\n"
        "A paragraph wrapped at the source's width.\n\n"
        "* an item its second line\n* another item\n\n"
        "Run it as:\n    tidewatch up --workers 2\n\n"
        "\b\nkept\nas is\n\f\nDeveloper notes\nstay as written."
    )
