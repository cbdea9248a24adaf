"""Running the installed ``flowvault`` console script as a real subprocess, for the CLI tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FLOWVAULT = Path(sys.executable).parent / "flowvault"
"""The console script installed beside the interpreter running the tests."""
TIMEOUT = 60.0


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Return the environment without the caller's ``FLOWVAULT_*`` settings, plus ``extra``.

    The per-user data directory points into ``tmp_path`` so no test can
    touch a real home.
    """
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLOWVAULT_")}
    environ["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    environ.update(extra)
    return environ


def run_cli(
    tmp_path: Path, *args: str, home: Path | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run ``flowvault [--home HOME] ARGS`` without a terminal and return what it did."""
    prefix = [] if home is None else ["--home", str(home)]
    return subprocess.run(
        [str(FLOWVAULT), *prefix, *args],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path, **extra),
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT,
        check=False,
    )


def json_document(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """Return the single JSON object a ``--json`` run printed on stdout."""
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout + result.stderr
    parsed = json.loads(lines[0])
    assert isinstance(parsed, dict)
    return parsed
