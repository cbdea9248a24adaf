"""``flowvault demo``, the main job, run as a real console-script subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_helpers import FLOWVAULT, cli_env

from flowvault.adapters.cli import _demo as demo_verb
from flowvault.adapters.cli._demo import expect
from flowvault.composition._cli import main

TIMEOUT = 120.0
STEPS = [
    ("create-work-order", "create a work order, then retry it"),
    ("lifecycle", "move it through its lifecycle"),
    ("action-result", "store an action result"),
    ("checkpoint", "start a run and checkpoint it"),
    ("request-approval", "request a human approval"),
    ("decide", "decide it, exactly once"),
    ("resume", "resume from the consumed checkpoint"),
    ("finish", "finish with a terminal receipt"),
    ("verify-ledgers", "verify every ledger"),
    ("tamper", "flip a byte in a copy of the database"),
    ("fingerprint", "fingerprint the saved progress"),
    ("recovery", "run the recovery verb, reset-progress"),
]
SEALED_PARAMETERS = ["Acme Supplies 7731", "INV-DEMO-0042", "alice@example.org"]
"""Work-order plaintext the demo seals and never prints."""
DECIDER = "bob@example.org"


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return cli_env(tmp_path, TMPDIR=str(tmp_path / "tmp"))


def _demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FLOWVAULT), "demo", *args],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.fixture(scope="module")
def narrated(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One narrated run in a chosen home, shared by the tests that read its output."""
    tmp_path = tmp_path_factory.mktemp("narrated")
    home = tmp_path / "demo"
    return home, _demo(tmp_path, "--home", str(home))


def test_demo_passes_every_step_in_order(
    narrated: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """Exit 0, the home first, then each step's title numbered and in order."""
    home, result = narrated
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == f"home: {home}"
    positions = [
        lines.index(f"[{n}/{len(STEPS)}] {title}") for n, (_, title) in enumerate(STEPS, 1)
    ]
    assert positions == sorted(positions)
    assert f"demo passed: all {len(STEPS)} steps behaved as expected" in lines


def test_demo_narrates_what_each_step_shows(
    narrated: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The refusals and verdicts the scenario exists to show are all printed."""
    _, result = narrated
    for shown in [
        "retry with the same idempotency key: the same workflow, created=false",
        "IDEMPOTENCY_CONFLICT",
        "REVISION_CONFLICT",
        "APPROVAL_ALREADY_DECIDED",
        "CHECKPOINT_CONSUMED",
        "terminal receipt sha256:",
        "hash chain intact",
        "reading that ledger from the copy: INTEGRITY_FAILURE",
        "the original store still verifies",
        "payload_digest: sha256:",
        "reset-progress --scope demo",
        "fingerprint of the demo scope: sha256:",
    ]:
        assert shown in result.stdout


def test_demo_prints_no_plaintext_and_no_key(
    narrated: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """Neither the sealed work order, the decider, nor the key material reaches the output."""
    home, result = narrated
    output = result.stdout + result.stderr
    key = (home / "keys" / "store.key").read_text(encoding="ascii").strip()
    assert key
    assert key not in output
    for secret in [*SEALED_PARAMETERS, DECIDER]:
        assert secret not in output
    database = (home / "data" / "flowvault.db").read_bytes()
    for secret in SEALED_PARAMETERS:
        assert secret.encode() not in database


def test_demo_tampers_only_a_copy(
    narrated: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The byte is flipped in a copy inside the demo home; the demo's own store is intact."""
    home, _ = narrated
    copy = home / "tampered-copy" / "data" / "flowvault.db"
    original = home / "data" / "flowvault.db"
    assert copy.is_file()
    assert b"route-via-sepa-batch" in original.read_bytes()
    assert b"route-via-sepa-batch" not in copy.read_bytes()


def test_demo_json_names_every_step_ok(tmp_path: Path) -> None:
    """With --json stdout is one document: every step by name with ok=true."""
    home = tmp_path / "demo"
    result = _demo(tmp_path, "--home", str(home), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    document = json.loads(lines[0])
    assert document["ok"] is True
    assert document["home"] == str(home)
    assert [(step["name"], step["ok"]) for step in document["steps"]] == [
        (name, True) for name, _ in STEPS
    ]
    assert document["fingerprint"]["readability"] == "readable"
    assert DECIDER not in result.stdout


def test_demo_defaults_to_a_fresh_temporary_home(tmp_path: Path) -> None:
    """Without --home the demo makes a new directory under TMPDIR and prints it first."""
    result = _demo(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    home = Path(result.stdout.splitlines()[1].removeprefix("home: "))
    assert home.parent == tmp_path / "tmp"
    assert home.name.startswith("flowvault-demo-")
    assert (home / "data" / "flowvault.db").is_file()
    assert not (tmp_path / "xdg").exists()


def test_demo_accepts_an_empty_existing_home(tmp_path: Path) -> None:
    """An existing empty directory is a fresh home."""
    home = tmp_path / "empty"
    home.mkdir(mode=0o700)
    result = _demo(tmp_path, "--home", str(home), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["ok"] is True


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_demo_refuses_a_non_empty_home_without_touching_it(
    tmp_path: Path, json_flag: list[str]
) -> None:
    """A home holding anything is refused with exit 1, and left exactly as it was."""
    home = tmp_path / "busy"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    before = sorted(path.name for path in home.rglob("*"))
    result = _demo(tmp_path, "--home", str(home), *json_flag)
    assert result.returncode == 1
    assert "INVALID_INPUT" in result.stdout + result.stderr
    assert "[1/" not in result.stdout
    assert sorted(path.name for path in home.rglob("*")) == before
    assert (home / "notes.txt").read_text() == "mine"


def test_demo_refuses_a_file_as_home(tmp_path: Path) -> None:
    """A path that is a file is not a home; it is refused and left alone."""
    home = tmp_path / "file"
    home.write_text("not a directory")
    result = _demo(tmp_path, "--home", str(home))
    assert result.returncode == 1
    assert home.read_text() == "not a directory"


def test_demo_global_home_option_works_too(tmp_path: Path) -> None:
    """``flowvault --home DIR demo`` chooses the home like ``demo --home DIR``."""
    home = tmp_path / "global"
    result = subprocess.run(
        [str(FLOWVAULT), "--home", str(home), "demo", "--json"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["home"] == str(home)


def test_a_misbehaving_step_stops_the_demo_and_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step whose expectation fails stops the demo with exit 1, naming the step."""

    def broken(_scenario: object) -> object:
        expect(False, "the retry created a second workflow")
        raise AssertionError

    steps = list(demo_verb.STEPS)
    steps[1] = (steps[1][0], broken)
    monkeypatch.setattr(demo_verb, "STEPS", tuple(steps))
    for name in [k for k in os.environ if k.startswith("FLOWVAULT_")]:
        monkeypatch.delenv(name)
    assert main(["demo", "--home", str(tmp_path / "demo")]) == 1
    out, err = capsys.readouterr()
    assert "[1/12] create a work order, then retry it" in out
    assert "[2/12]" not in out
    assert "demo failed at step 2/12 (lifecycle: move it through its lifecycle)" in err
    assert "the retry created a second workflow" in err
    assert main(["demo", "--home", str(tmp_path / "json"), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False
    assert document["steps"][-1] == {
        "name": "lifecycle",
        "ok": False,
        "error": "the retry created a second workflow",
    }
