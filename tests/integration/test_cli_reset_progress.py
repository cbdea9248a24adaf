"""The ``flowvault reset-progress`` verb, run as a real console-script subprocess."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path

import pytest
from cli_helpers import FLOWVAULT, TIMEOUT
from cli_helpers import cli_env as _env
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

from flowvault.application._state import RESET_EVENT, STATE_WRITTEN_EVENT
from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkflowState

MARKER = "plaintext-marker-7f3c91d2"
OTHER_MARKER = "other-scope-marker-b41e"


def _settings(home: Path) -> Settings:
    return Settings(backend="sqlite", home=home)


def _prepare(home: Path) -> None:
    with bootstrap(_settings(home), create=True) as runtime:
        runtime.state("main").save(WorkflowState(step=3, note=MARKER))
        runtime.state("other").save(WorkflowState(step=9, note=OTHER_MARKER))


def _revision(home: Path, scope: str = "main") -> int | None:
    with bootstrap(_settings(home), create=True) as runtime:
        return runtime.state(scope).load().revision


# -- cold root -----------------------------------------------------------------


@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--yes"]])
def test_cold_root_reports_absent_and_creates_nothing(tmp_path: Path, extra: list[str]) -> None:
    """On a home that does not exist the verb reports an absent state and creates nothing."""
    home = tmp_path / "absent" / "home"
    result = _run(tmp_path, "reset-progress", "--scope", "main", "--json", *extra, home=home)
    assert result.returncode == 0, result.stderr
    document = _document(result)
    assert document["cold_root"] is True
    assert document["applied"] is False
    fingerprint = document["fingerprint"]
    assert isinstance(fingerprint, dict)
    assert fingerprint["scope"] == "main"
    assert fingerprint["readability"] == "absent"
    metadata = {k: v for k, v in fingerprint.items() if k not in {"scope", "readability"}}
    metadata.pop("reason_class")
    assert metadata
    assert all(value is None for value in metadata.values())
    assert not (tmp_path / "absent").exists()
    assert not (tmp_path / "xdg").exists()


def test_cold_root_human_output_mentions_the_cold_root(tmp_path: Path) -> None:
    """Without --json the verb tells a person the root is cold and nothing was reset."""
    home = tmp_path / "nowhere"
    result = _run(tmp_path, "reset-progress", "--scope", "main", home=home)
    assert result.returncode == 0, result.stderr
    assert "cold root" in result.stdout
    assert "absent" in result.stdout
    assert not home.exists()


# -- warm root -----------------------------------------------------------------


def test_dry_run_fingerprints_without_deleting(tmp_path: Path) -> None:
    """A dry run prints a readable fingerprint at revision 1 and leaves the state in place."""
    home = tmp_path / "home"
    _prepare(home)
    result = _run(tmp_path, "reset-progress", "--scope", "main", "--dry-run", "--json", home=home)
    assert result.returncode == 0, result.stderr
    document = _document(result)
    assert document["applied"] is False
    assert document["cold_root"] is False
    fingerprint = document["fingerprint"]
    assert isinstance(fingerprint, dict)
    assert fingerprint["readability"] == "readable"
    assert fingerprint["revision"] == 1
    assert fingerprint["namespace"] == "flowvault.workflow-state"
    assert MARKER not in result.stdout + result.stderr
    with bootstrap(_settings(home), create=True) as runtime:
        snapshot = runtime.state("main").load()
        assert snapshot.revision == 1
        assert snapshot.state.model_dump() == {"step": 3, "note": MARKER}
        assert [e.type for e in runtime.state("main").history()] == [STATE_WRITTEN_EVENT]


def test_reset_deletes_state_and_records_a_plaintext_free_event(tmp_path: Path) -> None:
    """Reset deletes only the scope's state and records one event with the fingerprint."""
    home = tmp_path / "home"
    _prepare(home)
    result = _run(
        tmp_path,
        "reset-progress",
        "--scope",
        "main",
        "--yes",
        "--json",
        "--actor",
        "ops",
        "--reason",
        "corrupt",
        home=home,
    )
    assert result.returncode == 0, result.stderr
    document = _document(result)
    assert document["applied"] is True
    assert document["cold_root"] is False
    fingerprint = document["fingerprint"]
    assert isinstance(fingerprint, dict)
    assert fingerprint["reason_class"] == "corrupt"
    assert fingerprint["readability"] == "readable"
    assert fingerprint["revision"] == 1
    assert MARKER not in result.stdout + result.stderr

    with bootstrap(_settings(home), create=True) as runtime:
        main = runtime.state("main")
        assert main.load().revision is None
        events = main.history()
        other = runtime.state("other").load()
        other_history = runtime.state("other").history()
        actor_digest = runtime.repository.keyed_digest("flowvault.decider/1", "ops")
    assert [event.type for event in other_history] == [STATE_WRITTEN_EVENT]
    assert [event.type for event in events] == [STATE_WRITTEN_EVENT, RESET_EVENT]
    payload = events[1].payload
    assert isinstance(payload, dict)
    assert payload["fingerprint"] == fingerprint
    assert payload["actor"] == actor_digest
    assert payload["source"] == "flowvault reset-progress"
    assert payload["reason"] == "corrupt"
    assert MARKER not in json.dumps(events[0].model_dump(mode="json"))
    assert other.revision == 1
    assert other.state.model_dump() == {"step": 9, "note": OTHER_MARKER}


def test_reset_human_output_carries_no_plaintext(tmp_path: Path) -> None:
    """The person-readable output of a reset shows the verdict and fingerprint, never state."""
    home = tmp_path / "home"
    _prepare(home)
    result = _run(tmp_path, "reset-progress", "--scope", "main", "--yes", home=home)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("reset:")
    assert "payload_digest: sha256:" in result.stdout
    assert MARKER not in result.stdout + result.stderr
    assert _revision(home) is None


def test_non_tty_without_yes_proceeds(tmp_path: Path) -> None:
    """Without a terminal the verb asks nothing and resets even without --yes."""
    home = tmp_path / "home"
    _prepare(home)
    result = _run(tmp_path, "reset-progress", "--scope", "main", "--json", home=home)
    assert result.returncode == 0, result.stderr
    assert _document(result)["applied"] is True
    assert "[y/N]" not in result.stdout
    assert _revision(home) is None
    assert _revision(home, "other") == 1


# -- TTY confirmation ----------------------------------------------------------


def _read_until(fd: int, needle: bytes, deadline: float) -> bytes:
    seen = b""
    while needle not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"timed out waiting for {needle!r}; saw {seen!r}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed its end of the terminal
            chunk = b""
        if not chunk:
            pytest.fail(f"terminal closed before {needle!r}; saw {seen!r}")
        seen += chunk
    return seen


def _drain(fd: int, deadline: float) -> bytes:
    seen = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    return seen


def _answer_on_tty(
    tmp_path: Path, home: Path, answer: bytes, scope: str = "main"
) -> tuple[int, str]:
    """Run the verb on a pseudo-terminal (stdin, stdout and stderr) and answer its prompt."""
    controller, terminal = os.openpty()
    try:
        process = subprocess.Popen(
            [str(FLOWVAULT), "--home", str(home), "reset-progress", "--scope", scope],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            env=_env(tmp_path),
        )
        os.close(terminal)
        terminal = -1
        try:
            deadline = time.monotonic() + TIMEOUT
            shown = _read_until(controller, b"[y/N]", deadline)
            os.write(controller, answer)
            process.wait(timeout=TIMEOUT)
            shown += _drain(controller, time.monotonic() + 2.0)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    return process.returncode, shown.decode(errors="replace")


def test_tty_declined_confirmation_keeps_the_state(tmp_path: Path) -> None:
    """On a terminal, answering no aborts with status 1 and leaves the state in place."""
    home = tmp_path / "home"
    _prepare(home)
    status, shown = _answer_on_tty(tmp_path, home, b"n\n")
    assert status == 1
    assert "would delete:" in shown
    assert "dry run" not in shown
    assert "aborted" in shown
    assert MARKER not in shown
    assert _revision(home) == 1
    with bootstrap(_settings(home), create=True) as runtime:
        assert [e.type for e in runtime.state("main").history()] == [STATE_WRITTEN_EVENT]


def test_tty_accepted_confirmation_resets(tmp_path: Path) -> None:
    """On a terminal, answering yes resets the state and exits 0."""
    home = tmp_path / "home"
    _prepare(home)
    status, shown = _answer_on_tty(tmp_path, home, b"y\n")
    assert status == 0, shown
    assert "reset:" in shown
    assert "aborted" not in shown
    assert _revision(home) is None
    assert _revision(home, "other") == 1


def test_tty_absent_scope_says_nothing_was_there(tmp_path: Path) -> None:
    """On a terminal, a scope with no state is reported as having nothing to delete."""
    home = tmp_path / "home"
    _prepare(home)
    status, shown = _answer_on_tty(tmp_path, home, b"y\n", scope="never-written")
    assert status == 0, shown
    before_prompt = shown.split("[y/N]")[0]
    assert "dry run" not in before_prompt
    assert "no state in this scope" in before_prompt
    assert "nothing to delete" in shown.split("[y/N]")[1]
    assert "state deleted" not in shown
    assert _revision(home) == 1


# -- errors --------------------------------------------------------------------


def test_missing_key_is_key_required_in_text_mode(tmp_path: Path) -> None:
    """With data present and the key file gone, the verb exits 1 with KEY_REQUIRED on stderr."""
    home = tmp_path / "home"
    _prepare(home)
    key_file = home / "keys" / "store.key"
    saved = key_file.read_bytes()
    key_file.unlink()
    result = _run(tmp_path, "reset-progress", "--scope", "main", "--yes", home=home)
    assert result.returncode == 1
    assert "KEY_REQUIRED" in result.stderr
    assert result.stdout == ""
    assert not key_file.exists()
    key_file.write_bytes(saved)
    key_file.chmod(0o600)
    assert _revision(home) == 1


def test_missing_key_is_key_required_in_json_mode(tmp_path: Path) -> None:
    """In --json mode a missing key is reported as a JSON error object on stdout."""
    home = tmp_path / "home"
    _prepare(home)
    (home / "keys" / "store.key").unlink()
    result = _run(tmp_path, "reset-progress", "--scope", "main", "--yes", "--json", home=home)
    assert result.returncode == 1
    document = _document(result)
    error = document["error"]
    assert isinstance(error, dict)
    assert error["code"] == "KEY_REQUIRED"
    assert error["message"]


@pytest.mark.parametrize("warm", [False, True])
def test_malformed_scope_is_invalid_input(tmp_path: Path, warm: bool) -> None:
    """A malformed scope exits 1 with INVALID_INPUT, on a cold root and on a warm one."""
    home = tmp_path / "home"
    if warm:
        _prepare(home)
    result = _run(tmp_path, "reset-progress", "--scope", "bad scope!", "--yes", home=home)
    assert result.returncode == 1
    assert "INVALID_INPUT" in result.stderr
    assert home.exists() is warm


def test_missing_scope_is_a_usage_error(tmp_path: Path) -> None:
    """Omitting the required --scope is a usage error with exit status 2."""
    result = _run(tmp_path, "reset-progress", home=tmp_path / "home")
    assert result.returncode == 2
    assert "--scope" in result.stderr
    assert not (tmp_path / "home").exists()


def test_help_mentions_the_exit_codes(tmp_path: Path) -> None:
    """--help exits 0 and documents the exit statuses."""
    result = _run(tmp_path, "reset-progress", "--help")
    assert result.returncode == 0
    assert "exit codes" in result.stdout
    for line in ("0  success", "1  a flowvault error", "2  usage error"):
        assert line in result.stdout


# -- environment ---------------------------------------------------------------


def test_flowvault_home_environment_replaces_the_flag(tmp_path: Path) -> None:
    """FLOWVAULT_HOME selects the home when --home is not given."""
    home = tmp_path / "home"
    _prepare(home)
    dry = _run(
        tmp_path,
        "reset-progress",
        "--scope",
        "main",
        "--dry-run",
        "--json",
        FLOWVAULT_HOME=str(home),
    )
    assert dry.returncode == 0, dry.stderr
    fingerprint = _document(dry)["fingerprint"]
    assert isinstance(fingerprint, dict)
    assert fingerprint["readability"] == "readable"
    assert fingerprint["revision"] == 1
    applied = _run(
        tmp_path, "reset-progress", "--scope", "main", "--yes", "--json", FLOWVAULT_HOME=str(home)
    )
    assert applied.returncode == 0, applied.stderr
    assert _document(applied)["applied"] is True
    assert _revision(home) is None
    assert not (tmp_path / "xdg").exists()


def test_home_flag_wins_over_the_environment(tmp_path: Path) -> None:
    """--home takes precedence over FLOWVAULT_HOME."""
    home = tmp_path / "home"
    _prepare(home)
    elsewhere = tmp_path / "elsewhere"
    result = _run(
        tmp_path,
        "reset-progress",
        "--scope",
        "main",
        "--dry-run",
        "--json",
        home=elsewhere,
        FLOWVAULT_HOME=str(home),
    )
    assert result.returncode == 0, result.stderr
    assert _document(result)["cold_root"] is True
    assert not elsewhere.exists()
