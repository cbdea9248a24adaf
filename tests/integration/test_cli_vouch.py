"""``ledger vouch`` through the installed command, on a real SQLite file.

A stream whose MACs are all gone (as schema 2 wrote every stream) fails the
keyed audit. ``ledger vouch`` without ``--head-hash`` shows its head and
writes nothing; with a head other than the stream's it is refused; with the
compared head it appends one keyed event, and the audit passes. A stream
that verifies is refused, and without the key nothing can be vouched for.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from cli_helpers import json_document, run_cli

from flowvault.application._workflow_records import stream_of
from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkOrder


@pytest.fixture
def home(tmp_path: Path) -> tuple[Path, str]:
    """Provide a home holding one workflow of three events, its stream stripped of every MAC."""
    home = tmp_path / "home"
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        order = WorkOrder(kind="demo", requester="alice", idempotency_key="wf-v")
        record = runtime.workflows.create(order)[0]
        for note in ("one", "two"):
            current = runtime.workflows.get(record.workflow_id)
            runtime.workflow_events.append_event(
                record.workflow_id,
                "workflow.noted",
                expected_state=current.state,
                expected_version=current.state_version,
                payload={"note": note},
            )
    stream = stream_of(record.workflow_id)
    database = Settings(backend="sqlite", home=home).database_path
    with sqlite3.connect(database) as connection:
        connection.execute("UPDATE ledger_events SET chain_mac = NULL WHERE stream = ?", (stream,))
    connection.close()
    return home, stream


def _audit(tmp_path: Path, home: Path) -> dict[str, object]:
    result = run_cli(tmp_path, "ledger", "verify", "--all", "--json", home=home)
    document = json_document(result)
    assert result.returncode == (0 if document["ok"] else 1), result.stderr
    return document


def test_a_stream_without_macs_is_vouched_for_once_its_head_is_given(
    tmp_path: Path, home: tuple[Path, str]
) -> None:
    """Show, refuse a wrong head, vouch for the compared one: then the audit passes."""
    path, stream = home
    before = _audit(tmp_path, path)
    assert before["ok"] is False
    assert [f["defect"] for f in before["failures"]] == ["unkeyed"]  # type: ignore[union-attr]

    shown = run_cli(tmp_path, "ledger", "vouch", "--stream", stream, "--json", home=path)
    assert shown.returncode == 0, shown.stderr
    seen = json_document(shown)
    assert seen["vouched"] is False
    assert (seen["events"], seen["head_index"], seen["without_mac"]) == (3, 2, True)
    assert _audit(tmp_path, path)["ok"] is False

    wrong = "sha256:" + "0" * 64
    refused = run_cli(
        tmp_path, "ledger", "vouch", "--stream", stream, "--head-hash", wrong, home=path
    )
    assert refused.returncode == 1
    assert "INVALID_INPUT" in refused.stderr
    assert wrong not in refused.stdout + refused.stderr
    assert _audit(tmp_path, path)["ok"] is False

    head_hash = str(seen["head_hash"])
    done = run_cli(
        tmp_path, "ledger", "vouch", "--stream", stream, "--head-hash", head_hash, home=path
    )
    assert done.returncode == 0, done.stderr
    assert "vouched" in done.stdout
    after = _audit(tmp_path, path)
    assert after["ok"] is True
    assert after["unkeyed_events"] == 3

    again = run_cli(
        tmp_path, "ledger", "vouch", "--stream", stream, "--head-hash", head_hash, home=path
    )
    assert again.returncode == 1
    assert "nothing to vouch for" in again.stderr


def test_vouching_needs_the_key(tmp_path: Path, home: tuple[Path, str]) -> None:
    """Without the key there is no MAC to write, so nothing is shown or vouched."""
    path, stream = home
    key_file = Settings(backend="sqlite", home=path).key_path
    key_file.rename(tmp_path / "away.key")
    result = run_cli(tmp_path, "ledger", "vouch", "--stream", stream, home=path)
    assert result.returncode == 1
    assert "KEY_REQUIRED" in result.stderr
