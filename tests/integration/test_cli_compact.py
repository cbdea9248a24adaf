"""``flowvault compact``: VACUUM gives free pages back and leaves every record readable."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkflowState

KEPT = 5
DROPPED = 200


def _pragma(database: Path, name: str) -> int:
    connection = sqlite3.connect(database)
    try:
        value = connection.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        connection.close()
    assert isinstance(value, int)
    return value


def _sealed_payloads(database: Path, namespace: str) -> list[bytes]:
    connection = sqlite3.connect(database)
    try:
        rows = connection.execute(
            "SELECT payload FROM records WHERE namespace = ?", (namespace,)
        ).fetchall()
    finally:
        connection.close()
    return [bytes(row[0]) for row in rows]


def test_compact_rebuilds_the_file_without_free_pages(tmp_path: Path) -> None:
    """Resets leave zeroed free pages; compact returns them and keeps what remains readable."""
    home = tmp_path / "home"
    settings = Settings(backend="sqlite", home=home)
    with bootstrap(settings, create=True) as runtime:
        for n in range(KEPT + DROPPED):
            runtime.state(f"scope-{n}").save(WorkflowState(step=n, data={"pad": "x" * 2000}))
        dropped = _sealed_payloads(settings.database_path, "flowvault.workflow-state")
        for n in range(KEPT, KEPT + DROPPED):
            runtime.state(f"scope-{n}").reset(actor="tester", source="cleanup")
    database = settings.database_path
    free_before = _pragma(database, "freelist_count")
    assert free_before >= DROPPED // 2, "the control: deletions leave free pages behind"

    result = _run(tmp_path, "compact", "--json", home=home)
    assert result.returncode == 0, result.stderr
    files = {f["path"]: f for f in _document(result)["files"]}  # type: ignore[union-attr]
    main = files[str(database)]
    assert main["after_bytes"] < main["before_bytes"]
    assert files[f"{database}-wal"]["after_bytes"] in (None, 0)
    assert _pragma(database, "freelist_count") == 0
    connection = sqlite3.connect(database)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        connection.close()
    raw = b"".join(p.read_bytes() for p in database.parent.iterdir())
    kept = set(_sealed_payloads(database, "flowvault.workflow-state"))
    assert len(kept) == KEPT
    assert not any(seal[-32:] in raw for seal in dropped if seal not in kept)
    with bootstrap(settings, create=True) as runtime:
        for n in range(KEPT):
            assert runtime.state(f"scope-{n}").load().state == WorkflowState(
                step=n, data={"pad": "x" * 2000}
            )
    human = _run(tmp_path, "compact", home=home)
    assert human.returncode == 0, human.stderr
    assert human.stdout.splitlines()[0] == "compact: complete"


def test_compact_on_a_cold_root_creates_nothing(tmp_path: Path) -> None:
    """No store: nothing to compact, and no home appears."""
    home = tmp_path / "cold"
    result = _run(tmp_path, "compact", home=home)
    assert result.returncode == 0, result.stderr
    assert "cold root" in result.stdout
    assert not home.exists()


def test_compact_is_refused_on_postgres(tmp_path: Path) -> None:
    """The server reclaims PostgreSQL's space; the verb says so before connecting."""
    result = _run(
        tmp_path, "--backend", "postgres", "compact", FLOWVAULT_POSTGRES_DSN="postgresql://x@/y"
    )
    assert result.returncode == 1
    assert "INVALID_INPUT" in result.stderr
    assert "vacuum" in result.stderr
