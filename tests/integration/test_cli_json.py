"""Every ``--json`` document of the installed command keeps the stable conventions.

One JSON document on stdout, ``"schema_version": 1`` at its top, snake_case
keys all the way down, numbers as numbers with the unit in the key: run
over a populated SQLite home, verb by verb, as real subprocesses.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import json_document, run_cli
from populated_store import populate

KEY = re.compile(r"^[a-z][a-z0-9_]*$")
DATA_MAPS = {"$.manifest.parts"}
"""Objects keyed by data, documented as such: an archive manifest names its parts by file name."""
WITH_UNIT = re.compile(r"^-?\d+(\.\d+)?\s*(s|ms|bytes?|b|kb|mb|gb|seconds?|days?|%)$", re.I)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Provide a populated SQLite home shared by the read-only cases."""
    home = tmp_path_factory.mktemp("json") / "home"
    return home, populate(home)


def walk_keys(value: object, where: str = "$") -> Iterator[tuple[str, str]]:
    """Yield (path, key) for every object key, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield where, key
            yield from walk_keys(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk_keys(item, f"{where}[{index}]")


def walk_strings(value: object) -> Iterator[str]:
    """Yield every string value, at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from walk_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk_strings(item)


def assert_conventions(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """One document, versioned, snake_case keys, no '<number> <unit>' strings."""
    document = json_document(result)
    assert document["schema_version"] == 1, document
    bad = [
        (where, key)
        for where, key in walk_keys(document)
        if not KEY.fullmatch(key) and where not in DATA_MAPS
    ]
    assert not bad, bad
    united = [text for text in walk_strings(document) if WITH_UNIT.fullmatch(text.strip())]
    assert not united, united
    return document


READ_ONLY = [
    ["status"],
    ["doctor"],
    ["fingerprint", "--scope", "main"],
    ["workflows", "list"],
    ["workflows", "show", "{workflow}"],
    ["workflows", "events", "{workflow}"],
    ["runs", "list"],
    ["runs", "show", "{run}"],
    ["runs", "events", "{run}"],
    ["runs", "receipt", "{run}"],
    ["approvals", "list"],
    ["approvals", "show", "{approval}"],
    ["approvals", "statement", "{approval}", "--decision", "approve"],
    ["approvals", "signed", "{approval}"],
    ["ledger", "verify", "--all"],
    ["ledger", "verify", "--stream", "run/{run}"],
    ["ledger", "head", "--stream", "workflow/{workflow}"],
    ["ledger", "streams"],
    ["scopes", "list"],
    ["keys", "list"],
    ["reset-progress", "--scope", "main", "--dry-run"],
    ["workflows", "show", "no-such-workflow"],
    ["ledger", "head", "--stream", "no-such-stream"],
]


@pytest.mark.parametrize("argv", READ_ONLY, ids=" ".join)
def test_every_read_only_verb_keeps_the_json_conventions(
    tmp_path: Path, store: tuple[Path, dict[str, str]], argv: list[str]
) -> None:
    """Each reading verb prints one versioned document with snake_case keys and plain numbers."""
    home, ids = store
    result = run_cli(tmp_path, *[word.format(**ids) for word in argv], "--json", home=home)
    assert result.returncode in (0, 1), result.stderr
    document = assert_conventions(result)
    assert ("error" in document) is (result.returncode == 1), document


def test_every_writing_verb_keeps_the_json_conventions(tmp_path: Path) -> None:
    """init, the writing verbs, the moves and demo keep the conventions too, errors included."""
    home = tmp_path / "home"
    assert_conventions(run_cli(tmp_path, "init", "--json", home=home))
    assert_conventions(run_cli(tmp_path, "init", "--json", home=home))
    ids = populate(home)
    archive = tmp_path / "store.fvx"
    steps = [
        ["approvals", "decide", ids["approval"], "--decision", "approve", "--actor", "ops",
         "--yes"],
        ["approvals", "expire"],
        ["runs", "recover"],
        ["purge"],
        ["compact"],
        ["keys", "add"],
        ["rotate-key"],
        ["keys", "signing-key", "--out", str(tmp_path / "signer.pem")],
        ["accept-restore", "--yes"],
        ["export", "--to", str(archive)],
        ["import", str(archive), "--check"],
        ["migrate", "--to", str(tmp_path / "copy")],
        ["demo", "--home", str(tmp_path / "demo")],
    ]  # fmt: skip
    documents = {}
    for argv in steps:
        result = run_cli(tmp_path, *argv, "--json", home=home)
        assert result.returncode == 0, (argv, result.stdout, result.stderr)
        documents[argv[0]] = assert_conventions(result)
    sizes = documents["compact"]["files"]
    assert isinstance(sizes, list)
    assert {key for row in sizes for key in row} == {"path", "before_bytes", "after_bytes"}
    by_key = documents["rotate-key"]["by_key"]
    assert isinstance(by_key, list)
    assert {key for row in by_key for key in row} == {"key_id", "records"}
    signing = {"FLOWVAULT_SIGNING_KEY_FILE": str(tmp_path / "signer.pem")}
    head = run_cli(
        tmp_path, "ledger", "head", "--stream", f"run/{ids['run']}", home=home, **signing
    )
    assert head.returncode == 0, head.stderr
    receipt = tmp_path / "receipt.txt"
    receipt.write_text(head.stdout)
    public = ["--public-key", str(tmp_path / "signer.pem.pub")]
    for argv in (
        ["ledger", "check-receipt", str(receipt), *public],
        ["ledger", "verify", "--against", str(receipt), *public],
    ):
        result = run_cli(tmp_path, *argv, "--json", home=home)
        assert result.returncode == 0, (argv, result.stdout, result.stderr)
        assert_conventions(result)


def test_doctor_marks_passing_checks_ok(tmp_path: Path, store: tuple[Path, dict[str, str]]) -> None:
    """A passing check carries severity ok, never error."""
    home, _ = store
    checks = json_document(run_cli(tmp_path, "doctor", "--json", home=home))["checks"]
    assert isinstance(checks, list)
    assert checks
    assert {check["severity"] for check in checks if check["ok"]} == {"ok"}


def test_status_numbers_carry_their_unit_in_the_key(
    tmp_path: Path, store: tuple[Path, dict[str, str]]
) -> None:
    """busy_timeout_s is a number; file sizes are size_bytes numbers in a list of objects."""
    home, _ = store
    document = json_document(run_cli(tmp_path, "status", "--json", home=home))
    assert document["durability"] == {"synchronous": "full", "busy_timeout_s": 30}
    files = document["files"]
    assert isinstance(files, list)
    assert all(set(row) == {"path", "size_bytes"} for row in files)
    assert any(isinstance(row["size_bytes"], int) for row in files)


def test_an_error_document_is_versioned(tmp_path: Path) -> None:
    """An error under --json carries schema_version beside the error object."""
    result = run_cli(tmp_path, "ledger", "verify", "--all", "--json", home=tmp_path / "absent")
    assert result.returncode == 1
    document = json_document(result)
    assert document["schema_version"] == 1
    assert set(document["error"]) == {"code", "message", "fix"}  # type: ignore[arg-type]
    assert json.loads(result.stdout)["error"]["code"] == "NOT_FOUND"
