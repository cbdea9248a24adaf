"""``flowvault ledger verify|head``, ``fingerprint`` and ``purge`` as real subprocesses."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

from flowvault.adapters.crypto._cipher import generate_master_key
from flowvault.application import HistoryEvent
from flowvault.application._keys import encode_master_key
from flowvault.application._state import history_stream
from flowvault.application._workflow_records import stream_of
from flowvault.application.testing import FrozenClock
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import WorkflowState, WorkOrder, content_hash

MARKER = "marker-payload-5d1e"


def _populate(runtime: Runtime) -> str:
    """Write workflows, state history, a finished graph run and retention-bearing records.

    Returns the id of a workflow whose event at index 1 carries ``MARKER``.
    """
    for scope, step in (("main", 3), ("other", 9)):
        runtime.state(scope).update_with_events(
            lambda _, step=step: (WorkflowState(step=step), [HistoryEvent("state.stepped")])
        )
    order = WorkOrder(kind="demo", requester="alice", idempotency_key="wf-1")
    workflow, _ = runtime.workflows.create(order)
    runtime.workflow_events.append_event(
        workflow.workflow_id,
        "workflow.noted",
        expected_state=workflow.state,
        expected_version=workflow.state_version,
        payload={"note": MARKER},
    )
    runtime.action_results.put_action_result(
        workflow.workflow_id, content_hash("a"), {"r": 1}, retention=timedelta(hours=1)
    )
    runs = runtime.runs
    runtime.definitions.register_definition("graph.demo", {"nodes": ["plan", "act"]})
    run, _ = runs.start_run("graph.demo", {"ticket": "T-1"})
    runs.set_status(run.run_id, "running", expected_status="accepted")
    runs.finish_run(run.run_id, "completed", expected_status="running", final_state={"ok": True})
    runtime.idempotency.remember("req-1", {"op": "pay"}, {"status": "ok"})
    return workflow.workflow_id


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """Provide a SQLite home with data written at a past instant (so some has expired)."""
    path = tmp_path / "home"
    with bootstrap(
        Settings(backend="sqlite", home=path), clock=FrozenClock(), create=True
    ) as runtime:
        _populate(runtime)
    return path


def _database(home: Path) -> Path:
    return Settings(backend="sqlite", home=home).database_path


def _key_text(home: Path) -> str:
    return (home / "keys" / "store.key").read_text().strip()


def _streams(home: Path) -> list[str]:
    with sqlite3.connect(_database(home)) as connection:
        rows = connection.execute("SELECT stream FROM ledger_streams ORDER BY stream").fetchall()
    connection.close()
    return [row[0] for row in rows]


def _state(path: Path) -> tuple[str, int, list[str]]:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest, path.stat().st_mtime_ns, sorted(p.name for p in path.parent.iterdir())


# -- help and usage ------------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "option"),
    [
        (["ledger", "verify"], "--all"),
        (["ledger", "head"], "--stream"),
        (["fingerprint"], "--scope"),
        (["purge"], "--older-than-days"),
    ],
)
def test_every_verb_has_help_with_json(tmp_path: Path, verb: list[str], option: str) -> None:
    """``--help`` names the verb's options, ``--json`` and the exit codes."""
    result = _run(tmp_path, *verb, "--help")
    assert result.returncode == 0, result.stderr
    for text in (option, "--json", "exit codes"):
        assert text in result.stdout


def test_verify_needs_a_target(tmp_path: Path, home: Path) -> None:
    """Neither ``--stream`` nor ``--all`` is a usage error."""
    assert _run(tmp_path, "ledger", "verify", home=home).returncode == 2
    assert _run(tmp_path, "ledger", "verify", "--all", "--stream", "x", home=home).returncode == 2


# -- ledger verify -------------------------------------------------------------


def test_verify_all_passes_with_a_summary(tmp_path: Path, home: Path) -> None:
    """An intact store verifies: exit 0 and a summary table of streams and records."""
    result = _run(tmp_path, "ledger", "verify", "--all", home=home)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "ledger verify: ok"
    assert f"streams checked\t{len(_streams(home))}" in lines
    assert "streams failed\t0" in lines
    assert "records unreadable\t0" in lines
    assert MARKER not in result.stdout


def test_verify_all_json_reports_streams_events_and_records(tmp_path: Path, home: Path) -> None:
    """``--json``: every stream checked, events counted, every record readable."""
    result = _run(tmp_path, "ledger", "verify", "--all", "--json", home=home)
    assert result.returncode == 0, result.stderr
    report = _document(result)
    assert report["ok"] is True
    assert report["streams_checked"] == len(_streams(home)) >= 4
    assert isinstance(report["events"], int)
    assert report["events"] >= len(_streams(home))
    assert report["failures"] == []
    records = report["records"]
    assert isinstance(records, dict)
    assert records["readable"] > 0
    assert records["unreadable"] == records["unverified"] == 0
    assert report["key_available"] is True


def test_verify_one_stream(tmp_path: Path, home: Path) -> None:
    """``--stream`` verifies just that stream and opens no records."""
    stream = history_stream("main")
    result = _run(tmp_path, "ledger", "verify", "--stream", stream, "--json", home=home)
    assert result.returncode == 0, result.stderr
    report = _document(result)
    assert (report["ok"], report["streams_checked"], report["records"]) == (True, 1, None)
    missing = _run(tmp_path, "ledger", "verify", "--stream", "nope", home=home)
    assert missing.returncode == 1
    assert "NOT_FOUND" in missing.stderr


def _flip(home: Path, stream: str, index: int, old: str, new: str) -> None:
    with sqlite3.connect(_database(home)) as connection:
        changed = connection.execute(
            "UPDATE ledger_events SET payload = replace(payload, ?, ?) "
            "WHERE stream = ? AND idx = ?",
            (old, new, stream, index),
        ).rowcount
    connection.close()
    assert changed == 1


def _marked_workflow(home: Path) -> str:
    with sqlite3.connect(_database(home)) as connection:
        rows = connection.execute(
            "SELECT stream, idx FROM ledger_events WHERE instr(payload, ?) > 0", (MARKER,)
        ).fetchall()
    connection.close()
    assert len(rows) == 1
    stream, index = rows[0]
    assert stream.startswith(stream_of("x")[:-1])
    assert index == 1
    return str(stream)


def test_verify_detects_a_flipped_byte(tmp_path: Path, home: Path) -> None:
    """One changed payload byte fails verification: exit 1, stream and index reported."""
    stream = _marked_workflow(home)
    _flip(home, stream, 1, MARKER, MARKER[:-1] + "f")
    result = _run(tmp_path, "ledger", "verify", "--all", "--json", home=home)
    assert result.returncode == 1
    report = _document(result)
    assert report["ok"] is False
    assert report["failures"] == [
        {
            "stream": stream,
            "index": 1,
            "defect": "edited",
            "reason": "event is malformed or does not match its event_hash",
        }
    ]
    error = report["error"]
    assert isinstance(error, dict)
    assert error["code"] == "INTEGRITY_FAILURE"
    human = _run(tmp_path, "ledger", "verify", "--all", home=home)
    assert human.returncode == 1
    assert human.stdout.splitlines()[0] == "ledger verify: INTEGRITY_FAILURE"
    assert f"{stream}\t1\tedited\t" in human.stdout
    assert "error: INTEGRITY_FAILURE" in human.stderr


def test_verify_places_a_row_that_no_longer_decodes(tmp_path: Path, home: Path) -> None:
    """A payload that is no longer JSON is reported as edited at its own index."""
    stream = _marked_workflow(home)
    _flip(home, stream, 1, "{", "[")
    result = _run(tmp_path, "ledger", "verify", "--stream", stream, "--json", home=home)
    assert result.returncode == 1
    failures = _document(result)["failures"]
    assert isinstance(failures, list)
    assert [(f["stream"], f["index"], f["defect"]) for f in failures] == [(stream, 1, "edited")]


@pytest.mark.parametrize(
    ("old", "new"),
    [(f'"{MARKER}"', f' "{MARKER}"'), ('{"note"', '{"note" ')],
)
def test_verify_refuses_a_payload_respelled_with_the_same_value(
    tmp_path: Path, home: Path, old: str, new: str
) -> None:
    """Whitespace an editor puts into a stored payload fails, though the value parses the same.

    Events are hashed over the text they were stored as, which must be the
    canonical encoding of their payload.
    """
    stream = _marked_workflow(home)
    _flip(home, stream, 1, old, new)
    result = _run(tmp_path, "ledger", "verify", "--stream", stream, "--json", home=home)
    assert result.returncode == 1
    failures = _document(result)["failures"]
    assert isinstance(failures, list)
    assert [(f["stream"], f["index"], f["defect"]) for f in failures] == [(stream, 1, "edited")]


def _copy(home: Path, tmp_path: Path) -> Path:
    copy_home = tmp_path / "copy"
    target = _database(copy_home)
    target.parent.mkdir(parents=True)
    source = _database(home)
    assert not source.with_name(source.name + "-wal").exists()
    shutil.copy2(source, target)
    return copy_home


def test_verify_on_a_copy_leaves_the_file_unchanged(tmp_path: Path, home: Path) -> None:
    """Bytes, mtime and directory listing of a copied database are the same after an audit."""
    copy_home = _copy(home, tmp_path)
    database = _database(copy_home)
    before = _state(database)
    key = _key_text(home)
    result = _run(
        tmp_path, "ledger", "verify", "--all", "--json", home=copy_home, FLOWVAULT_KEY=key
    )
    assert result.returncode == 0, result.stderr
    records = _document(result)["records"]
    assert isinstance(records, dict)
    assert records["readable"] > 0
    head = _run(
        tmp_path, "ledger", "head", "--stream", history_stream("main"), home=copy_home,
        FLOWVAULT_KEY=key,
    )  # fmt: skip
    assert head.returncode == 0, head.stderr
    assert _state(database) == before
    assert not (copy_home / "keys").exists()


def test_verify_without_a_key_counts_records_unverified(tmp_path: Path, home: Path) -> None:
    """With no key at hand chains still verify; records are unverified, nothing is created."""
    copy_home = _copy(home, tmp_path)
    before = _state(_database(copy_home))
    result = _run(tmp_path, "ledger", "verify", "--all", "--json", home=copy_home)
    assert result.returncode == 0, result.stderr
    report = _document(result)
    records = report["records"]
    assert isinstance(records, dict)
    assert records["readable"] == records["unreadable"] == 0
    assert records["unverified"] > 0
    assert report["key_available"] is False
    head = _run(tmp_path, "ledger", "head", "--stream", "x", home=copy_home)
    assert head.returncode == 1
    assert "KEY_REQUIRED" in head.stderr
    assert _state(_database(copy_home)) == before
    assert not (copy_home / "keys").exists()


def test_verify_on_a_missing_database_fails_and_creates_nothing(tmp_path: Path) -> None:
    """No store: ``NOT_FOUND`` with the fix naming ``init``, and no home appears."""
    home = tmp_path / "absent"
    result = _run(tmp_path, "ledger", "verify", "--all", home=home)
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr
    assert "fix: create it once with 'flowvault init'" in result.stderr
    assert not home.exists()


# -- ledger head ---------------------------------------------------------------


def test_head_prints_a_keyed_receipt(tmp_path: Path, home: Path) -> None:
    """The receipt names the head, carries a MAC over it, and no payload."""
    stream = history_stream("main")
    result = _run(tmp_path, "ledger", "head", "--stream", stream, "--json", home=home)
    assert result.returncode == 0, result.stderr
    receipt = _document(result)
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        head = runtime.store.ledger_head(stream)
    assert head is not None
    assert receipt["stream"] == stream
    assert receipt["head_index"] == head.index
    assert receipt["head_hash"] == head.event_hash
    assert receipt["size"] == head.index + 1
    assert receipt["first_index"] == 0
    assert receipt["signers"] == ["flowvault-mac"]
    text = str(receipt["receipt"])
    assert MARKER not in text
    human = _run(tmp_path, "ledger", "head", "--stream", stream, home=home)
    assert human.stdout.splitlines()[:4] == text.splitlines()[:4]
    other = _run(
        tmp_path, "ledger", "head", "--stream", history_stream("other"), "--json", home=home
    )
    assert _document(other)["head_hash"] != receipt["head_hash"]


# -- fingerprint ---------------------------------------------------------------


def test_fingerprint_of_a_stored_state(tmp_path: Path, home: Path) -> None:
    """A stored state is readable, with its revision and digests."""
    result = _run(tmp_path, "fingerprint", "--scope", "main", "--json", home=home)
    assert result.returncode == 0, result.stderr
    document = _document(result)
    assert document["cold_root"] is False
    fingerprint = document["fingerprint"]
    assert isinstance(fingerprint, dict)
    assert (fingerprint["readability"], fingerprint["revision"]) == ("readable", 1)
    human = _run(tmp_path, "fingerprint", "--scope", "main", "--reason", "audit", home=home)
    assert human.returncode == 0, human.stderr
    assert "  reason_class: audit" in human.stdout.splitlines()


def test_fingerprint_on_a_cold_root_creates_nothing(tmp_path: Path) -> None:
    """On a cold root the state is absent and no file or directory is created."""
    home = tmp_path / "cold"
    result = _run(tmp_path, "fingerprint", "--scope", "main", "--json", home=home)
    assert result.returncode == 0, result.stderr
    document = _document(result)
    assert document["cold_root"] is True
    fingerprint = document["fingerprint"]
    assert isinstance(fingerprint, dict)
    assert fingerprint["readability"] == "absent"
    assert not home.exists()
    assert not (tmp_path / "xdg").exists()


# -- purge ---------------------------------------------------------------------


def test_purge_counts_each_kind_and_keeps_chains_intact(tmp_path: Path, home: Path) -> None:
    """Expired records go, counted per kind; streams verify after; a second pass purges none."""
    result = _run(tmp_path, "purge", "--json", home=home)
    assert result.returncode == 0, result.stderr
    document = _document(result)
    assert document["deleted"] == {
        "action_results": 1,
        "consumed_checkpoints": 0,
        "decided_approvals": 0,
        "finished_runs": 0,
        "idempotency_records": 1,
    }
    assert (document["total"], document["compacted"], document["cold_root"]) == (2, True, False)
    assert (document["expired_approvals"], document["failed_runs"]) == (0, 0)
    runs = _run(tmp_path, "purge", "--finished-runs-older-than-days", "1", home=home)
    assert runs.returncode == 0, runs.stderr
    assert "finished_runs\t1" in runs.stdout.splitlines()
    assert "total\t1" in runs.stdout.splitlines()
    verify = _run(tmp_path, "ledger", "verify", "--all", "--json", home=home)
    assert verify.returncode == 0, verify.stderr
    assert _document(verify)["ok"] is True
    again = _document(_run(tmp_path, "purge", "--json", home=home))
    assert again["total"] == 0


def test_purge_on_a_cold_root_creates_nothing(tmp_path: Path) -> None:
    """No store: zero counts, and no home appears."""
    home = tmp_path / "cold"
    result = _run(tmp_path, "purge", "--older-than-days", "0", "--json", home=home)
    assert result.returncode == 0, result.stderr
    assert _document(result)["cold_root"] is True
    assert not home.exists()
    assert _run(tmp_path, "purge", "--older-than-days", "-1", home=home).returncode == 2


# -- PostgreSQL ----------------------------------------------------------------


@pytest.mark.postgres
def test_verify_all_on_postgres(tmp_path: Path, postgres_server, pg_schema: str) -> None:
    """``ledger verify --all`` audits a PostgreSQL store too."""
    key = generate_master_key()
    settings = Settings(
        backend="postgres", postgres_dsn=postgres_server.dsn, postgres_schema=pg_schema
    )
    with bootstrap(settings, key=key, create=True) as runtime:
        _populate(runtime)
    result = _run(
        tmp_path, "ledger", "verify", "--all", "--json",
        FLOWVAULT_BACKEND="postgres", FLOWVAULT_POSTGRES_DSN=postgres_server.dsn,
        FLOWVAULT_POSTGRES_SCHEMA=pg_schema, FLOWVAULT_KEY=encode_master_key(key),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = _document(result)
    assert report["ok"] is True
    assert isinstance(report["streams_checked"], int)
    assert report["streams_checked"] >= 4
    records = report["records"]
    assert isinstance(records, dict)
    assert records["readable"] > 0
    assert records["unreadable"] == 0
