"""The code layout's contract, read from the source with :mod:`ast` (no services, nothing imported).

* Layers, lowest first: base ``tidewatch`` (all of it but the launcher) -> rules ``subscriptions``
  -> ``engine`` -> the edges ``ingest`` and ``dashboard`` -> the launcher (``tidewatch.cli``,
  ``tidewatch.stack``).  A module imports only from its own layer and the layers below it; the two
  edges not from each other; no product module imports the tests.  Every import counts, also one
  inside a function or under ``if TYPE_CHECKING``; a relative import counts as the module it names.
* No product module is longer than :data:`MAX_LINES` lines.
* No test skips itself with ``pytest.importorskip`` of a project module: the project's own code
  always imports, and a test that cannot import it must fail, not skip.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tidewatch", "subscriptions", "engine", "ingest", "dashboard")
LAUNCHER = ("tidewatch.cli", "tidewatch.stack")
MAX_LINES = 800

# each layer and the layers it may import from (itself included)
ALLOWED: dict[str, frozenset[str]] = {
    "base": frozenset({"base"}),
    "rules": frozenset({"base", "rules"}),
    "engine": frozenset({"base", "rules", "engine"}),
    "ingest": frozenset({"base", "rules", "engine", "ingest"}),
    "dashboard": frozenset({"base", "rules", "engine", "dashboard"}),
    "launcher": frozenset({"base", "rules", "engine", "ingest", "dashboard", "launcher"}),
}
LAYER_OF_PACKAGE = {
    "tidewatch": "base",
    "subscriptions": "rules",
    "engine": "engine",
    "ingest": "ingest",
    "dashboard": "dashboard",
    "tests": "tests",
}


@dataclass(frozen=True)
class Module:
    name: str  # dotted, a package as its own name (``engine.sinks``, not ``engine.sinks.__init__``)
    path: Path
    is_package: bool


def product_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[Module]:
    out = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            out.append(Module(".".join(parts[:-1] if is_package else parts), path, is_package))
    return out


def layer(name: str) -> str | None:
    """The layer of a dotted module name; None for a module outside the project."""
    if any(name == p or name.startswith(p + ".") for p in LAUNCHER):
        return "launcher"
    return LAYER_OF_PACKAGE.get(name.split(".")[0])


def imports(module: Module, known: set[str]) -> list[tuple[int, str, str]]:
    """(line, source text, imported module) of every import in ``module``, relative ones resolved.
    ``from P import x`` names the module ``P.x`` when that is a module of the project, else ``P``."""
    source = module.path.read_text(encoding="utf-8")
    out = []
    for node in ast.walk(ast.parse(source, str(module.path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
                base = package[: len(package) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin for a in node.names]
        else:
            continue
        text = ast.get_source_segment(source, node) or ast.unparse(node)
        out += [(node.lineno, " ".join(text.split()), t) for t in targets]
    return out


def layer_violations(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    modules = product_modules(root, packages)
    known = {m.name for m in modules}
    bad = []
    for m in modules:
        own = layer(m.name)
        assert own is not None, m.name
        for line, text, target in imports(m, known):
            theirs = layer(target)
            if theirs is not None and theirs not in ALLOWED[own]:
                where = m.path.relative_to(root)
                bad.append(f"{where}:{line}: `{text}` -- {m.name} ({own}) imports {target} ({theirs})")
    return bad


def long_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    bad = []
    for m in product_modules(root, packages):
        n = len(m.path.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            bad.append(f"{m.path.relative_to(root)}: {n} lines")
    return bad


def project_importorskips(root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / "tests").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source, str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name != "importorskip" or not node.args:
                continue
            arg = node.args[0]
            # a name computed at run time cannot be checked: it counts as the project's
            if not isinstance(arg, ast.Constant) or layer(str(arg.value)) is not None:
                text = ast.get_source_segment(source, node) or ast.unparse(node)
                bad.append(f"{path.relative_to(root)}:{node.lineno}: `{text}`")
    return bad


# --- the contract -------------------------------------------------------------------------------


def test_every_package_is_read() -> None:
    modules = product_modules()
    assert {m.name.split(".")[0] for m in modules} == set(PACKAGES)
    assert {"tidewatch.cli", "tidewatch.stack.embedded", "engine.core"} <= {m.name for m in modules}


def test_each_layer_imports_only_from_below() -> None:
    bad = layer_violations()
    assert not bad, (
        "imports against the layers (base < subscriptions < engine < ingest, dashboard < launcher):\n"
        + ("\n".join(bad))
    )


def test_no_product_module_is_too_long() -> None:
    bad = long_modules()
    assert not bad, f"product modules over {MAX_LINES} lines:\n" + "\n".join(bad)


def test_no_test_skips_on_a_project_import() -> None:
    bad = project_importorskips()
    assert not bad, "pytest.importorskip of the project's own modules (import them directly):\n" + "\n".join(
        bad
    )


# --- the checks themselves find what they look for --------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for pkg in PACKAGES:
        (root / pkg).mkdir(exist_ok=True)
        (root / pkg / "__init__.py").touch()
    return root


def test_the_layer_check_sees_each_kind_of_import(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tidewatch/stack/__init__.py": "",
            "tidewatch/stack/embedded.py": "import dashboard.auth\nfrom ingest import cli\n",  # launcher: fine
            "tidewatch/cli.py": "from engine import app\n",  # launcher: fine
            "tidewatch/settings.py": "from . import schema\nfrom .stack import embedded\n",
            "tidewatch/schema.py": "def f():\n    from tidewatch import cli\n",
            "subscriptions/service.py": "from tidewatch.settings import Settings\nimport engine.core\n",
            "tidewatch/wire/avro.py": "from ..kafka import client\nfrom .. import cli\n",
            "engine/core.py": "from . import decode\nimport tests.engine.support\n",
            "engine/sinks/__init__.py": "from ..core import x\nfrom . import store\n",
            "ingest/feed.py": "from engine.core import x\nfrom dashboard import ui\n",
            "dashboard/app.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ingest.feed\n",
        },
    )
    found = sorted(v.split(" -- ")[0] for v in layer_violations(root))
    assert found == [
        "dashboard/app.py:3: `import ingest.feed`",
        "engine/core.py:2: `import tests.engine.support`",
        "ingest/feed.py:2: `from dashboard import ui`",
        "subscriptions/service.py:2: `import engine.core`",
        "tidewatch/schema.py:2: `from tidewatch import cli`",
        "tidewatch/settings.py:2: `from .stack import embedded`",
        "tidewatch/wire/avro.py:2: `from .. import cli`",
    ]


def test_the_length_check_counts_lines(tmp_path: Path) -> None:
    root = _tree(
        tmp_path, {"engine/ok.py": "x = 1\n" * MAX_LINES, "engine/long.py": "x = 1\n" * (MAX_LINES + 1)}
    )
    assert long_modules(root) == [f"engine/long.py: {MAX_LINES + 1} lines"]


def test_the_importorskip_check_sees_project_modules_only(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tests/a.py": 'import pytest\npytest.importorskip("pyspark")\nx = pytest.importorskip("engine.core")\n',
            "tests/b/c.py": 'from pytest import importorskip\n\ndef f():\n    importorskip("tidewatch")\n',
        },
    )
    assert project_importorskips(root) == [
        'tests/a.py:3: `pytest.importorskip("engine.core")`',
        'tests/b/c.py:4: `importorskip("tidewatch")`',
    ]
