"""The ``flowvault keys`` verbs and ``rotate-key``, run as real console-script subprocesses.

Every command a test runs goes through one ``KeyWatch``, which keeps its
stdout and stderr and every key the ring file held before and after it; at
the end of the test none of those keys may appear in any output, in any of
the text forms a key is written in.
"""

from __future__ import annotations

import base64
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import json_document, run_cli
from log_capture import capture_logs

from flowvault.adapters.crypto import FileKeyStore
from flowvault.adapters.crypto._cipher import generate_master_key
from flowvault.application import Guard, StoreStats
from flowvault.application._keys import RING_HEADER, parse_key_ring
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import KeyExhausted, WorkOrder

NS = "keys-cli"
SEAL_LIMIT = 64
SEAL_WARN_AT = 32
BUDGET_ENV = {"FLOWVAULT_SEAL_LIMIT": str(SEAL_LIMIT), "FLOWVAULT_SEAL_WARN_AT": str(SEAL_WARN_AT)}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _key_forms(key: bytes) -> set[str]:
    """Every text form a key could leak in: URL-safe and standard base64 (padded or not), hex."""
    forms = {base64.urlsafe_b64encode(key).decode(), base64.b64encode(key).decode()}
    forms |= {form.rstrip("=") for form in forms}
    return forms | {key.hex()}


class KeyWatch:
    """Runs ``flowvault`` against one home and checks afterwards that no key was printed."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.home = tmp_path / "home"
        self.key_file = self.home / "keys" / "store.key"
        self.watched = [self.key_file]
        self.outputs: list[str] = []
        self.keys: set[bytes] = set()

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Run ``flowvault --home HOME ARGS`` with ``env`` added; keep what it printed."""
        if "FLOWVAULT_KEY_FILE" in env:
            self.watched.append(Path(env["FLOWVAULT_KEY_FILE"]))
        self.note_keys()
        result = run_cli(self.tmp_path, *args, home=self.home, **env)
        self.outputs.append(result.stdout + result.stderr)
        self.note_keys()
        return result

    def note_keys(self) -> None:
        """Remember every key the watched key files hold now, retired ones included."""
        for path in self.watched:
            if path.exists():
                ring = parse_key_ring(path.read_bytes(), "the watched key file")
                self.keys.update(ring.keys)
                if ring.integrity is not None:
                    self.keys.add(ring.integrity)

    def leaks(self) -> list[str]:
        """Return each key form found in any output (hex compared case-insensitively)."""
        forms = {form for key in self.keys for form in _key_forms(key)}
        return sorted(
            form
            for form in forms
            for output in self.outputs
            if form in output or form in output.lower()
        )

    def settings(self, **extra: object) -> Settings:
        """Return settings for an in-process runtime over the same home."""
        return Settings(backend="sqlite", home=self.home, **extra)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[KeyWatch]:
    """Provide a watch over a fresh home; after the test, no output may hold a key."""
    watch = KeyWatch(tmp_path)
    yield watch
    watch.note_keys()
    assert watch.keys, "the test never saw a key file"
    assert watch.outputs, "the test ran no command"
    assert watch.leaks() == [], "key material was printed"


def _ok(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 0, result.stdout + result.stderr
    return json_document(result)


def _init(cli: KeyWatch) -> str:
    """Create the store; return its key id."""
    key_id = _ok(cli.run("init", "--json"))["key_id"]
    assert isinstance(key_id, str)
    return key_id


def _listed(cli: KeyWatch, **env: str) -> list[dict[str, object]]:
    """Return the ``keys`` entries of ``keys list --json``."""
    entries = _ok(cli.run("keys", "list", "--json", **env))["keys"]
    assert isinstance(entries, list)
    return entries


def _write(runtime: Runtime, names: range) -> None:
    for number in names:
        runtime.repository.write(NS, f"k{number}", {"n": number}, expected=Guard.ABSENT)


def _key_ids(runtime: Runtime) -> dict[str, int]:
    store = runtime.store
    assert isinstance(store, StoreStats)
    return dict(store.key_id_counts())


def _write_until_refused(runtime: Runtime) -> tuple[int, KeyExhausted]:
    """Write records one by one until the key is refused; return how many were written."""
    for number in range(2 * SEAL_LIMIT):
        try:
            _write(runtime, range(number, number + 1))
        except KeyExhausted as exc:
            return number, exc
    pytest.fail(f"{2 * SEAL_LIMIT} writes were sealed under a key limited to {SEAL_LIMIT}")


def _refused(result: subprocess.CompletedProcess[str], code: str) -> str:
    """Check a refusal: exit 1, the code on stderr, nothing on stdout; return stderr."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"error: {code}: " in result.stderr
    assert result.stdout == ""
    return result.stderr


# -- keys list ----------------------------------------------------------------------


def test_keys_list_on_a_fresh_store_shows_one_primary_key(cli: KeyWatch) -> None:
    """A new store has one key: primary, no records, no seals; ``--json`` has a fixed shape."""
    key_id = _init(cli)
    document = _ok(cli.run("keys", "list", "--json"))
    assert document == {
        "schema_version": 1,
        "keys": [{"key_id": key_id, "role": "primary", "records": 0, "seals": 0}],
        "seal_limit": 2**32,
    }
    human = cli.run("keys", "list")
    assert human.returncode == 0, human.stderr
    assert f"{key_id}\tprimary\t0\t0" in human.stdout.splitlines()
    assert f"seal limit per key: {2**32}" in human.stdout


# -- keys add -------------------------------------------------------------------------


def test_keys_add_makes_a_new_primary_key(cli: KeyWatch) -> None:
    """``keys add`` rewrites the key file as a private ring; new writes seal under the new key.

    The old key stays, open-only, with the count of records it still seals,
    and those records still read.
    """
    old_id = _init(cli)
    with bootstrap(cli.settings(), create=True) as runtime:
        _write(runtime, range(3))
    added = _ok(cli.run("keys", "add", "--json"))
    new_id = added["added"]
    assert isinstance(new_id, str)
    assert new_id != old_id
    assert added["pending"] == 3
    assert _mode(cli.key_file) == 0o600
    assert _mode(cli.key_file.parent) == 0o700
    assert cli.key_file.read_text().splitlines()[0] == RING_HEADER
    listed = _listed(cli)
    assert [(e["key_id"], e["role"], e["records"]) for e in listed] == [
        (new_id, "primary", 0),
        (old_id, "open-only", 3),
    ]
    seals = listed[1]["seals"]
    assert isinstance(seals, int)
    assert seals >= 3
    assert listed[0]["seals"] == 0
    human = cli.run("keys", "list")
    assert f"{old_id}\topen-only\t3\t{seals}" in human.stdout.splitlines()

    with bootstrap(cli.settings(), create=True) as runtime:
        assert runtime.cipher.primary_key_id == new_id
        _write(runtime, range(3, 4))
        assert _key_ids(runtime) == {old_id: 3, new_id: 1}
        written = runtime.repository.read(NS, "k3")
        assert written is not None
        assert written.metadata.header.key_id == new_id
        for number in range(3):
            old = runtime.repository.read(NS, f"k{number}")
            assert old is not None
            assert (old.document, old.metadata.header.key_id) == ({"n": number}, old_id)
    assert [entry["records"] for entry in _listed(cli)] == [1, 3]


# -- keys retire ------------------------------------------------------------------------


def test_keys_retire_waits_until_no_record_uses_the_key(cli: KeyWatch) -> None:
    """Retire refuses the primary key, an unknown id and a key still in use (naming the count).

    After ``rotate-key`` the old key can go; every record and ledger chain
    still verifies, since the ring kept its integrity key.
    """
    old_id = _init(cli)
    with bootstrap(cli.settings(), create=True) as runtime:
        _write(runtime, range(5))
        order = WorkOrder(kind="keys.cli", requester="tester", idempotency_key="wf-1")
        workflow, _ = runtime.workflows.create(order)
    new_id = _ok(cli.run("keys", "add", "--json"))["added"]
    assert isinstance(new_id, str)
    ring_before = cli.key_file.read_bytes()

    assert "primary" in _refused(cli.run("keys", "retire", new_id), "INVALID_INPUT")
    assert "k000000000000" in _refused(cli.run("keys", "retire", "k000000000000"), "INVALID_INPUT")
    in_use = _refused(cli.run("keys", "retire", old_id), "INVALID_INPUT")
    assert f"key {old_id} still seals 7 record(s)" in in_use
    assert "rotate-key" in in_use
    as_json = cli.run("keys", "retire", old_id, "--json")
    assert as_json.returncode == 1
    error = json_document(as_json)["error"]
    assert isinstance(error, dict)
    assert error["code"] == "INVALID_INPUT"
    assert cli.key_file.read_bytes() == ring_before

    rotated = _ok(cli.run("rotate-key", "--json", FLOWVAULT_SEAL_WARN_AT="1"))
    assert rotated == {
        "schema_version": 1,
        "primary_key_id": new_id,
        "resealed": 7,
        "changed_meanwhile": 0,
        "remaining": 0,
        "by_key": [{"key_id": new_id, "records": 7}],
        "compacted": True,
    }
    warning = cli.outputs[-1]
    assert "seal_budget_low" in warning
    assert new_id in warning

    retired = _ok(cli.run("keys", "retire", old_id, "--json"))
    assert retired["retired"] == old_id
    assert [entry["key_id"] for entry in _listed(cli)] == [new_id]
    ring = parse_key_ring(cli.key_file.read_bytes(), "the key file")
    assert ring.previous == ()
    assert _mode(cli.key_file) == 0o600

    verified = _ok(cli.run("ledger", "verify", "--all", "--json"))
    assert verified["ok"] is True
    assert verified["streams_checked"] == 2  # the workflow and its idempotency marker
    assert verified["records"] == {"readable": 7, "unreadable": 0, "unverified": 0}
    with bootstrap(cli.settings(), create=True) as runtime:
        assert runtime.workflows.get(workflow.workflow_id) == workflow
        for number in range(5):
            opened = runtime.repository.read(NS, f"k{number}")
            assert opened is not None
            assert opened.document == {"n": number}


# -- configurations whose key cannot rotate ------------------------------------------------


def test_keys_add_refuses_an_environment_key_and_the_memory_backend(cli: KeyWatch) -> None:
    """A key from ``FLOWVAULT_KEY`` is a single key, not a ring: ``keys add`` leaves it alone.

    The memory backend keeps no key to rotate, so it is refused too.
    """
    _init(cli)
    before = cli.key_file.read_bytes()
    key_text = before.decode().strip()
    refusal = _refused(cli.run("keys", "add", FLOWVAULT_KEY=key_text), "INVALID_INPUT")
    assert "FLOWVAULT_KEY" in refusal
    assert cli.key_file.read_bytes() == before
    other = base64.urlsafe_b64encode(generate_master_key()).decode()
    cli.keys.add(base64.urlsafe_b64decode(other))
    _refused(cli.run("keys", "add", FLOWVAULT_KEY=other), "INVALID_INPUT")
    assert cli.key_file.read_bytes() == before
    memory = _refused(cli.run("--backend", "memory", "keys", "add"), "INVALID_INPUT")
    assert "memory" in memory
    assert cli.key_file.read_bytes() == before
    assert [entry["role"] for entry in _listed(cli)] == ["primary"]


@pytest.mark.postgres
def test_postgres_keys_live_in_a_shared_key_file(
    cli: KeyWatch, postgres_server: Any, pg_schema: str
) -> None:
    """PostgreSQL keeps no key file of its own: without FLOWVAULT_KEY_FILE, KEY_REQUIRED.

    With the setting naming a private key file, the ring is kept there.
    """
    dsn = str(postgres_server.dsn)
    env = {
        "FLOWVAULT_BACKEND": "postgres",
        "FLOWVAULT_POSTGRES_DSN": dsn,
        "FLOWVAULT_POSTGRES_SCHEMA": pg_schema,
    }
    refusal = _refused(cli.run("keys", "add", **env), "KEY_REQUIRED")
    assert "FLOWVAULT_KEY_FILE" in refusal
    single = base64.urlsafe_b64encode(generate_master_key()).decode()
    pinned = _refused(cli.run("keys", "add", **env, FLOWVAULT_KEY=single), "INVALID_INPUT")
    assert "set FLOWVAULT_KEY_FILE to it" in pinned
    assert str(cli.home) not in pinned

    ring_dir = cli.tmp_path / "ring"
    ring_dir.mkdir(mode=0o700)
    ring_dir.chmod(0o700)
    FileKeyStore(ring_dir, file_name="shared.key").create(generate_master_key())
    key_file = ring_dir / "shared.key"
    _ok(cli.run("init", "--json", **env, FLOWVAULT_KEY_FILE=str(key_file)))
    added = _ok(cli.run("keys", "add", "--json", **env, FLOWVAULT_KEY_FILE=str(key_file)))
    assert _mode(key_file) == 0o600
    assert key_file.read_text().splitlines()[0] == RING_HEADER
    listed = _listed(cli, **env, FLOWVAULT_KEY_FILE=str(key_file))
    assert (listed[0]["key_id"], listed[0]["role"]) == (added["added"], "primary")
    assert [entry["role"] for entry in listed] == ["primary", "open-only"]
    assert not (cli.home / "keys").exists()


# -- the nonce budget ----------------------------------------------------------------------


def test_a_key_past_its_seal_limit_is_refused_until_a_new_key_is_added(cli: KeyWatch) -> None:
    """With a 64-seal limit, writes stop with KEY_EXHAUSTED by the 64th seal, across restarts.

    The refused write leaves no record; a new runtime cannot seal under the
    key either, since the count is kept in the store; the warning to rotate
    is logged first; after ``keys add`` writes succeed under the new key.
    """
    old_id = _init(cli)
    budget = cli.settings(seal_limit=SEAL_LIMIT, seal_warn_at=SEAL_WARN_AT)
    with capture_logs() as logs, bootstrap(budget, create=True) as runtime:
        written, refusal = _write_until_refused(runtime)
        assert refusal.code == "KEY_EXHAUSTED"
        assert 0 < written <= SEAL_LIMIT
        assert runtime.repository.read(NS, f"k{written}") is None
        assert _key_ids(runtime) == {old_id: written}
        assert runtime.repository.budget.counts()[old_id] >= written
    warnings = [entry for entry in logs if entry["event"] == "seal_budget_low"]
    assert warnings
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["key_id"] == old_id

    with bootstrap(budget, create=True) as runtime, pytest.raises(KeyExhausted):
        _write(runtime, range(written, written + 1))
    with bootstrap(budget, create=True) as runtime:
        assert runtime.repository.read(NS, f"k{written}") is None
        assert _key_ids(runtime) == {old_id: written}
    (entry,) = _listed(cli, **BUDGET_ENV)
    assert entry["key_id"] == old_id
    assert isinstance(entry["seals"], int)
    assert entry["seals"] >= SEAL_LIMIT

    new_id = _ok(cli.run("keys", "add", "--json", **BUDGET_ENV))["added"]
    with bootstrap(budget, create=True) as runtime:
        _write(runtime, range(written, written + 2))
        assert _key_ids(runtime) == {old_id: written, new_id: 2}
        for number in range(written + 2):
            opened = runtime.repository.read(NS, f"k{number}")
            assert opened is not None
            assert opened.document == {"n": number}
