"""``flowvault approvals`` expiry, quorum votes and signed decisions, as real subprocesses.

Data is prepared in-process on a real SQLite home; the verbs run as the
installed console script. A signed decision is then checked by a process
that has no store and no store key, only the decider's public key.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from checkpoint_setup import create_checkpoint
from cli_helpers import json_document, run_cli
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flowvault.composition import Settings, bootstrap
from flowvault.domain import ApprovalStatus, content_hash

ANN = "decider-marker-ann@example.org"
BEN = "decider-marker-ben@example.org"


def _paused(home: Path, *, expires_in: timedelta, **quorum: object) -> tuple[str, str]:
    """Start, checkpoint and pause a run on a SQLite home; return (run id, approval id)."""
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        runs = runtime.runs
        runtime.definitions.register_definition("wire.send", {"nodes": ["send"]})
        run, _ = runs.start_run("wire.send", {"amount": 9000})
        runs.set_status(run.run_id, "running", expected_status="accepted")
        checkpoint = create_checkpoint(runtime.checkpoints, run.run_id, {"n": 1}, {"s": 1})
        runs.set_status(run.run_id, "awaiting_approval", expected_status="running")
        approval = runtime.approvals.request_approval(
            checkpoint.checkpoint_id,
            expected_state_digest=checkpoint.state_digest,
            expected_budgets=checkpoint.budgets,
            expected_counters=checkpoint.counters,
            expected_dependency_digest=checkpoint.dependency_digest,
            audience="board",
            prompt_digest=content_hash("Send?"),
            allowed_decisions=["approve", "reject"],
            expires_at=runtime.clock.now() + expires_in,
            **quorum,  # type: ignore[arg-type]
        )
        return run.run_id, approval.approval_id


def _sign(private_key: Path, message: Path, signature: Path) -> None:
    """Sign as the docs show, with openssl; with the same library call where it is missing."""
    openssl = shutil.which("openssl")
    if openssl is not None:
        subprocess.run(
            [openssl, "pkeyutl", "-sign", "-rawin", "-inkey", str(private_key),
             "-in", str(message), "-out", str(signature)],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        return
    key = serialization.load_pem_private_key(private_key.read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    signature.write_bytes(key.sign(message.read_bytes()))


def _clean(*results: object) -> None:
    for result in results:
        text = str(getattr(result, "stdout", "")) + str(getattr(result, "stderr", ""))
        assert "decider-marker" not in text


def test_an_overdue_approval_lists_expired_and_expire_fails_the_run(tmp_path: Path) -> None:
    """Past the deadline it lists expired; ``approvals expire`` records that and fails the run."""
    home = tmp_path / "home"
    deadline = time.monotonic() + 8
    run_id, approval_id = _paused(home, expires_in=timedelta(seconds=8))
    listed = run_cli(tmp_path, "approvals", "list", "--run", run_id, "--json", home=home)
    assert [row["status"] for row in json_document(listed)["approvals"]] == ["pending"]  # type: ignore[index, union-attr]
    time.sleep(max(0.0, deadline - time.monotonic()) + 0.2)
    listed = run_cli(tmp_path, "approvals", "list", "--run", run_id, "--json", home=home)
    assert [row["status"] for row in json_document(listed)["approvals"]] == ["expired"]  # type: ignore[index, union-attr]
    pending = run_cli(
        tmp_path, "approvals", "list", "--run", run_id, "--status", "pending", home=home
    )
    assert pending.stdout == "no approvals\n"
    expired = run_cli(tmp_path, "approvals", "expire", "--json", home=home)
    assert expired.returncode == 0, expired.stderr
    assert json_document(expired) == {"expired_approvals": 1, "failed_runs": 1, "schema_version": 1}
    again = run_cli(tmp_path, "approvals", "expire", home=home)
    assert "expired_approvals: 0" in again.stdout
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        assert runtime.approvals.get_approval(approval_id).status is ApprovalStatus.EXPIRED
        assert runtime.runs.get_run(run_id).status == "failed"


def test_quorum_votes_signed_decisions_and_an_offline_check(tmp_path: Path) -> None:
    """Two of two, one signed: the vote waits, the second decides, the signature checks offline."""
    home = tmp_path / "home"
    _, approval_id = _paused(home, expires_in=timedelta(hours=1), required=2, deciders=(ANN, BEN))
    made = run_cli(tmp_path, "keys", "signing-key", "--out", str(tmp_path / "ann.pem"))
    assert made.returncode == 0, made.stderr
    public = tmp_path / "ann.pem.pub"
    registered = run_cli(
        tmp_path, "approvals", "register-key", "--actor", ANN, str(public), home=home
    )
    assert registered.returncode == 0, registered.stderr
    decide = ["approvals", "decide", approval_id, "--decision", "approve", "--yes", "--json"]
    unsigned = run_cli(tmp_path, *decide, "--actor", ANN, home=home)
    assert unsigned.returncode == 1
    assert json_document(unsigned)["error"]["code"] == "DECISION_SIGNATURE_INVALID"  # type: ignore[index]
    assert "approvals statement" in unsigned.stdout
    statement = run_cli(
        tmp_path, "approvals", "statement", approval_id, "--decision", "approve", home=home
    )
    assert statement.returncode == 0, statement.stderr
    assert not statement.stdout.endswith("\n")
    statement_file = tmp_path / "statement.json"
    statement_file.write_text(statement.stdout)
    signature = tmp_path / "ann.sig"
    _sign(tmp_path / "ann.pem", statement_file, signature)
    voted = run_cli(
        tmp_path, *decide, "--actor", ANN, "--signature-file", str(signature), home=home
    )
    assert voted.returncode == 0, voted.stderr
    shown = json_document(voted)["approval"]
    assert isinstance(shown, dict)
    assert (shown["status"], shown["vote_count"], shown["signed_vote_count"]) == ("pending", 1, 1)
    assert shown["resume_checkpoint_id"] is None
    decided = run_cli(tmp_path, *decide, "--actor", BEN, home=home)
    shown = json_document(decided)["approval"]
    assert isinstance(shown, dict)
    assert (shown["status"], shown["required"], shown["vote_count"]) == ("decided", 2, 2)
    assert str(shown["resume_checkpoint_id"]).startswith("cp_")
    signed = run_cli(tmp_path, "approvals", "signed", approval_id, home=home)
    (line,) = signed.stdout.splitlines()
    kept = tmp_path / "decision.json"
    kept.write_text(line + "\n")
    nowhere = tmp_path / "no-store-here"
    checked = run_cli(
        tmp_path, "approvals", "verify-decision", str(kept), "--public-key", str(public),
        "--json", home=nowhere,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    document = json_document(checked)
    assert (document["ok"], document["approval_id"], document["decision"]) == (
        True,
        approval_id,
        "approve",
    )
    assert not nowhere.exists()
    other = Ed25519PrivateKey.generate().public_key()
    other_public = tmp_path / "other.pub"
    other_public.write_bytes(
        other.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    wrong_key = run_cli(
        tmp_path, "approvals", "verify-decision", str(kept), "--public-key", str(other_public),
        home=nowhere,
    )  # fmt: skip
    assert wrong_key.returncode == 1
    assert "INTEGRITY_FAILURE" in wrong_key.stderr
    edited = json.loads(line)
    edited["statement"] = edited["statement"].replace('"approve"', '"reject"')
    kept.write_text(json.dumps(edited))
    tampered = run_cli(
        tmp_path, "approvals", "verify-decision", str(kept), "--public-key", str(public),
        home=nowhere,
    )  # fmt: skip
    assert tampered.returncode == 1
    assert "INTEGRITY_FAILURE" in tampered.stderr
    kept.write_text("not a statement")
    garbage = run_cli(
        tmp_path, "approvals", "verify-decision", str(kept), "--public-key", str(public),
        home=nowhere,
    )  # fmt: skip
    assert "INVALID_INPUT" in garbage.stderr
    _clean(registered, unsigned, statement, voted, decided, signed, checked, wrong_key, tampered)


@pytest.mark.parametrize("verb", [["expire"], ["statement", "x", "--decision", "approve"]])
def test_cold_root_creates_nothing(tmp_path: Path, verb: list[str]) -> None:
    """On a home with no store the verbs create nothing."""
    home = tmp_path / "cold"
    run_cli(tmp_path, "approvals", *verb, home=home)
    assert not home.exists()


def _listed(tmp_path: Path, home: Path, *args: str) -> dict[str, object]:
    result = run_cli(tmp_path, "approvals", "list", *args, "--json", home=home)
    assert result.returncode == 0, result.stderr
    document = json_document(result)
    assert isinstance(document, dict)
    return document


def _ids(document: dict[str, object]) -> list[str]:
    rows = document["approvals"]
    assert isinstance(rows, list)
    return [row["approval_id"] for row in rows]


def test_the_worklist_across_runs_show_and_decide_name_what_to_do(tmp_path: Path) -> None:
    """No --run lists every run's approvals by status as of now; show and refusals guide."""
    home = tmp_path / "home"
    deadline = time.monotonic() + 4
    soon_run, soon = _paused(home, expires_in=timedelta(seconds=4))
    later_run, later = _paused(home, expires_in=timedelta(hours=1))
    assert soon_run != later_run
    assert sorted(_ids(_listed(tmp_path, home))) == sorted([soon, later])
    first = _listed(tmp_path, home, "--limit", "1")
    assert len(_ids(first)) == 1
    assert first["next_cursor"] is not None
    assert sorted(_ids(_listed(tmp_path, home, "--limit", "1", "--all"))) == sorted([soon, later])

    sealed = run_cli(tmp_path, "approvals", "show", later, home=home)
    assert "board" not in sealed.stdout
    assert "  audience: sealed (--reveal prints it)" in sealed.stdout.splitlines()
    shown = run_cli(tmp_path, "approvals", "show", later, "--reveal", home=home)
    assert shown.returncode == 0, shown.stderr
    for line in (
        "  audience: board",
        "  allowed_decisions: approve, reject",
        "  prompt_text: not stored (flowvault keeps only prompt_digest)",
        f"  prompt_digest: {content_hash('Send?')}",
        "  required: 1",
        "  vote_count: 0",
        "  status: pending",
    ):
        assert line in shown.stdout.splitlines(), shown.stdout
    show = ("approvals", "show", later, "--json")
    hidden = json_document(run_cli(tmp_path, *show, home=home))["approval"]  # type: ignore[index]
    assert (hidden["audience"], hidden["allowed_decisions"]) == (None, None)
    detail = json_document(run_cli(tmp_path, *show, "--reveal", home=home))
    fields = detail["approval"]  # type: ignore[index]
    assert fields["allowed_decisions"] == ["approve", "reject"]
    assert (fields["audience"], fields["prompt_text"], fields["quorum"]) == ("board", None, False)
    assert fields["expires_at"].endswith("Z")

    decide = ["approvals", "decide", later, "--actor", "ops", "--yes"]
    maybe = run_cli(tmp_path, *decide, "--decision", "maybe", home=home)
    assert maybe.returncode == 1
    assert maybe.stderr.startswith("error: APPROVAL_DECISION_NOT_ALLOWED: ")
    assert "  fix: pass --decision as one of the 2 allowed decisions" in maybe.stderr
    assert "approve" not in maybe.stderr
    named = run_cli(tmp_path, *decide, "--decision", "maybe", "--reveal", "--json", home=home)
    assert json_document(named)["error"]["fix"] == "pass --decision as one of: approve, reject"  # type: ignore[index]
    unsigned = run_cli(tmp_path, "approvals", "statement", later, "--decision", "maybe", home=home)
    assert "fix: pass --decision as one of the 2 allowed decisions" in unsigned.stderr
    assert run_cli(tmp_path, *decide, "--decision", "approve", home=home).returncode == 0
    again = run_cli(tmp_path, *decide[:-3], "--actor", "someone-else", "--yes",
                    "--decision", "reject", home=home)  # fmt: skip
    assert again.stderr.startswith("error: APPROVAL_ALREADY_DECIDED: ")
    assert "  fix: nothing to do" in again.stderr

    time.sleep(max(0.0, deadline - time.monotonic()) + 0.2)
    assert _ids(_listed(tmp_path, home, "--status", "expired")) == [soon]
    assert _ids(_listed(tmp_path, home, "--status", "pending")) == []
    assert _ids(_listed(tmp_path, home, "--status", "decided")) == [later]
    late = run_cli(tmp_path, "approvals", "decide", soon, "--actor", "ops", "--yes",
                   "--decision", "approve", home=home)  # fmt: skip
    assert late.stderr.startswith("error: APPROVAL_EXPIRED: ")
    assert "  fix: the deadline passed" in late.stderr
