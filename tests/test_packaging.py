"""Packaging: the four folders install as ``flowvault.*`` and nothing else.

A subpackage missing from ``[tool.setuptools] packages`` is silently left
out of the wheel, so these tests compare the list with the tree, inspect
the installed distribution, and install the project into a fresh venv.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]
LAYERS = ("domain", "application", "adapters", "composition")
IMPORT_CHECK = """
import importlib.util, json, sys
import flowvault.domain, flowvault.application, flowvault.adapters, flowvault.composition
import flowvault.application.testing, flowvault.adapters.memory
clashes = [name for name in {layers!r} if importlib.util.find_spec(name) is not None]
print(json.dumps({{"domain": flowvault.domain.__file__, "clashes": clashes}}))
"""


def discovered_packages() -> set[str]:
    """Every folder with an ``__init__.py`` under a mapped folder, as a dotted name."""
    found = set()
    for dotted, folder in PACKAGE_DIR.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((dotted, *relative)))
    return found


def test_package_dir_maps_the_four_layers() -> None:
    """Each layer folder maps to flowvault.<layer> and nothing maps to a top-level name."""
    assert {f"flowvault.{layer}": layer for layer in LAYERS} == PACKAGE_DIR
    assert not (ROOT / "flowvault" / "__init__.py").exists()


def test_every_subpackage_is_listed() -> None:
    """The packages list equals the package folders in the tree (the guard)."""
    assert set(SETUPTOOLS["packages"]) == discovered_packages()


def test_every_mapped_folder_ships_py_typed() -> None:
    """Each layer folder holds a py.typed marker."""
    for layer in LAYERS:
        assert (ROOT / layer / "py.typed").is_file()


def _is_own_metadata(name: str) -> bool:
    return name.startswith("flowvault-") and name.endswith(".dist-info")


def test_installed_distribution_holds_only_flowvault() -> None:
    """The installed distribution's files all live under flowvault/ or its metadata."""
    files = importlib.metadata.distribution("flowvault").files or []
    tops = {file.parts[0] for file in files if file.parts[0] != ".."}
    strays = {top for top in tops if top != "flowvault" and not _is_own_metadata(top)}
    assert strays == set()
    shipped = {str(file) for file in files}
    for layer in LAYERS:
        assert f"flowvault/{layer}/py.typed" in shipped


def test_suite_runs_against_a_regular_install(tmp_path: Path) -> None:
    """The imported package comes from site-packages, and no layer name leaks to top level."""
    report = json.loads(_import_report(Path(sys.executable), tmp_path))
    assert report["clashes"] == []
    domain_file = Path(report["domain"])
    assert "site-packages" in domain_file.parts, "tests must run against a regular install"
    assert not domain_file.is_relative_to(ROOT / "domain")


def _copy_project(target: Path) -> Path:
    """Copy the sources a build needs, so building never writes into the work tree."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md", *LAYERS):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target / name)
    return target


def _pip(*args: str) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, env=env)


def _import_report(python: Path, cwd: Path) -> str:
    result = subprocess.run(
        [str(python), "-P", "-c", IMPORT_CHECK.format(layers=LAYERS)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.slow
def test_wheel_and_editable_installs_in_a_fresh_venv(tmp_path: Path) -> None:
    """A fresh venv gets a clean wheel and a working editable install, both importable anywhere."""
    project = _copy_project(tmp_path / "src")
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(project))
    (wheel,) = (tmp_path / "dist").glob("flowvault-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    strays = {top for top in {n.split("/")[0] for n in names} if top != "flowvault"}
    assert all(_is_own_metadata(top) for top in strays)
    for package in discovered_packages():
        assert package.replace(".", "/") + "/__init__.py" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    _pip("--python", str(python), "install", f"{wheel}[testing]")
    report = json.loads(_import_report(python, elsewhere))
    assert report["clashes"] == []
    assert Path(report["domain"]).is_relative_to(venv)

    _pip("--python", str(python), "uninstall", "-y", "flowvault")
    _pip("--python", str(python), "install", "--no-deps", "-e", str(project))
    report = json.loads(_import_report(python, elsewhere))
    assert report["clashes"] == []
    assert Path(report["domain"]) == project / "domain" / "__init__.py"
