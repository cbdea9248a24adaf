"""``RELIABILITY_SHARD=k/n`` splits the reliability tests into disjoint parts covering them all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests/reliability/test_hostile_cli.py"


def _collect(shard: str | None) -> subprocess.CompletedProcess[str]:
    """Run pytest's collection of ``TARGET`` under ``RELIABILITY_SHARD=shard`` (unset if None)."""
    env = {name: value for name, value in os.environ.items() if name != "RELIABILITY_SHARD"}
    if shard is not None:
        env["RELIABILITY_SHARD"] = shard
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", TARGET],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _collected(shard: str | None) -> list[str]:
    completed = _collect(shard)
    assert completed.returncode in (0, 5), completed.stdout + completed.stderr
    return [line for line in completed.stdout.splitlines() if "::" in line]


def test_shards_are_disjoint_and_cover_every_test() -> None:
    """Two shards of one module hold every test exactly once; a bad shard is a usage error."""
    everything = _collected(None)
    first, second = _collected("1/2"), _collected("2/2")
    assert len(everything) >= 2
    assert first
    assert second
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(everything)
    refused = _collect("3/2")
    assert refused.returncode != 0
    assert "RELIABILITY_SHARD must be k/n" in refused.stdout + refused.stderr
