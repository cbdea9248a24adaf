"""The layer rule, checked by parsing every import in the four code folders.

domain <- application <- adapters <- composition: nothing imports upward,
and the domain stays pure (standard library and pydantic only).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"domain": 0, "application": 1, "adapters": 2, "composition": 3}
DOMAIN_THIRD_PARTY = {"pydantic", "pydantic_core", "typing_extensions"}
IMPURE_STDLIB = {
    "os", "io", "sys", "socket", "sqlite3", "random", "secrets", "time", "subprocess",
    "threading", "multiprocessing", "pathlib", "shutil", "tempfile", "logging", "uuid",
}  # fmt: skip


def _imports(path: Path) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(("." * node.level + (node.module or ""), node.lineno))
            elif node.module:
                found.append((node.module, node.lineno))
    return found


def _sources(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


def violations(layer: str, path: Path, layer_root: Path | None = None) -> list[str]:
    """Return the import-rule violations of one source file."""
    rank = LAYERS[layer]
    relative = path.relative_to(layer_root or ROOT / layer)
    depth = len(relative.parts) - 1
    problems = []
    for name, line in _imports(path):
        where = f"{layer}/{relative}:{line} imports {name}"
        if name.startswith("."):
            if len(name) - len(name.lstrip(".")) > depth:
                problems.append(f"{where}: relative import leaves its layer")
            continue
        parts = name.split(".")
        if parts[0] in LAYERS:
            problems.append(f"{where}: import without the flowvault prefix")
        if parts[0] == "flowvault" and len(parts) > 1 and LAYERS.get(parts[1], -1) > rank:
            problems.append(f"{where}: upward import")
        if layer == "domain" and parts[0] != "flowvault":
            if parts[0] not in sys.stdlib_module_names and parts[0] not in DOMAIN_THIRD_PARTY:
                problems.append(f"{where}: the domain may use only stdlib and pydantic")
            if parts[0] in IMPURE_STDLIB:
                problems.append(f"{where}: the domain does no I/O, clock or randomness")
    return problems


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_imports_point_inward(layer: str) -> None:
    """No module imports a layer above its own, and the domain stays pure."""
    sources = _sources(layer)
    assert sources, f"layer {layer} has no sources"
    problems = [problem for path in sources for problem in violations(layer, path)]
    assert problems == []


def test_checker_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself flags an upward and an impure import (negative control)."""
    fake = tmp_path / "probe.py"
    fake.write_text("import sqlite3\nfrom flowvault.adapters import memory\nimport domain\n")
    problems = violations("domain", fake, tmp_path)
    assert any("upward import" in p for p in problems)
    assert any("does no I/O" in p for p in problems)
    assert any("without the flowvault prefix" in p for p in problems)
