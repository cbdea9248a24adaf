"""The public surface is what hosts and adapter authors use, and every name of it is documented."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import flowvault.adapters
import flowvault.application
import flowvault.composition
import flowvault.domain

ROOT = Path(__file__).resolve().parent.parent
LAYERS = (flowvault.domain, flowvault.application, flowvault.adapters, flowvault.composition)


def _public_packages() -> list[str]:
    names = [layer.__name__ for layer in LAYERS]
    for layer in LAYERS:
        names += [
            info.name
            for info in pkgutil.walk_packages(layer.__path__, f"{layer.__name__}.")
            if info.ispkg and not info.name.rsplit(".", 1)[1].startswith("_")
        ]
    return sorted(set(names))


PACKAGES = _public_packages()
DOCS = "\n".join(
    path.read_text(encoding="utf-8")
    for path in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
)


def _documented(name: str) -> bool:
    word = re.escape(name)
    quoted = re.search(rf"`[^`\n]*\b{word}\b[^`\n]*`", DOCS)
    imported = re.search(rf"^from flowvault\.[\w.]+ import[^\n]*\b{word}\b", DOCS, re.MULTILINE)
    listed = re.search(rf"^    {word},$", DOCS, re.MULTILINE)
    return bool(quoted or imported or listed)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_is_documented(package: str) -> None:
    """A name a package exports appears in the README or docs/, so a host can learn what it is."""
    module = importlib.import_module(package)
    missing = [name for name in getattr(module, "__all__", ()) if not _documented(name)]
    assert not missing, f"{package} exports names no doc mentions: {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_all_names_exactly_what_the_package_imports(package: str) -> None:
    """``__all__`` lists every public name the package binds, and nothing it does not.

    Every listed name must resolve, whether bound at import or on first use.
    """
    module = importlib.import_module(package)
    exported = set(getattr(module, "__all__", ()))
    for name in exported:
        getattr(module, name)  # a package that imports on first use binds the name now
    bound = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, type(module))
    }
    assert exported == bound
