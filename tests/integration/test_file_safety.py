"""File-system safety on a real home: private modes, refusals that name their fix, doctor agreeing.

The store and the key file refuse a home that other local users could read
or swap, and ``flowvault doctor`` must report the very problem the refusal
names, with the same fix, so an operator can act on either. The allowance
``FLOWVAULT_ALLOW_INSECURE_PERMISSIONS`` turns mode problems into warnings
in both places, never a symlinked key file.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import json_document, run_cli
from log_capture import capture_logs

from flowvault.adapters.crypto import FileKeyStore
from flowvault.adapters.crypto._cipher import derive_integrity_key, generate_master_key
from flowvault.composition import Settings, bootstrap
from flowvault.domain import InsecurePermissions, WorkflowState

ALLOW = "FLOWVAULT_ALLOW_INSECURE_PERMISSIONS"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _settings(home: Path) -> Settings:
    return Settings(backend="sqlite", home=home)


def _store_with_state(home: Path) -> Settings:
    settings = _settings(home)
    with bootstrap(settings, create=True) as runtime:
        runtime.state("main").save(WorkflowState(step=1))
    return settings


def _doctor(tmp_path: Path, home: Path, **extra: str) -> tuple[int, dict[str, dict[str, object]]]:
    result = run_cli(tmp_path, "doctor", "--json", home=home, **extra)
    checks = json_document(result)["checks"]
    assert isinstance(checks, list)
    return result.returncode, {str(check["name"]): check for check in checks}


def _private_layout(home: Path) -> dict[str, int]:
    """Return the mode of every entry under ``home``'s data and keys directories."""
    entries = [home / "data", home / "keys"]
    entries += [path for directory in entries for path in directory.iterdir()]
    return {str(path.relative_to(home)): _mode(path) for path in sorted(entries)}


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def test_every_file_stays_private_under_an_open_umask(tmp_path: Path) -> None:
    """With umask 0 the WAL, shared memory, key ring and its lock are still 0600 in 0700 dirs.

    SQLite creates the sidecars itself and the ring is rewritten through
    temporary files, so checking only the freshly created database and key
    would miss the files a working store makes later.
    """
    home = tmp_path / "parent" / "home"
    settings = _settings(home)
    with _umask(0), bootstrap(settings, create=True) as runtime:
        runtime.state("main").save(WorkflowState(step=1))
        keys = FileKeyStore(settings.keys_dir)
        ring = keys.read_ring()
        assert ring is not None
        keys.replace_ring(
            ring.promote(generate_master_key(), integrity=derive_integrity_key(ring.primary)),
            expected=ring,
        )
        runtime.state("main").save(WorkflowState(step=2))
        runtime.workflows.compact()
        layout = _private_layout(home)
        code, checks = _doctor(tmp_path, home)

    assert stat.S_IMODE(home.stat().st_mode) == 0o700, "a parent bootstrap makes is private too"
    assert stat.S_IMODE(home.parent.stat().st_mode) == 0o700
    assert layout == {
        "data": 0o700,
        "data/flowvault.db": 0o600,
        "data/flowvault.db-shm": 0o600,
        "data/flowvault.db-wal": 0o600,
        "keys": 0o700,
        "keys/.store.key.lock": 0o600,
        "keys/store.high-water": 0o600,
        "keys/store.key": 0o600,
    }
    assert code == 0
    permissions = {name: check for name, check in checks.items() if name.startswith("permissions.")}
    assert len(permissions) == 7
    assert all(check["ok"] for check in permissions.values()), permissions
    assert "has mode 0600" in str(permissions["permissions.wal"]["finding"])


@dataclass(frozen=True)
class Loosened:
    """One unsafe mode: what to loosen, the doctor check that names it, and the fix."""

    path: Callable[[Settings], Path]
    mode: int
    check: str
    wanted: int

    def fix(self, settings: Settings) -> str:
        return f"chmod {self.wanted:o} {self.path(settings)}"


LOOSENED = {
    "data-dir-group-writable": Loosened(lambda s: s.data_dir, 0o770, "permissions.data_dir", 0o700),
    "data-dir-world-writable": Loosened(lambda s: s.data_dir, 0o703, "permissions.data_dir", 0o700),
    "database-world-readable": Loosened(
        lambda s: s.database_path, 0o644, "permissions.database", 0o600
    ),
    "keys-dir-group-writable": Loosened(lambda s: s.keys_dir, 0o770, "permissions.keys_dir", 0o700),
    "key-file-group-readable": Loosened(lambda s: s.key_path, 0o640, "permissions.key_file", 0o600),
    "key-file-world-writable": Loosened(lambda s: s.key_path, 0o602, "permissions.key_file", 0o600),
}


@pytest.mark.parametrize("name", LOOSENED)
def test_unsafe_mode_is_refused_and_doctor_names_the_same_fix(tmp_path: Path, name: str) -> None:
    """Opening fails with INSECURE_PERMISSIONS naming a chmod; doctor fails with that chmod."""
    case = LOOSENED[name]
    settings = _store_with_state(tmp_path / "home")
    target = case.path(settings)
    target.chmod(case.mode)
    fix = case.fix(settings)

    with pytest.raises(InsecurePermissions) as caught:
        bootstrap(settings, create=True)
    assert caught.value.code == "INSECURE_PERMISSIONS"
    assert fix in caught.value.message

    code, checks = _doctor(tmp_path, settings.home)
    assert code == 1
    assert checks[case.check]["ok"] is False
    assert checks[case.check]["severity"] == "error"
    assert checks[case.check]["fix"] == fix
    assert f"{case.mode:04o}" in str(checks[case.check]["finding"])
    assert _mode(target) == case.mode


@pytest.mark.parametrize("name", LOOSENED)
def test_allowing_insecure_permissions_warns_in_the_store_and_in_doctor(
    tmp_path: Path, name: str
) -> None:
    """With the allowance the store opens and logs the fix; doctor warns and exits 0."""
    case = LOOSENED[name]
    settings = _store_with_state(tmp_path / "home")
    target = case.path(settings)
    target.chmod(case.mode)
    fix = case.fix(settings)

    with capture_logs() as logs:
        runtime = bootstrap(
            Settings.from_env({"FLOWVAULT_HOME": str(settings.home), ALLOW: "true"}), create=True
        )
    with runtime:
        assert runtime.state("main").load().state == WorkflowState(step=1)
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert any(fix in str(entry["fix"]) for entry in warnings), warnings

    code, checks = _doctor(tmp_path, settings.home, **{ALLOW: "true"})
    assert code == 0
    assert checks[case.check]["ok"] is False
    assert checks[case.check]["severity"] == "warning"
    assert checks[case.check]["fix"] == fix
    assert _mode(target) == case.mode


@pytest.mark.parametrize("mode", [0o750, 0o755, 0o711])
@pytest.mark.parametrize("which", ["data_dir", "keys_dir"])
def test_a_listable_directory_opens_and_doctor_only_warns(
    tmp_path: Path, mode: int, which: str
) -> None:
    """Read or search bits without write bits are what the store accepts: doctor agrees, warning."""
    settings = _store_with_state(tmp_path / "home")
    target: Path = getattr(settings, which)
    target.chmod(mode)
    with bootstrap(settings, create=True) as runtime:
        assert runtime.state("main").load().state == WorkflowState(step=1)
    code, checks = _doctor(tmp_path, settings.home)
    check = checks[f"permissions.{which}"]
    assert code == 0
    assert (check["ok"], check["severity"]) == (False, "warning")
    assert check["fix"] == f"chmod 700 {target}"
    assert "the store accepts this" in str(check["finding"])
    assert _mode(target) == mode


def test_loosened_sidecars_are_reported_and_made_private_again(tmp_path: Path) -> None:
    """A readable WAL or shared-memory file is a doctor error, and the next open restores 0600."""
    settings = _settings(tmp_path / "home")
    database = settings.database_path
    wal, shm = (database.with_name(database.name + suffix) for suffix in ("-wal", "-shm"))
    with bootstrap(settings, create=True) as first:
        first.state("main").save(WorkflowState(step=1))
        wal.chmod(0o644)
        shm.chmod(0o640)

        code, checks = _doctor(tmp_path, settings.home)
        assert code == 1
        assert checks["permissions.wal"]["fix"] == f"chmod 600 {wal}"
        assert checks["permissions.shm"]["fix"] == f"chmod 600 {shm}"
        assert checks["permissions.wal"]["severity"] == "error"

        with bootstrap(settings, create=True) as second:
            assert second.state("main").load().revision == 1
        assert (_mode(wal), _mode(shm)) == (0o600, 0o600)
        code, checks = _doctor(tmp_path, settings.home)
        assert code == 0, checks


def _symlinked_key(tmp_path: Path) -> tuple[Settings, Path]:
    """Replace the key file with a symlink to a private copy of the very same key."""
    settings = _store_with_state(tmp_path / "home")
    target = tmp_path / "elsewhere.key"
    target.write_bytes(settings.key_path.read_bytes())
    target.chmod(0o600)
    settings.key_path.unlink()
    settings.key_path.symlink_to(target)
    return settings, target


@pytest.mark.parametrize("allowed", [False, True])
def test_symlinked_key_file_is_refused_and_doctor_reports_it(tmp_path: Path, allowed: bool) -> None:
    """A symlink in place of the key file is refused even when insecure modes are allowed."""
    settings, target = _symlinked_key(tmp_path)
    environ = {"FLOWVAULT_HOME": str(settings.home), ALLOW: str(allowed).lower()}

    with pytest.raises(InsecurePermissions) as caught:
        bootstrap(Settings.from_env(environ), create=True)
    assert "is a symlink" in caught.value.message
    assert f"chmod 600 {settings.key_path}" in caught.value.message

    code, checks = _doctor(tmp_path, settings.home, **{ALLOW: str(allowed).lower()})
    assert code == 1
    assert checks["permissions.key_file"]["ok"] is False
    assert checks["permissions.key_file"]["severity"] == "error"
    assert "symlink" in str(checks["permissions.key_file"]["fix"])
    assert checks["key.found"]["ok"] is False
    assert checks["key.found"]["severity"] == "error"
    assert "is a symlink" in str(checks["key.found"]["finding"])
    assert settings.key_path.is_symlink()
    assert target.is_file()


def test_key_file_swapped_for_a_symlink_after_its_check_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key file is opened with O_NOFOLLOW, so a swap after the ``lstat`` check still fails.

    The symlink points at a private copy of the right key, which every check
    made on the opened file would accept: only O_NOFOLLOW refuses it.
    """
    settings = _store_with_state(tmp_path / "home")
    key_path = settings.key_path
    target = tmp_path / "elsewhere.key"
    target.write_bytes(key_path.read_bytes())
    target.chmod(0o600)
    opened: list[int] = []
    real_open = os.open

    def swapping_open(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: int) -> int:
        if Path(path) == key_path and not opened:
            opened.append(flags)
            key_path.unlink()
            key_path.symlink_to(target)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", swapping_open)
    with pytest.raises(InsecurePermissions) as caught:
        bootstrap(settings, create=True)
    monkeypatch.undo()

    assert len(opened) == 1
    assert opened[0] & os.O_NOFOLLOW
    assert key_path.is_symlink()
    assert "is a symlink" in caught.value.message
