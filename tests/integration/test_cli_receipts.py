"""Head receipts through the installed command, against attacks on a real SQLite file.

Each attack leaves a chain that ``ledger verify`` accepts (the negative
control): deleting the last events and moving the head row back, and
restoring an older copy of the database, pass even with the key, since every
event left is genuine; rewriting history with recomputed plain hashes passes
without the key and fails its chain MACs with it. A receipt kept from before
catches every one.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from pathlib import Path

import pytest
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

from flowvault.application._workflow_records import stream_of
from flowvault.composition import Settings, bootstrap
from flowvault.domain import LedgerEvent, StoreRolledBack, WorkOrder
from flowvault.domain._canonical import canonical_json
from flowvault.domain._envelope import format_instant

MARKER = "receipt-marker-8c1f"


def _append_notes(home: Path, workflow_id: str | None, notes: list[str]) -> str:
    """Create the workflow if ``workflow_id`` is None, then append one event per note."""
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        workflows = runtime.workflows
        if workflow_id is None:
            order = WorkOrder(kind="demo", requester="alice", idempotency_key="wf-r")
            workflow_id = workflows.create(order)[0].workflow_id
        for note in notes:
            current = workflows.get(workflow_id)
            runtime.workflow_events.append_event(
                workflow_id,
                "workflow.noted",
                expected_state=current.state,
                expected_version=current.state_version,
                payload={"note": note},
            )
    return workflow_id


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, str]:
    """Provide a home and a workflow stream of 1 + 5 events, one carrying ``MARKER``."""
    home = tmp_path / "home"
    workflow_id = _append_notes(home, None, ["one", MARKER, "three", "four", "five"])
    return home, stream_of(workflow_id)


def _database(home: Path) -> Path:
    return Settings(backend="sqlite", home=home).database_path


def _head(tmp_path: Path, home: Path, stream: str, name: str = "receipt", **env: str) -> Path:
    result = _run(tmp_path, "ledger", "head", "--stream", stream, home=home, **env)
    assert result.returncode == 0, result.stderr
    path = tmp_path / name
    path.write_text(result.stdout)
    return path


def _verify_stream(tmp_path: Path, home: Path, stream: str) -> None:
    """Check the negative control: the chain, MACs included, shows nothing wrong."""
    result = _run(tmp_path, "ledger", "verify", "--stream", stream, home=home)
    assert result.returncode == 0, result.stdout + result.stderr


def _verify_keyless(tmp_path: Path, home: Path, stream: str) -> dict[str, object]:
    """Verify a copy of the database with no key at hand: the plain chain only."""
    copy_home = tmp_path / "keyless"
    shutil.rmtree(copy_home, ignore_errors=True)
    shutil.copytree(_database(home).parent, _database(copy_home).parent)
    result = _run(tmp_path, "ledger", "verify", "--stream", stream, "--json", home=copy_home)
    assert result.returncode == 0, result.stdout + result.stderr
    return _document(result)


def _against(tmp_path: Path, home: Path, *receipts: Path, **env: str) -> dict[str, object]:
    words = [w for r in receipts for w in ("--against", str(r))]
    result = _run(tmp_path, "ledger", "verify", *words, "--json", home=home, **env)
    document = _document(result)
    assert result.returncode == (0 if document["ok"] else 1), result.stderr
    return document


def _defects(document: dict[str, object]) -> list[tuple[object, object]]:
    failures = document["failures"]
    assert isinstance(failures, list)
    return [(f["defect"], f["index"]) for f in failures]


def _rows(home: Path, stream: str) -> list[LedgerEvent]:
    with sqlite3.connect(_database(home)) as connection:
        rows = connection.execute(
            "SELECT stream, idx, type, from_state, to_state, occurred_at, payload, "
            "previous_hash, event_hash, event_key, chain_mac FROM ledger_events WHERE stream = ? "
            "ORDER BY idx",
            (stream,),
        ).fetchall()
    connection.close()
    names = ("stream", "index", "type", "from_state", "to_state", "occurred_at")
    names += ("payload_text", "previous_hash", "event_hash", "event_key", "chain_mac")
    return [LedgerEvent.restore(**dict(zip(names, row, strict=True))) for row in rows]


def _write(home: Path, stream: str, events: list[LedgerEvent], drop_after: int) -> None:
    """Replace the stream's rows from ``events[0]`` on and point the head row at the last."""
    with sqlite3.connect(_database(home)) as connection:
        connection.execute(
            "DELETE FROM ledger_events WHERE stream = ? AND idx >= ?", (stream, events[0].index)
        )
        for e in events:
            connection.execute(
                "INSERT INTO ledger_events (stream, idx, type, from_state, to_state, "
                "occurred_at, payload, previous_hash, event_hash, event_key, chain_mac) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    e.stream, e.index, e.type, e.from_state, e.to_state,
                    format_instant(e.occurred_at), canonical_json(e.payload),
                    e.previous_hash, e.event_hash, e.event_key, e.chain_mac,
                ),
            )  # fmt: skip
        connection.execute(
            "DELETE FROM ledger_events WHERE stream = ? AND idx > ?", (stream, drop_after)
        )
        last = events[-1]
        connection.execute(
            "UPDATE ledger_streams SET head_index = ?, head_hash = ? WHERE stream = ?",
            (last.index, last.event_hash, stream),
        )
    connection.close()


def test_a_receipt_is_plain_text_without_payloads(tmp_path: Path, store: tuple[Path, str]) -> None:
    """The receipt names the stream, size and head; no payload, and it verifies at once."""
    home, stream = store
    receipt = _head(tmp_path, home, stream)
    text = receipt.read_text()
    lines = text.splitlines()
    assert lines[0] == f"flowvault.ledger/{stream}"
    assert lines[1] == "6"
    assert lines[3] == "first 0"
    assert lines[4].startswith("time ")
    assert lines[5] == ""
    assert lines[6].startswith("\u2014 flowvault-mac ")
    assert MARKER not in text
    document = _run(tmp_path, "ledger", "head", "--stream", stream, "--json", home=home)
    head = _document(document)
    assert (head["stream"], head["size"], head["head_index"]) == (stream, 6, 5)
    assert head["signers"] == ["flowvault-mac"]
    assert _defects(_against(tmp_path, home, receipt)) == []


def test_deleting_the_last_events_is_caught(tmp_path: Path, store: tuple[Path, str]) -> None:
    """Two events deleted and the head row moved back: the chain passes, the receipt does not."""
    home, stream = store
    receipt = _head(tmp_path, home, stream)
    events = _rows(home, stream)
    _write(home, stream, events[3:4], drop_after=3)
    _verify_stream(tmp_path, home, stream)
    assert _defects(_against(tmp_path, home, receipt)) == [("truncated", 5)]


def test_restoring_an_older_copy_is_caught(tmp_path: Path, store: tuple[Path, str]) -> None:
    """An older database file put back: truncated; and once accepted and written to: rewritten.

    Writing to it needs ``accept-restore`` first: the high-water mark
    refuses the older copy on its own (``test_anti_rollback.py``).
    """
    home, stream = store
    data = _database(home).parent
    older = tmp_path / "older"
    shutil.copytree(data, older)
    workflow_id = stream.removeprefix("workflow/")
    _append_notes(home, workflow_id, ["six", "seven"])
    receipt = _head(tmp_path, home, stream)
    shutil.rmtree(data)
    shutil.copytree(older, data)
    _verify_stream(tmp_path, home, stream)
    assert _defects(_against(tmp_path, home, receipt)) == [("truncated", 7)]
    with pytest.raises(StoreRolledBack):
        _append_notes(home, workflow_id, ["refused"])
    assert _run(tmp_path, "accept-restore", "--yes", home=home).returncode == 0
    _append_notes(home, workflow_id, ["other six", "other seven", "other eight"])
    _verify_stream(tmp_path, home, stream)
    assert _defects(_against(tmp_path, home, receipt)) == [("rewritten", 7)]


@pytest.mark.parametrize("macs", ["dropped", "kept"])
def test_history_rewritten_with_recomputed_hashes_is_caught(
    tmp_path: Path, store: tuple[Path, str], macs: str
) -> None:
    """An event's payload edited and every later plain hash and the head row recomputed.

    Without the integrity key the forger can only drop the chain MACs or keep
    the old ones; either fails a keyed verify, and the receipt catches it too.
    """
    home, stream = store
    receipt = _head(tmp_path, home, stream)
    events = _rows(home, stream)
    previous = events[2].previous_hash
    forged: list[LedgerEvent] = []
    for event in events[2:]:
        payload = {"note": "forged"} if event.index == 2 else event.payload
        rehashed = LedgerEvent.create(
            stream=event.stream,
            index=event.index,
            type=event.type,
            occurred_at=event.occurred_at,
            payload=payload,
            previous_hash=previous,
            from_state=event.from_state,
            to_state=event.to_state,
            event_key=event.event_key,
        )
        assert event.chain_mac is not None
        kept = event.chain_mac if macs == "kept" else None
        forged.append(rehashed.model_copy(update={"chain_mac": kept}))
        previous = forged[-1].event_hash
    _write(home, stream, forged, drop_after=5)
    assert MARKER not in [e.payload for e in _rows(home, stream)]
    assert _verify_keyless(tmp_path, home, stream)["ok"] is True
    keyed = _run(tmp_path, "ledger", "verify", "--stream", stream, "--json", home=home)
    assert keyed.returncode == 1
    defect = "unkeyed" if macs == "dropped" else "forged"
    assert _defects(_document(keyed)) == [(defect, 2)]
    assert _defects(_against(tmp_path, home, receipt)) == [(defect, 2)]
    refused = _run(tmp_path, "ledger", "head", "--stream", stream, home=home)
    assert refused.returncode == 1
    assert f"fails verification at index 2 ({defect})" in refused.stderr
    assert refused.stdout == "", "no receipt is printed for a forged chain"


def test_a_signed_receipt_checks_with_the_public_key_alone(
    tmp_path: Path, store: tuple[Path, str]
) -> None:
    """Keys signing-key, a signed head, check-receipt with no store, and edits refused."""
    home, stream = store
    key = tmp_path / "signing" / "receipts.pem"
    made = _run(tmp_path, "keys", "signing-key", "--out", str(key), "--json")
    assert made.returncode == 0, made.stderr
    public = Path(str(_document(made)["public_key"]))
    assert public == key.with_name("receipts.pem.pub")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    before = key.read_bytes()
    again = _run(tmp_path, "keys", "signing-key", "--out", str(key))
    assert again.returncode == 1
    assert "INVALID_INPUT" in again.stderr
    assert key.read_bytes() == before
    receipt = _head(tmp_path, home, stream, FLOWVAULT_SIGNING_KEY_FILE=str(key))
    assert [line.split(" ")[1] for line in receipt.read_text().splitlines()[6:]] == [
        "flowvault-mac",
        "flowvault-ed25519",
    ]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    checked = _run(
        elsewhere, "ledger", "check-receipt", str(receipt), "--public-key", str(public), "--json"
    )
    assert checked.returncode == 0, checked.stderr
    assert _document(checked)["ok"] is True
    assert not (elsewhere / "xdg").exists(), "checking a receipt opens no store"
    edited = tmp_path / "edited"
    edited.write_text(receipt.read_text().replace("\n6\n", "\n5\n", 1))
    refused = _run(tmp_path, "ledger", "check-receipt", str(edited), "--public-key", str(public))
    assert refused.returncode == 1
    assert "INTEGRITY_FAILURE" in refused.stderr
    other_key = tmp_path / "other.pem"
    assert _run(tmp_path, "keys", "signing-key", "--out", str(other_key)).returncode == 0
    stranger = _run(
        tmp_path, "ledger", "check-receipt", str(receipt), "--public-key", f"{other_key}.pub"
    )
    assert stranger.returncode == 1
    assert "no flowvault-ed25519 line for this key" in stranger.stderr
    unsigned = _head(tmp_path, home, stream, name="unsigned")
    bare = _run(tmp_path, "ledger", "check-receipt", str(unsigned), "--public-key", str(public))
    assert bare.returncode == 1
    assert "INTEGRITY_FAILURE" in bare.stderr
    assert "carries no flowvault-ed25519 signature" in bare.stderr
    assert "fix: check it without --public-key" in bare.stderr
    assert "restore" not in bare.stderr


def test_without_the_store_key_a_receipt_is_checked_by_its_signature(
    tmp_path: Path, store: tuple[Path, str]
) -> None:
    """A copy of the database and no key: --public-key authenticates; nothing at all refuses."""
    home, stream = store
    key = tmp_path / "receipts.pem"
    assert _run(tmp_path, "keys", "signing-key", "--out", str(key)).returncode == 0
    receipt = _head(tmp_path, home, stream, FLOWVAULT_SIGNING_KEY_FILE=str(key))
    copy_home = tmp_path / "copy"
    shutil.copytree(_database(home).parent, _database(copy_home).parent)
    public = f"{key}.pub"
    words = ("ledger", "verify", "--against", str(receipt))
    keyless = _run(tmp_path, *words, "--public-key", public, home=copy_home)
    assert keyless.returncode == 0, keyless.stdout + keyless.stderr
    unauthenticated = _run(tmp_path, *words, home=copy_home)
    assert unauthenticated.returncode == 1
    assert "KEY_REQUIRED" in unauthenticated.stderr
    forged = tmp_path / "forged"
    forged.write_text(receipt.read_text().replace("first 0", "first 1"))
    caught = _run(tmp_path, "ledger", "verify", "--against", str(forged), home=home)
    assert caught.returncode == 1
    assert "flowvault-mac line does not verify" in caught.stderr


def test_a_receipt_of_another_store_is_refused(tmp_path: Path, store: tuple[Path, str]) -> None:
    """A receipt another store (another key) issued is refused before any comparison."""
    home, _ = store
    other_home = tmp_path / "other"
    other_id = _append_notes(other_home, None, ["x"])
    receipt = _head(tmp_path, other_home, stream_of(other_id))
    result = _run(tmp_path, "ledger", "verify", "--against", str(receipt), home=home)
    assert result.returncode == 1
    assert "no flowvault-mac line for this key" in result.stderr


@pytest.mark.parametrize("problem", ["symlink", "group-readable"])
def test_an_exposed_signing_key_is_refused(
    tmp_path: Path, store: tuple[Path, str], problem: str
) -> None:
    """The signing key gets the key file's checks, with the fix in the message."""
    home, stream = store
    key = tmp_path / "keys" / "receipts.pem"
    assert _run(tmp_path, "keys", "signing-key", "--out", str(key)).returncode == 0
    used = key
    if problem == "symlink":
        used = tmp_path / "keys" / "link.pem"
        used.symlink_to(key)
    else:
        os.chmod(key, 0o640)
    result = _run(
        tmp_path, "ledger", "head", "--stream", stream, home=home,
        FLOWVAULT_SIGNING_KEY_FILE=str(used),
    )  # fmt: skip
    assert result.returncode == 1
    assert "INSECURE_PERMISSIONS" in result.stderr
    assert ("symlink" if problem == "symlink" else "chmod 600") in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not a receipt\n", "INVALID_INPUT"),
        (b"\xff\xfe", "not UTF-8"),
        ("x" * 9000, "larger than 8192 bytes"),
    ],
)
def test_malformed_receipt_files_are_invalid_input(
    tmp_path: Path, store: tuple[Path, str], content: str | bytes, message: str
) -> None:
    """A receipt file that is not a receipt fails before the store is opened."""
    home, _ = store
    path = tmp_path / "bad"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    result = _run(tmp_path, "ledger", "verify", "--against", str(path), home=home)
    assert result.returncode == 1
    assert message in result.stderr
    missing = _run(tmp_path, "ledger", "verify", "--against", str(tmp_path / "none"), home=home)
    assert missing.returncode == 1
    assert "cannot read receipt" in missing.stderr


def test_doctor_checks_the_signing_key(tmp_path: Path, store: tuple[Path, str]) -> None:
    """A configured signing key is checked like the store key: mode, type and that it loads."""
    home, _ = store
    key = tmp_path / "receipts.pem"
    assert _run(tmp_path, "keys", "signing-key", "--out", str(key)).returncode == 0

    def doctor(path: Path) -> tuple[int, dict[str, dict[str, object]]]:
        result = _run(tmp_path, "doctor", "--json", home=home, FLOWVAULT_SIGNING_KEY_FILE=str(path))
        checks = _document(result)["checks"]
        assert isinstance(checks, list)
        return result.returncode, {str(c["name"]): c for c in checks}

    code, checks = doctor(key)
    assert code == 0
    assert checks["permissions.signing_key"]["ok"] is True
    assert "receipts are signed by key hint" in str(checks["signing_key.loads"]["finding"])
    os.chmod(key, 0o644)
    code, checks = doctor(key)
    assert code == 1
    assert checks["permissions.signing_key"]["fix"] == f"chmod 600 {key}"
    code, checks = doctor(tmp_path / "missing.pem")
    assert code == 1
    assert checks["signing_key.loads"]["ok"] is False
    assert "no signing key file" in str(checks["signing_key.loads"]["finding"])
    plain = _run(tmp_path, "doctor", "--json", home=home)
    names = [str(c["name"]) for c in _document(plain)["checks"]]  # type: ignore[union-attr]
    assert not any(name.startswith(("signing_key", "permissions.signing")) for name in names)
