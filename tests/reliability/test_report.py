"""The figures table ``make reliability`` prints fails on any anomaly or uncaught control."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPORT = Path(__file__).with_name("report.py")


def _figures(path: Path, *rows: dict[str, object]) -> Path:
    base = {"trials": 10, "anomalies": 0, "control_caught": True, "detail": "", "seconds": 1.0}
    path.write_text("".join(json.dumps({**base, **row}) + "\n" for row in rows))
    return path


def _report(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPORT), str(path)], capture_output=True, text=True, check=False
    )


def test_clean_figures_print_a_table_and_pass(tmp_path: Path) -> None:
    """Every row is printed; a family without a control shows n/a."""
    path = _figures(tmp_path / "f.jsonl", {"family": "a"}, {"family": "b", "control_caught": None})
    result = _report(path)
    assert result.returncode == 0, result.stderr
    assert "| a | 10 | 0 | yes | 1.0 |  |" in result.stdout
    assert "| b | 10 | 0 | n/a | 1.0 |  |" in result.stdout


def test_an_anomaly_or_an_uncaught_control_fails(tmp_path: Path) -> None:
    """A run that found a problem, or whose control saw nothing, must not look green."""
    assert _report(_figures(tmp_path / "a.jsonl", {"family": "a", "anomalies": 1})).returncode == 1
    uncaught = _figures(tmp_path / "c.jsonl", {"family": "c", "control_caught": False})
    result = _report(uncaught)
    assert result.returncode == 1
    assert "| NO |" in result.stdout


def test_a_missing_or_empty_file_fails(tmp_path: Path) -> None:
    """A long run that wrote nothing must not pass as an empty, clean table."""
    assert _report(tmp_path / "missing.jsonl").returncode == 2
    assert _report(_figures(tmp_path / "empty.jsonl")).returncode == 1
