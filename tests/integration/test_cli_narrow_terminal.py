"""Ids are never cut: on an 80-column terminal a long cell folds onto more lines."""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest
from cli_helpers import FLOWVAULT, TIMEOUT, cli_env
from cli_helpers import json_document as _document
from cli_helpers import run_cli as _run

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Provide a home the demo filled with a workflow, a run and an approval."""
    root = tmp_path_factory.mktemp("narrow")
    path = root / "home"
    result = _run(root, "demo", "--json", home=path)
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def ids(home: Path) -> dict[str, str]:
    """Read the ids of the demo's workflow, run and approval from ``--json`` lists."""
    tmp_path = home.parent
    workflows = _document(_run(tmp_path, "workflows", "list", "--json", home=home))["workflows"]
    runs = _document(_run(tmp_path, "runs", "list", "--json", home=home))["runs"]
    assert isinstance(workflows, list)
    assert isinstance(runs, list)
    run_id = runs[0]["run_id"]
    approvals = _document(
        _run(tmp_path, "approvals", "list", "--run", run_id, "--json", home=home)
    )["approvals"]
    assert isinstance(approvals, list)
    return {
        "workflow": workflows[0]["workflow_id"],
        "run": run_id,
        "approval": approvals[0]["approval_id"],
    }


def _on_terminal(tmp_path: Path, home: Path, *args: str, columns: int = 80) -> str:
    """Run the CLI with stdout on a pseudo-terminal ``columns`` wide; return what it drew."""
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    try:
        process = subprocess.Popen(
            [str(FLOWVAULT), "--home", str(home), *args],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            env=cli_env(tmp_path, COLUMNS=str(columns), LINES="40"),
        )
        os.close(terminal)
        terminal = -1
        shown = b""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if chunk:
                    shown += chunk
                    continue
            if process.poll() is not None and not ready:
                break
            if ready:
                break
        process.wait(timeout=TIMEOUT)
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    assert process.returncode == 0, shown
    return ANSI.sub("", shown.decode(errors="replace")).replace("\r", "")


def _columns(drawn: str) -> list[str]:
    """Join each table column's cells top to bottom, so a folded cell reads whole again."""
    rows = [line for line in drawn.splitlines() if line.startswith("│")]
    assert rows, drawn
    bars = [index for index, char in enumerate(rows[0]) if char == "│"]
    return [
        "".join(row[start + 1 : end].strip() for row in rows)
        for start, end in itertools.pairwise(bars)
    ]


@pytest.mark.parametrize(
    ("kind", "verb"),
    [
        ("workflow", ("workflows", "list")),
        ("run", ("runs", "list")),
        ("approval", ("approvals", "list", "--run")),
    ],
)
def test_ids_are_whole_at_80_columns(
    tmp_path: Path, home: Path, ids: dict[str, str], kind: str, verb: tuple[str, ...]
) -> None:
    """Every id can be read back whole from its column on an 80-column terminal; none is cut."""
    args = (*verb, ids["run"]) if verb[-1] == "--run" else verb
    drawn = _on_terminal(tmp_path, home, *args)
    assert "…" not in drawn
    assert max(len(line) for line in drawn.splitlines()) <= 80
    assert any(ids[kind] in column for column in _columns(drawn)), drawn
