"""Logs go only where a host or the CLI routes them, and carry events, never secrets."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import TIMEOUT, json_document, run_cli
from key_scan import KeyScanner
from log_capture import capture_logs

from flowvault.application import SecureObjectStore, UnitOfWork
from flowvault.application._backoff import RetryPolicy
from flowvault.application._compaction import compact_fully
from flowvault.application.testing import make_upsert
from flowvault.composition import Settings, bootstrap
from flowvault.domain import RevisionConflict, WorkflowState

ALLOW = "FLOWVAULT_ALLOW_INSECURE_PERMISSIONS"
KEY = bytes(range(32))

LOOSE_STORE = textwrap.dedent(
    """
    import logging, os, sys
    from pathlib import Path
    from flowvault.composition import Settings, bootstrap
    from flowvault.domain import WorkflowState

    home = Path(sys.argv[1])
    settings = Settings(backend="sqlite", home=home)
    with bootstrap(settings, create=True) as runtime:
        runtime.state("main").save(WorkflowState(step=1))
    settings.database_path.chmod(0o644)
    if sys.argv[2] == "host":
        logging.basicConfig(stream=sys.stderr, format="%(name)s|%(levelname)s|%(message)s")
    allowed = Settings(backend="sqlite", home=home, allow_insecure_permissions=True)
    with bootstrap(allowed) as runtime:
        runtime.state("main").load()
    """
)


def _host(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-c", LOOSE_STORE, str(tmp_path / "home"), mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=TIMEOUT,
    )


def test_a_host_that_never_configures_logging_sees_nothing(tmp_path: Path) -> None:
    """A warning event (a loosened database file, allowed) prints nowhere by default."""
    result = _host(tmp_path, "silent")
    assert result.stdout == ""
    assert result.stderr == ""


def test_a_host_with_stdlib_logging_receives_flowvault_records(tmp_path: Path) -> None:
    """A host that set up ``logging`` gets the event under a ``flowvault.*`` logger."""
    result = _host(tmp_path, "host")
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if "insecure_permissions" in line]
    assert len(lines) == 1, result.stderr
    name, level, message = lines[0].split("|", 2)
    assert name.startswith("flowvault.")
    assert level == "WARNING"
    assert message.startswith("insecure_permissions ")
    assert "fix=chmod 600" in message


def _loosened_cli_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    assert run_cli(tmp_path, "init", home=home).returncode == 0
    Settings(backend="sqlite", home=home).database_path.chmod(0o644)
    return home


def test_cli_json_stdout_is_one_document_when_a_warning_is_logged(tmp_path: Path) -> None:
    """Under ``--json`` stdout is exactly one JSON document; the warning is a line on stderr."""
    home = _loosened_cli_home(tmp_path)
    result = run_cli(tmp_path, "compact", "--json", home=home, **{ALLOW: "true"})
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert isinstance(document, dict)
    assert result.stdout.strip().count("\n") == 0
    warning = [line for line in result.stderr.splitlines() if "insecure_permissions" in line]
    assert len(warning) == 1, result.stderr
    assert not warning[0].startswith("{")


def test_cli_logs_off_a_terminal_are_readable_lines_unless_json_is_asked(tmp_path: Path) -> None:
    """Off a terminal the CLI's stderr stays for people: a readable line, not a JSON object."""
    home = _loosened_cli_home(tmp_path)
    plain = run_cli(tmp_path, "compact", home=home, **{ALLOW: "true"})
    warning = [line for line in plain.stderr.splitlines() if "insecure_permissions" in line]
    assert len(warning) == 1, plain.stderr
    assert "[warning" in warning[0]
    assert not warning[0].lstrip().startswith("{")
    asked = run_cli(
        tmp_path,
        "compact",
        "--json",
        home=home,
        **{ALLOW: "true", "FLOWVAULT_LOG_FORMAT": "json"},
    )
    lines = [json.loads(line) for line in asked.stderr.splitlines() if line.startswith("{")]
    assert [line["event"] for line in lines] == ["insecure_permissions"]
    assert lines[0]["level"] == "warning"
    assert json_document(asked)


def test_events_for_commits_keys_compaction_and_verification(tmp_path: Path) -> None:
    """Each unit committed, each seal and open, a compaction and a verification log an event."""
    settings = Settings(backend="sqlite", home=tmp_path / "home")
    with capture_logs(logging.DEBUG) as logs, bootstrap(settings, key=KEY, create=True) as vault:
        vault.state("main").save(WorkflowState(step=1))
        assert vault.state("main").load().state == WorkflowState(step=1)
        assert compact_fully(vault.capabilities) in {True, False}
        assert vault.audit().run().ok
    events = {entry["event"]: entry for entry in logs}
    committed = [entry for entry in logs if entry["event"] == "unit_committed"]
    assert committed, logs
    assert committed[0]["store"] == "sqlite"
    assert committed[0]["records_written"] >= 1
    assert committed[0]["duration_ms"] >= 0
    assert "state" in committed[0]["unit_kind"] or committed[0]["unit_kind"]
    assert events["store_synced"]["units"] >= 1
    used = {(entry["operation"], entry["key_id"]) for entry in logs if entry["event"] == "key_used"}
    assert {operation for operation, _ in used} == {"seal", "open"}
    assert events["ledger_verified"]["ok"] is True
    assert events["ledger_verified"]["streams"] >= 1
    assert "compaction_finished" in events
    assert events["compaction_finished"]["explicit"] is True


def test_a_conflict_and_a_retry_are_logged(tmp_path: Path) -> None:
    """A unit refused at its guard logs ``revision_conflict``; a lost race, ``unit_retried``."""
    settings = Settings(backend="memory")
    with capture_logs(logging.DEBUG) as logs, bootstrap(settings, key=KEY) as vault:
        vault.store.commit(UnitOfWork(upserts=[make_upsert("ns", "k")]))
        with pytest.raises(RevisionConflict):
            vault.store.commit(UnitOfWork(upserts=[make_upsert("ns", "k")]))
        naps: list[float] = []
        retries = RetryPolicy(sleep=naps.append, max_retries=1).start()
        retries.after_lost_race("the thing")
    conflicts = [entry for entry in logs if entry["event"] == "revision_conflict"]
    assert [entry["store"] for entry in conflicts] == ["memory"]
    assert conflicts[0]["unit_kind"] == "ns"
    retried = [entry for entry in logs if entry["event"] == "unit_retried"]
    assert retried == [
        {
            "event": "unit_retried",
            "what": "the thing",
            "lost_races": 1,
            "pause_ms": round(naps[0] * 1000, 3),
            "log_level": "debug",
        }
    ]


def test_a_disabled_level_builds_no_event(tmp_path: Path) -> None:
    """With debug off, a commit formats nothing: no record is created at all."""
    seen: list[logging.LogRecord] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger = logging.getLogger("flowvault")
    recorder = Recorder()
    before = logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.WARNING)
    try:
        with bootstrap(Settings(backend="memory"), key=KEY) as vault:
            vault.state("main").save(WorkflowState(step=1))
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(before)
    assert seen == []


def test_debug_events_hold_no_payload_key_or_natural_key(tmp_path: Path) -> None:
    """Every event of a write, read, reseal and audit, at debug, rendered: no secret in any."""
    payload = "payload-sentinel-4d2a"
    natural_key = "natural-key-sentinel-61fe"
    settings = Settings(backend="sqlite", home=tmp_path / "home")
    scanner = KeyScanner()
    scanner.register(KEY, "the master key")
    with capture_logs(logging.DEBUG) as logs, bootstrap(settings, key=KEY, create=True) as vault:
        vault.state(natural_key).save(WorkflowState(step=1, data={"note": payload}))
        assert vault.state(natural_key).load().state.data == {"note": payload}
        assert compact_fully(vault.capabilities) in {True, False}
        assert vault.audit().run().ok
    names = {entry["event"] for entry in logs}
    assert {"unit_committed", "store_synced", "key_used", "ledger_verified"} <= names
    rendered = "\n".join(repr(entry) for entry in logs)
    assert payload not in rendered
    assert natural_key not in rendered
    assert scanner.leaks(rendered) == []


def test_every_adapter_logs_its_commits_syncs_and_conflicts(
    backend_store: SecureObjectStore,
) -> None:
    """Memory, SQLite and PostgreSQL each log a commit and a conflict; the durable ones a sync."""
    kind = type(backend_store).__name__.removesuffix("SecureObjectStore").lower()
    kind = {"inmemory": "memory"}.get(kind, kind)
    with capture_logs(logging.DEBUG) as logs:
        backend_store.commit(UnitOfWork(upserts=[make_upsert("ns", "k")]))
        with pytest.raises(RevisionConflict):
            backend_store.commit(UnitOfWork(upserts=[make_upsert("ns", "k")]))
    by_event = {entry["event"]: entry for entry in logs}
    assert by_event["unit_committed"]["store"] == kind
    assert by_event["unit_committed"]["unit_kind"] == "ns"
    assert by_event["unit_committed"]["records_written"] == 1
    assert by_event["revision_conflict"]["store"] == kind
    synced = [entry for entry in logs if entry["event"] == "store_synced"]
    assert (synced != []) is (kind != "memory")
