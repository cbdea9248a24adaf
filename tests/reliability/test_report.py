"""The figures table ``make reliability`` prints fails on any anomaly or uncaught control."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import reliability

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


def test_a_split_run_prints_each_part_and_the_sums(tmp_path: Path) -> None:
    """Parts of a split long run are told apart, then added up per family."""
    path = _figures(
        tmp_path / "s.jsonl",
        {"family": "a", "split": "1/2", "trials": 5, "seconds": 2.0},
        {"family": "a", "split": "2/2", "trials": 6, "control_caught": None},
        {"family": "b", "split": "1/1"},
    )
    result = _report(path)
    assert result.returncode == 0, result.stderr
    assert "| a (part 1/2) | 5 | 0 | yes | 2.0 |  |" in result.stdout
    assert "| a (part 2/2) | 6 | 0 | n/a | 1.0 |  |" in result.stdout
    assert "| a | 2 | 11 | 0 | yes |" in result.stdout
    assert "| b | 1 | 10 | 0 | yes |" in result.stdout


def test_a_part_with_an_anomaly_fails_the_sum(tmp_path: Path) -> None:
    """One bad part fails the whole table and shows in its family's sum."""
    path = _figures(
        tmp_path / "s.jsonl",
        {"family": "a", "split": "1/2"},
        {"family": "a", "split": "2/2", "anomalies": 2, "control_caught": False},
    )
    result = _report(path)
    assert result.returncode == 1
    assert "| a | 2 | 20 | 2 | NO |" in result.stdout


def test_a_split_long_run_shares_out_the_trials_on_distinct_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each part runs its share of a long family's trials from seeds no other part uses."""
    monkeypatch.setenv("RELIABILITY_PROFILE", "long")
    monkeypatch.setenv("RELIABILITY_SEED", "1000")
    bases = set()
    for part in range(1, 5):
        monkeypatch.setenv("RELIABILITY_SPLIT", f"{part}/4")
        assert reliability.size(10, 100_001) == 25_001
        bases.add(reliability.seed_base())
    assert len(bases) == 4
    assert min(bases) == 1000
    monkeypatch.delenv("RELIABILITY_SPLIT")
    assert reliability.size(10, 100_001) == 100_001


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b"])
def test_a_malformed_split_is_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """A split that names no part of a whole would silently run the wrong trials."""
    monkeypatch.setenv("RELIABILITY_PROFILE", "long")
    monkeypatch.setenv("RELIABILITY_SPLIT", text)
    with pytest.raises(ValueError, match="RELIABILITY_SPLIT"):
        reliability.size(10, 100)


def test_a_split_of_a_ci_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI size is never split: a part of it would pass with a fraction of its trials."""
    monkeypatch.setenv("RELIABILITY_PROFILE", "ci")
    monkeypatch.setenv("RELIABILITY_SPLIT", "1/2")
    with pytest.raises(ValueError, match="long run"):
        reliability.size(10, 100)
