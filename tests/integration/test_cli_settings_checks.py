"""Homes, settings and database files that are plainly wrong are refused, naming what to fix.

Each case runs ``flowvault`` as a real subprocess and checks afterwards
that nothing was created: no key file, no database, no directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import FLOWVAULT, TIMEOUT, cli_env
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

from flowvault.composition import Settings, bootstrap


def _error(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 1, result.stdout + result.stderr
    error = _document(result)["error"]
    assert isinstance(error, dict)
    return error


def _files(root: Path) -> set[Path]:
    return {path.relative_to(root) for path in root.rglob("*")}


def test_home_that_is_a_regular_file_is_refused(tmp_path: Path) -> None:
    """``--home FILE`` names the option and the fix, and nothing is created."""
    home = tmp_path / "a-file"
    home.write_text("not a home")
    result = _run(tmp_path, "workflows", "list", "--json", home=home)
    error = _error(result)
    assert error["code"] == "INVALID_INPUT"
    assert "--home" in error["message"]
    assert "must name a directory, not a file" in error["message"]
    assert _files(tmp_path) == {Path("a-file")}


def test_empty_home_variable_is_refused(tmp_path: Path) -> None:
    """``FLOWVAULT_HOME=`` (set but empty) is not taken for the current directory."""
    work = tmp_path / "cwd"
    work.mkdir()
    result = subprocess.run(
        [str(FLOWVAULT), "init", "--json"],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path, FLOWVAULT_HOME=""),
        cwd=work,
        timeout=TIMEOUT,
        check=False,
    )
    error = _error(result)
    assert error["code"] == "INVALID_INPUT"
    assert "FLOWVAULT_HOME: must not be empty" in error["message"]
    assert _files(tmp_path) == {Path("cwd")}


def test_home_that_is_a_broken_symlink_is_refused(tmp_path: Path) -> None:
    """A home that is a link to nothing is refused, not created through the link."""
    home = tmp_path / "link"
    home.symlink_to(tmp_path / "gone")
    error = _error(_run(tmp_path, "init", "--json", home=home))
    assert error["code"] == "INVALID_INPUT"
    assert "symbolic link to nothing" in error["message"]
    assert not (tmp_path / "gone").exists()


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("FLOWVAULT_BUSY_TIMEOUT", "-1", "FLOWVAULT_BUSY_TIMEOUT: Input should be greater than 0"),
        ("FLOWVAULT_BUSY_TIMEOUT", "", "(allowed: > 0 and <= 3600)"),
        ("FLOWVAULT_RUN_LEASE", "0", "(allowed: >= 1 and <= 3600)"),
        ("FLOWVAULT_POSTGRES_POOL_SIZE", "1000", "(allowed: >= 1 and <= 100)"),
        ("FLOWVAULT_BACKEND", "oracle", "'sqlite', 'memory' or 'postgres'"),
        ("FLOWVAULT_BAKCEND", "sqlite", "FLOWVAULT_BAKCEND: unknown setting"),
        ("FLOWVAULT_SEAL_WARN_AT", "99", "FLOWVAULT_SEAL_WARN_AT must not exceed"),
    ],
)
def test_each_refused_setting_names_its_variable_and_range(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    """A refused value names its variable and what it allows, and creates nothing."""
    home = tmp_path / "home"
    extra = {variable: value}
    if variable == "FLOWVAULT_SEAL_WARN_AT":
        extra["FLOWVAULT_SEAL_LIMIT"] = "10"
    error = _error(_run(tmp_path, "init", "--json", home=home, **extra))
    assert error["code"] == "INVALID_INPUT"
    assert expected in error["message"]
    assert not home.exists()


@pytest.mark.parametrize("verb", [("workflows", "list"), ("runs", "list"), ("status",)])
def test_empty_database_file_is_not_taken_for_a_store(
    tmp_path: Path, verb: tuple[str, ...]
) -> None:
    """A 0-byte database file is reported with a fix; no key and no schema are created."""
    settings = Settings(backend="sqlite", home=tmp_path / "home")
    settings.data_dir.mkdir(parents=True, mode=0o700)
    settings.home.chmod(0o700)
    settings.database_path.touch(mode=0o600)
    error = _error(_run(tmp_path, *verb, "--json", home=settings.home))
    assert error["code"] == "STORE_UNAVAILABLE"
    assert "empty file" in error["message"]
    assert "flowvault init" in error["fix"]
    assert not settings.key_path.exists()
    assert settings.database_path.stat().st_size == 0
    assert _files(settings.home) == {Path("data"), Path("data/flowvault.db")}


# -- permission denied ---------------------------------------------------------


def _as_other_user() -> list[str]:
    """Return the command prefix that runs the CLI as a user the test's files deny.

    Root reads any file whatever its mode, so as root the CLI runs as
    ``nobody`` through ``setpriv``; CI runs as root and must not skip.
    """
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the CLI as a user the files deny")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs setpriv (util-linux) to run the CLI as another user")
        pytest.skip("needs setpriv (util-linux) to run the CLI as another user")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """Provide a directory every user can reach, unlike pytest's private ``tmp_path``."""
    path = Path(tempfile.mkdtemp(prefix="flowvault-perm-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _run_as_other(tmp_path: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_as_other_user(), str(FLOWVAULT), "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT,
        check=False,
    )


def test_unreadable_home_names_the_path_and_a_fix(tmp_path: Path, shared_dir: Path) -> None:
    """A home another user owns (mode 0700) is STORE_UNAVAILABLE naming the path denied."""
    _as_other_user()
    home = shared_dir / "home"
    bootstrap(Settings(backend="sqlite", home=home), create=True).close()
    result = _run_as_other(tmp_path, home, "workflows", "list", "--json")
    error = _error(result)
    assert error["code"] == "STORE_UNAVAILABLE"
    assert str(home) in error["message"]
    assert "permission denied" in error["message"]
    assert "chown or chmod" in error["fix"]


def test_unreadable_database_names_the_file(tmp_path: Path, shared_dir: Path) -> None:
    """A database file the user may not open is named, not reported as SQLITE_CANTOPEN."""
    _as_other_user()
    home = shared_dir / "home"
    settings = Settings(backend="sqlite", home=home)
    bootstrap(settings, create=True).close()
    for path in (home, *home.rglob("*")):
        os.chown(path, 65534, 65534)
    os.chown(settings.database_path, 0, 0)
    for args in (("workflows", "list"), ("ledger", "verify", "--all")):
        error = _error(_run_as_other(tmp_path, home, *args, "--json"))
        assert error["code"] == "STORE_UNAVAILABLE"
        assert error["message"] == f"permission denied: {settings.database_path}"
        assert str(settings.database_path) in error["fix"]
