"""Each refusal an operator can cause on the CLI prints its own fix, as real subprocesses.

INVALID_INPUT covers many mistakes; the table's general line is the last
resort, so each case below must print its own. A wrong store key, and a
missing PostgreSQL driver, each name what to do and never to reset data.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from cli_helpers import run_cli
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flowvault.adapters.cli._io import FIXES

GENERAL = FIXES["INVALID_INPUT"]
DECIDE = ("approvals", "decide", "a1", "--decision", "approve", "--yes")


def _fix(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("  fix: ")]
    assert len(lines) == 1, stderr
    return lines[0].removeprefix("  fix: ")


def _key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite home made by ``flowvault init``, shared by the refusals (none writes)."""
    root = tmp_path_factory.mktemp("fixes")
    made = run_cli(root, "init", home=root / "home")
    assert made.returncode == 0, made.stderr
    return root / "home"


def _cases(tmp_path: Path) -> dict[str, tuple[list[str], dict[str, str], str]]:
    """Name -> (arguments, environment, a phrase of the specific fix)."""
    not_a_key = tmp_path / "not-a-key.pem"
    not_a_key.write_text("not a key\n")
    bad_signature = tmp_path / "bad.sig"
    bad_signature.write_text("zz\n")
    missing = str(tmp_path / "missing.json")
    public = tmp_path / "decider.pem.pub"
    public.write_bytes(
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return {
        "cursor": (["runs", "list", "--cursor", "zzz"], {}, "next_cursor"),
        "limit": (["workflows", "list", "--limit", "0"], {}, "--limit between 1 and"),
        "run id": (["approvals", "list", "--run", "bad/id"], {}, "'flowvault runs list'"),
        "actor": (
            [*DECIDE, "--actor", ""],
            {},
            "--actor as the decider's name",
        ),
        "public key": (
            ["approvals", "verify-decision", str(bad_signature), "--public-key", str(not_a_key)],
            {},
            "the .pub file",
        ),
        "decider key": (
            ["approvals", "register-key", "--actor", "ann", str(not_a_key)],
            {},
            "register the decider's public key file",
        ),
        "signature file": (
            [*DECIDE, "--actor", "ann", "--signature-file", str(bad_signature)],
            {},
            "openssl pkeyutl",
        ),
        "unreadable file": (
            ["ledger", "check-receipt", missing, "--public-key", str(not_a_key)],
            {},
            "path and that this user can read it",
        ),
        "settings": (["runs", "list"], {"FLOWVAULT_BAKCEND": "sqlite"}, "docs/operations.md"),
        "unknown key id": (["keys", "retire", "nope"], {}, "'flowvault keys list'"),
        "environment key": (["keys", "add"], {"FLOWVAULT_KEY": _key()}, "unset FLOWVAULT_KEY"),
        "memory keys": (["--backend", "memory", "keys", "add"], {}, "SQLite or PostgreSQL"),
        "signed decision": (
            ["approvals", "verify-decision", str(not_a_key), "--public-key", str(public)],
            {},
            "'flowvault approvals signed APPROVAL_ID' output unchanged",
        ),
    }


def test_each_invalid_input_prints_its_own_fix(tmp_path: Path, home: Path) -> None:
    """At least eight different mistakes, each refused with INVALID_INPUT and a fix of its own."""
    cases = _cases(tmp_path)
    fixes: dict[str, str] = {}
    for name, (args, env, phrase) in cases.items():
        result = run_cli(tmp_path, *args, home=home, **env)
        assert result.returncode == 1, (name, result.stderr)
        assert result.stderr.startswith("error: INVALID_INPUT: "), (name, result.stderr)
        fix = _fix(result.stderr)
        assert fix != GENERAL, name
        assert phrase in fix, (name, fix)
        fixes[name] = fix
    distinct = set(fixes.values())
    assert len(distinct) >= 8


def test_a_wrong_store_key_points_at_the_key_not_at_a_reset(tmp_path: Path, home: Path) -> None:
    """Another FLOWVAULT_KEY is INTEGRITY_FAILURE whose fix checks the key and resets nothing."""
    result = run_cli(tmp_path, "runs", "list", home=home, FLOWVAULT_KEY=_key())
    assert result.returncode == 1
    assert result.stderr.startswith("error: INTEGRITY_FAILURE: ")
    fix = _fix(result.stderr)
    assert "FLOWVAULT_KEY" in fix
    assert "reset" not in fix
    assert fix.index("FLOWVAULT_KEY") < fix.index("restore")


def test_a_missing_postgres_driver_names_the_extra(tmp_path: Path) -> None:
    """With psycopg unimportable, --backend postgres is STORE_UNAVAILABLE naming the extra."""
    shim = tmp_path / "shim" / "psycopg"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n"
    )
    for verb in (["init"], ["runs", "list"]):
        result = run_cli(
            tmp_path,
            "--backend", "postgres", "--postgres-dsn", "postgresql://nobody@127.0.0.1:1/none",
            *verb,
            home=tmp_path / "home",
            PYTHONPATH=str(tmp_path / "shim"),
            FLOWVAULT_KEY=_key(),
        )  # fmt: skip
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith("error: STORE_UNAVAILABLE: "), result.stderr
        assert "ModuleNotFoundError" not in result.stderr
        assert _fix(result.stderr) == "pip install 'flowvault[postgres]'"
