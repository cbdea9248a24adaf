"""A real LangGraph graph on flowvault: paused at ``interrupt()``, SIGKILLed, resumed elsewhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parents[1] / "support" / "refund_graph.py"


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "FLOWVAULT_HOME": str(home), "FLOWVAULT_LOG_LEVEL": "warning"}


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_graph_killed_at_its_interrupt_resumes_in_a_new_process(
    tmp_path: Path, decision: str
) -> None:
    """The worker stops at the interrupt and is killed; a new process resumes the thread."""
    home = tmp_path / "home"
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), "start"],
        env=_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "paused", worker.stderr
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    resumed = subprocess.run(
        [sys.executable, str(WORKER), "resume", decision],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    state = json.loads(resumed.stdout)
    assert state == {
        "order": "1042",
        "plan": "refund order 1042 in full",
        "approved": decision == "approve",
        "result": "refunded" if decision == "approve" else "declined",
    }
