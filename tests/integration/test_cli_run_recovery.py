"""``flowvault runs recover`` through the installed command, on a real SQLite file.

Runs are started in-process by hosts whose clocks stand an hour behind and
an hour ahead of the machine's, so one lease has long expired and one is
live when the command, on the machine's clock, judges them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cli_helpers import json_document, run_cli

from flowvault.application.testing import FrozenClock
from flowvault.composition import Settings, bootstrap


def _start(home: Path, clock: FrozenClock, host_id: str, *, pause: bool = False) -> str:
    settings = Settings(backend="sqlite", home=home, host_id=host_id)
    with bootstrap(settings, create=True, clock=clock) as runtime:
        runtime.definitions.register_definition("triage", {"nodes": ["plan"]})
        run_id = runtime.runs.start_run("triage", {"ask": 1})[0].run_id
        runtime.runs.set_status(run_id, "running", expected_status="accepted")
        if pause:
            runtime.runs.set_status(run_id, "checkpointed", expected_status="running")
        return run_id


def test_runs_recover_takes_over_expired_leases_only(tmp_path: Path) -> None:
    """Only the run whose lease ran out ends interrupted, owned by the recovering host."""
    home = tmp_path / "home"
    behind = FrozenClock(datetime.now(UTC) - timedelta(hours=1))
    ahead = FrozenClock(datetime.now(UTC) + timedelta(hours=1))
    dead = _start(home, behind, "gone-1")
    live = _start(home, ahead, "alive-1")
    paused = _start(home, behind, "gone-1", pause=True)

    result = run_cli(tmp_path, "runs", "recover", "--json", home=home, FLOWVAULT_HOST_ID="ops-1")
    assert result.returncode == 0, result.stderr
    assert json_document(result) == {"recovered": 1, "host_id": "ops-1", "schema_version": 1}
    with bootstrap(Settings(backend="sqlite", home=home, host_id="reader-1")) as runtime:
        ended = runtime.runs.get_run(dead)
        assert (ended.status, ended.owner) == ("interrupted_non_resumable", "ops-1")
        assert runtime.runs.get_run(live).status == "running"
        assert runtime.runs.get_run(paused).status == "checkpointed"

    again = run_cli(tmp_path, "runs", "recover", home=home)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[:2] == ["run recovery", "  recovered: 0"]


def test_runs_recover_on_a_cold_root_creates_nothing(tmp_path: Path) -> None:
    """With no store yet the verb reports nothing recovered and leaves the home absent."""
    home = tmp_path / "cold"
    result = run_cli(tmp_path, "runs", "recover", "--json", home=home)
    assert result.returncode == 0, result.stderr
    assert json_document(result) == {"recovered": 0, "host_id": None, "schema_version": 1}
    assert not home.exists()
