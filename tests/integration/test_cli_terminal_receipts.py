"""Terminal receipts through the installed command, on a real SQLite file.

Runs end in-process under a signing key (through ``set_status``, recovery
and ``finish_run``); ``runs receipt`` prints a receipt with the store key,
and ``ledger check-receipt`` checks it elsewhere with the public key alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

from flowvault.application.testing import FrozenClock
from flowvault.composition import Settings, bootstrap
from flowvault.domain import (
    InsecurePermissions,
    InvalidInput,
    KeyRequired,
    parse_terminal_receipt,
)

INPUT_MARKER = "terminal-input-3a9e-do-not-leak"
FINAL_MARKER = "terminal-final-61bd-do-not-leak"


@dataclass(frozen=True, slots=True)
class Ended:
    """A home with runs ended in several ways, and the signing key pair used."""

    home: Path
    public_key: Path
    failed: str
    recovered: str
    finished_unsigned: str
    running: str


def _settings(home: Path, signing_key: Path | None) -> Settings:
    return Settings(backend="sqlite", home=home, signing_key_file=signing_key)


@pytest.fixture
def ended(tmp_path: Path) -> Ended:
    """End one run by set_status and one by recovery under a signing key, one without it."""
    home = tmp_path / "home"
    key = tmp_path / "signing" / "receipts.pem"
    made = _run(tmp_path, "keys", "signing-key", "--out", str(key))
    assert made.returncode == 0, made.stderr
    clock = FrozenClock(datetime.now(UTC))
    with bootstrap(_settings(home, key), create=True, clock=clock) as runtime:
        runs = runtime.runs
        runtime.definitions.register_definition("triage", {"nodes": ["plan"]})
        failed = runs.start_run("triage", {"ask": INPUT_MARKER})[0].run_id
        runs.set_status(failed, "running", expected_status="accepted")
        runs.set_status(failed, "failed", expected_status="running")
        recovered = runs.start_run("triage", {"ask": INPUT_MARKER})[0].run_id
        clock.advance(timedelta(seconds=30))
        assert runs.recover_incomplete_runs() == 1
    with bootstrap(_settings(home, None), create=True) as runtime:
        runs = runtime.runs
        unsigned = runs.start_run("triage", {"ask": INPUT_MARKER})[0].run_id
        runs.set_status(unsigned, "running", expected_status="accepted")
        runs.finish_run(
            unsigned, "completed", expected_status="running", final_state={"a": FINAL_MARKER}
        )
        running = runs.start_run("triage", {"ask": INPUT_MARKER})[0].run_id
        runs.set_status(running, "running", expected_status="accepted")
    return Ended(home, Path(f"{key}.pub"), failed, recovered, unsigned, running)


def _receipt(tmp_path: Path, ended: Ended, run_id: str) -> Path:
    result = _run(tmp_path, "runs", "receipt", run_id, home=ended.home)
    assert result.returncode == 0, result.stderr
    path = tmp_path / f"{run_id}.receipt"
    path.write_text(result.stdout)
    return path


def test_a_receipt_from_any_ending_checks_with_the_public_key_alone(
    tmp_path: Path, ended: Ended
) -> None:
    """set_status and recovery receipts print, parse, and check with no store and no key."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for run_id, status in [
        (ended.failed, "failed"),
        (ended.recovered, "interrupted_non_resumable"),
    ]:
        path = _receipt(tmp_path, ended, run_id)
        text = path.read_text()
        assert parse_terminal_receipt(text).status == status
        for secret in (run_id, INPUT_MARKER):
            assert secret not in text
        checked = _run(
            elsewhere, "ledger", "check-receipt", str(path), "--public-key",
            str(ended.public_key), "--json",
        )  # fmt: skip
        assert checked.returncode == 0, checked.stderr
        document = _document(checked)
        assert (document["ok"], document["kind"], document["status"]) == (
            True,
            "terminal",
            status,
        )
        assert document["receipt"] == text
        human = _run(
            elsewhere, "ledger", "check-receipt", str(path), "--public-key", str(ended.public_key)
        )
        assert human.stdout.startswith("receipt: ok, signed by flowvault-ed25519 key ")
        assert f"status: {status}\n" in human.stdout
    assert not (elsewhere / "xdg").exists(), "checking a receipt opens no store"


def test_runs_receipt_json_names_the_signer(tmp_path: Path, ended: Ended) -> None:
    """The --json form carries the receipt text and its fields, the key hint among them."""
    result = _run(tmp_path, "runs", "receipt", ended.failed, "--json", home=ended.home)
    assert result.returncode == 0, result.stderr
    document = _document(result)
    assert document["kind"] == "terminal"
    assert document["status"] == "failed"
    assert isinstance(document["signer_hint"], str)
    assert parse_terminal_receipt(document["receipt"]).signer_hint == document["signer_hint"]


def _refusal(tmp_path: Path, receipt: Path, public_key: Path) -> str:
    result = _run(
        tmp_path, "ledger", "check-receipt", str(receipt), "--public-key", str(public_key)
    )
    assert result.returncode == 1
    return result.stderr


def test_edited_foreign_and_unsigned_receipts_are_refused(tmp_path: Path, ended: Ended) -> None:
    """An edited receipt, another key, or no signature at all exits 1 with INTEGRITY_FAILURE."""
    genuine = _receipt(tmp_path, ended, ended.failed)
    document = json.loads(genuine.read_text())
    for field, value in [("status", "completed"), ("event_count", 2)]:
        edited = tmp_path / f"edited-{field}"
        old, new = json.dumps(document[field]), json.dumps(value)
        edited.write_text(genuine.read_text().replace(f'"{field}":{old}', f'"{field}":{new}'))
        assert edited.read_text() != genuine.read_text()
        stderr = _refusal(tmp_path, edited, ended.public_key)
        assert "INTEGRITY_FAILURE" in stderr
        assert "altered or forged" in stderr
    other = tmp_path / "other.pem"
    assert _run(tmp_path, "keys", "signing-key", "--out", str(other)).returncode == 0
    stderr = _refusal(tmp_path, genuine, Path(f"{other}.pub"))
    assert "INTEGRITY_FAILURE" in stderr
    assert "no flowvault-ed25519 signature for this key" in stderr
    unsigned = _receipt(tmp_path, ended, ended.finished_unsigned)
    stderr = _refusal(tmp_path, unsigned, ended.public_key)
    assert "INTEGRITY_FAILURE" in stderr
    assert "issued without a signing key" in stderr
    assert "fix: check it without --public-key" in stderr
    for secret in (ended.failed, INPUT_MARKER, FINAL_MARKER):
        assert secret not in stderr


@pytest.mark.parametrize(
    "content", ['{"kind":"terminal"}\n', "{not json\n", '{"kind": "terminal"}\n']
)
def test_malformed_terminal_receipts_are_invalid_input(
    tmp_path: Path, ended: Ended, content: str
) -> None:
    """Anything but a terminal receipt's canonical text is INVALID_INPUT."""
    path = tmp_path / "bad"
    path.write_text(content)
    assert "INVALID_INPUT" in _refusal(tmp_path, path, ended.public_key)


def test_a_run_not_ended_has_no_receipt(tmp_path: Path, ended: Ended) -> None:
    """A receipt of a running run, an unknown run, or on a cold root is NOT_FOUND."""
    for run_id, home in [
        (ended.running, ended.home),
        ("no-such-run", ended.home),
        (ended.failed, tmp_path / "cold"),
    ]:
        result = _run(tmp_path, "runs", "receipt", run_id, home=home)
        assert result.returncode == 1
        assert "NOT_FOUND" in result.stderr
    assert not (tmp_path / "cold").exists()


@pytest.mark.parametrize("problem", ["missing", "group-readable", "not-a-key"])
def test_a_signing_key_that_does_not_load_is_refused_not_skipped(
    tmp_path: Path, problem: str
) -> None:
    """A configured key that does not load fails the open, rather than ending runs unsigned."""
    key = tmp_path / "keys" / "receipts.pem"
    if problem != "missing":
        assert _run(tmp_path, "keys", "signing-key", "--out", str(key)).returncode == 0
    if problem == "group-readable":
        key.chmod(0o640)
    if problem == "not-a-key":
        key.write_text("not a key\n")
    expected = {
        "missing": KeyRequired,
        "group-readable": InsecurePermissions,
        "not-a-key": InvalidInput,
    }[problem]
    with pytest.raises(expected):
        bootstrap(_settings(tmp_path / "home", key), create=True)
