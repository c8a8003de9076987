"""One exception root: every Tidewatch exception derives from TidewatchError through its package's
root, keeping its builtin base; each package names its public API and imports cheaply."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tidewatch.errors import TidewatchError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tidewatch", "subscriptions", "engine", "ingest", "dashboard")
#: the root of each package's errors (the base package's errors derive from TidewatchError itself)
ROOTS = {
    "tidewatch": "tidewatch.errors.TidewatchError",
    "subscriptions": "subscriptions.errors.SubscriptionsError",
    "engine": "engine.errors.EngineError",
    "ingest": "ingest.errors.IngestError",
    "dashboard": "dashboard.errors.DashboardError",
}
#: builtin bases the classes had before they got a Tidewatch root (``except ValueError`` etc.)
BUILTIN_BASES = {
    "tidewatch.wire.csv_io.CsvError": ValueError,
    "tidewatch.wire.avro.AvroDecodeError": ValueError,
    "tidewatch.kafka.txn.KafkaStalled": RuntimeError,
    "tidewatch.kafka.tools.KafkaToolError": RuntimeError,
    "tidewatch.stack.processes.StartupFailed": RuntimeError,
    "subscriptions.errors.RuleError": ValueError,
    "subscriptions.outbox.RelayBusy": RuntimeError,
    "ingest.pcap.PcapError": ValueError,
    "ingest.producer.ProgressMismatch": RuntimeError,
    "dashboard.detail.KafkaUnavailable": RuntimeError,
}


def _resolve(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    assert isinstance(obj, type)
    return obj


def exception_classes() -> list[str]:
    """Dotted names of the product's classes whose bases name an Error or Exception (by ast)."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(b).endswith(("Error", "Exception")) for b in node.bases
                ):
                    out.append(f"{module}.{node.name}")
    return out


def test_the_scan_finds_the_known_errors() -> None:
    found = set(exception_classes())
    assert set(BUILTIN_BASES) <= found
    assert {"subscriptions.service.NotFound", "engine.evaluation.backtest.MalformedRows"} <= found


@pytest.mark.parametrize("dotted", exception_classes())
def test_every_error_derives_from_its_package_root(dotted: str) -> None:
    cls = _resolve(dotted)
    if not issubclass(cls, BaseException):
        pytest.skip(f"{dotted} is not an exception")
    root = _resolve(ROOTS[dotted.split(".")[0]])
    assert issubclass(cls, root) and issubclass(cls, TidewatchError), cls.__mro__
    if dotted in BUILTIN_BASES:
        assert issubclass(cls, BUILTIN_BASES[dotted])


def test_package_roots_derive_from_tidewatch_error() -> None:
    for pkg, dotted in ROOTS.items():
        root = _resolve(dotted)
        assert issubclass(root, TidewatchError)
        assert getattr(importlib.import_module(pkg), root.__name__) is root


@pytest.mark.parametrize("pkg", PACKAGES)
def test_every_public_name_resolves(pkg: str) -> None:
    mod = importlib.import_module(pkg)
    assert ROOTS[pkg].rpartition(".")[2] in mod.__all__
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name
    assert set(mod.__all__) <= set(dir(mod))
    with pytest.raises(AttributeError):
        _ = mod.no_such_name  # type: ignore[attr-defined]


def test_package_imports_stay_cheap() -> None:
    """``import engine`` (and the others) loads only the error roots: no PySpark, Numba, Kafka
    client, SQLAlchemy, pydantic, Streamlit, and not even ``typing``."""
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        f"import {', '.join(PACKAGES)}\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert loaded <= {
        *PACKAGES,
        *(f"{p}.errors" for p in PACKAGES),
        "tidewatch.lazy",
        "__future__",
    }, loaded
