"""Long jobs show progress in a pipe too: plain lines on stderr, throttled, with a last line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkflowState

SCOPES = 40
LINE = re.compile(r"^verifying streams: (\d+)/(\d+)( done)?$")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Provide a SQLite home with one state history stream per scope."""
    path = tmp_path_factory.mktemp("progress") / "home"
    with bootstrap(Settings(backend="sqlite", home=path), create=True) as runtime:
        for index in range(SCOPES):
            runtime.state(f"scope{index}").save(WorkflowState(step=index))
    return path


def _progress(stderr: str) -> list[tuple[int, int, bool]]:
    found = [LINE.match(line) for line in stderr.splitlines()]
    return [(int(m[1]), int(m[2]), bool(m[3])) for m in found if m]


def test_verify_all_in_a_pipe_prints_progress_lines(tmp_path: Path, home: Path) -> None:
    """With the interval at 0 every stream is counted on stderr, ending with a 'done' line."""
    result = _run(tmp_path, "ledger", "verify", "--all", home=home, FLOWVAULT_PROGRESS_INTERVAL="0")
    assert result.returncode == 0, result.stderr
    lines = _progress(result.stderr)
    total = lines[-1][1]
    assert total >= SCOPES
    assert [done for done, _, _ in lines[:-1]] == list(range(1, total + 1))
    assert lines[-1] == (total, total, True)
    assert "verifying streams" not in result.stdout


def test_plain_progress_is_throttled(tmp_path: Path, home: Path) -> None:
    """At the default interval a quick job prints no line per item, only its closing count."""
    result = _run(tmp_path, "ledger", "verify", "--all", home=home)
    assert result.returncode == 0, result.stderr
    lines = _progress(result.stderr)
    assert len(lines) <= 3
    assert lines[-1][2]
    assert lines[-1][0] == lines[-1][1] >= SCOPES


def test_json_keeps_stderr_quiet(tmp_path: Path, home: Path) -> None:
    """With --json nothing is printed on stderr, whatever the interval."""
    result = _run(
        tmp_path,
        "ledger",
        "verify",
        "--all",
        "--json",
        home=home,
        FLOWVAULT_PROGRESS_INTERVAL="0",
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert _document(result)


def test_progress_interval_out_of_range_is_refused(tmp_path: Path, home: Path) -> None:
    """A negative interval names the variable and its range."""
    result = _run(
        tmp_path, "ledger", "verify", "--all", home=home, FLOWVAULT_PROGRESS_INTERVAL="-1"
    )
    assert result.returncode == 1
    assert "FLOWVAULT_PROGRESS_INTERVAL" in result.stderr
    assert "(allowed: >= 0 and <= 3600)" in result.stderr
