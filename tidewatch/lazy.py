"""Lazy public names of a package: ``import engine`` stays cheap, ``from engine import X`` works.

A package's ``__init__.py`` imports its error root eagerly (a few lines, no dependencies) and
names the rest of its public API in ``__all__``; those names are imported from their module
on first access (PEP 562), so importing a package never pulls PySpark, Numba, SQLAlchemy, ...::

    __getattr__, __dir__ = lazy_exports(__name__, {"EngineApp": "engine.app"})
"""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost more than the package
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], Iterable[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``names`` maps a public name to the module
    that defines it; the value is imported on first access and then kept in the package."""

    def __getattr__(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> Iterable[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
