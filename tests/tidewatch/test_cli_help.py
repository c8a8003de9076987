"""Every ``tidewatch … --help`` reads as help for a user: no Sphinx cross-reference roles or
reStructuredText literals of the docstrings' developer notes (those go after Typer's ``\\f``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from tidewatch.cli import app

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
