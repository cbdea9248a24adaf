"""``ledger streams``, ``scopes list``, every stream form and an empty receipt, as subprocesses."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from cli_helpers import json_document, run_cli
from populated_store import populate

from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkflowResult

HOST_STREAM = "billing.audit"
DOCUMENTED_KINDS = {
    "workflow",
    "run",
    "scope",
    "checkpoint",
    "idempotency",
    "witness",
    "action-result",
    "definition",
    "result",
    "decider-key",
    "host",
}
"""The stream forms docs/cli.md lists under `ledger streams`."""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Provide a SQLite home with a stream of every kind, a host stream among them."""
    root = tmp_path_factory.mktemp("streams")
    path = root / "home"
    ids = populate(path)
    with bootstrap(Settings(backend="sqlite", home=path)) as runtime:
        runtime.stream(HOST_STREAM).append("billing.closed", {"period": "2026-11"})
        moment = datetime(2026, 1, 1, tzinfo=UTC)
        runtime.results.save(
            WorkflowResult(run_id=ids["run"], status="completed", started_at=moment,
                           finished_at=moment)
        )  # fmt: skip
        runtime.evidence.capture_witness(
            "https://example.org/doc", b"evidence", "text/plain", "primary", moment
        )
    made = run_cli(root, "keys", "signing-key", "--out", str(root / "ann.pem"))
    assert made.returncode == 0, made.stderr
    registered = run_cli(
        root, "approvals", "register-key", "--actor", "ann", str(root / "ann.pem.pub"), home=path
    )
    assert registered.returncode == 0, registered.stderr
    return path


def _streams(tmp_path: Path, home: Path, *args: str) -> dict[str, object]:
    result = run_cli(tmp_path, "ledger", "streams", *args, "--json", home=home)
    assert result.returncode == 0, result.stderr
    return json_document(result)


def test_streams_lists_every_kind_in_name_order(tmp_path: Path, home: Path) -> None:
    """Each stream shows its name, kind, size and head index; every documented kind appears."""
    rows = _streams(tmp_path, home, "--all")["streams"]
    assert isinstance(rows, list)
    names = [row["stream"] for row in rows]
    assert names == sorted(names)
    assert {row["kind"] for row in rows} == DOCUMENTED_KINDS
    host = next(row for row in rows if row["stream"] == HOST_STREAM)
    assert host == {"stream": HOST_STREAM, "kind": "host", "size": 1, "head_index": 0}
    assert all(row["size"] == row["head_index"] + 1 for row in rows)
    text = run_cli(tmp_path, "ledger", "streams", "--all", home=home).stdout
    assert "https://example.org" not in text
    assert "ann" not in text.split()


def test_streams_page_like_other_listings(tmp_path: Path, home: Path) -> None:
    """--limit pages, next_cursor continues, and the pages together are the whole list."""
    every = [row["stream"] for row in _streams(tmp_path, home, "--all")["streams"]]  # type: ignore[attr-defined]
    seen: list[str] = []
    cursor: list[str] = []
    while True:
        page = _streams(tmp_path, home, "--limit", "4", *cursor)
        seen += [row["stream"] for row in page["streams"]]  # type: ignore[attr-defined]
        if page["next_cursor"] is None:
            break
        cursor = ["--cursor", str(page["next_cursor"])]
    assert seen == every
    assert len(every) > 4


def test_every_listed_stream_form_works_with_head_and_verify(tmp_path: Path, home: Path) -> None:
    """Each kind's name, as listed, is accepted by ledger head and ledger verify --stream."""
    rows = _streams(tmp_path, home, "--all")["streams"]
    one_of_each = {row["kind"]: row["stream"] for row in rows}  # type: ignore[union-attr]
    assert set(one_of_each) == DOCUMENTED_KINDS
    for kind, stream in one_of_each.items():
        head = run_cli(tmp_path, "ledger", "head", "--stream", stream, "--json", home=home)
        assert head.returncode == 0, (kind, head.stdout, head.stderr)
        assert json_document(head)["stream"] == stream
        verify = run_cli(tmp_path, "ledger", "verify", "--stream", stream, "--json", home=home)
        assert verify.returncode == 0, (kind, verify.stdout, verify.stderr)
        assert json_document(verify)["streams_checked"] == 1


def test_an_unknown_stream_points_at_the_listing(tmp_path: Path, home: Path) -> None:
    """A stream that does not exist is NOT_FOUND with a fix naming 'ledger streams'."""
    for verb in ("head", "verify"):
        result = run_cli(tmp_path, "ledger", verb, "--stream", "S", home=home)
        assert result.returncode == 1
        assert "NOT_FOUND" in result.stderr
        assert "flowvault ledger streams" in result.stderr


def test_scopes_list_names_each_scope_and_its_stream(tmp_path: Path, home: Path) -> None:
    """Scopes come from their scope/ streams, in name order, and page like other listings."""
    result = run_cli(tmp_path, "scopes", "list", "--json", home=home)
    assert result.returncode == 0, result.stderr
    document = json_document(result)
    assert document["scopes"] == [
        {"scope": "main", "stream": "scope/main", "size": 2},
        {"scope": "other", "stream": "scope/other", "size": 2},
    ]
    first = json_document(run_cli(tmp_path, "scopes", "list", "--limit", "1", "--json", home=home))
    assert [row["scope"] for row in first["scopes"]] == ["main"]  # type: ignore[attr-defined]
    assert first["next_cursor"] == "main"
    rest = run_cli(tmp_path, "scopes", "list", "--cursor", "main", "--json", home=home)
    assert [row["scope"] for row in json_document(rest)["scopes"]] == ["other"]  # type: ignore[attr-defined]
    human = run_cli(tmp_path, "scopes", "list", home=home)
    assert "main\tscope/main\t2" in human.stdout


def test_listings_on_a_cold_root_create_nothing(tmp_path: Path) -> None:
    """On a cold root both listings are empty, say so, and create nothing."""
    absent = tmp_path / "absent" / "home"
    for argv in (["ledger", "streams"], ["scopes", "list"]):
        result = run_cli(tmp_path, *argv, "--json", home=absent)
        assert result.returncode == 0, result.stderr
        assert json_document(result)["cold_root"] is True
    assert not (tmp_path / "absent").exists()


def test_verify_against_an_empty_file_says_it_is_empty(tmp_path: Path, home: Path) -> None:
    """The file a failed redirect leaves is named empty, with a fix, not a line-ending defect."""
    empty = tmp_path / "receipt.txt"
    empty.write_bytes(b"")
    result = run_cli(tmp_path, "ledger", "verify", "--against", str(empty), home=home)
    assert result.returncode == 1
    assert f"{empty} is empty" in result.stderr
    assert "newline" not in result.stderr
    assert "fix: run 'flowvault ledger head --stream NAME > FILE' again" in result.stderr
    as_json = run_cli(tmp_path, "ledger", "verify", "--against", "-", "--json", home=home)
    error = json_document(as_json)["error"]
    assert error["code"] == "INVALID_INPUT"  # type: ignore[index]
    assert error["message"].startswith("stdin is empty")  # type: ignore[index]
