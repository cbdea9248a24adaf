"""Start worker processes together, so their work overlaps even on a small machine."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Finished:
    """What one worker left behind."""

    returncode: int
    stdout: str
    stderr: str


def run_together(
    commands: Sequence[Sequence[str]], go: Path, *, timeout: float = 300
) -> list[Finished]:
    """Start every command, wait until each prints ``ready``, then create ``go`` and collect them.

    Each worker must print ``ready`` once set up and then wait for ``go`` to
    exist; without that barrier, process start-up on two cores serialises
    workers that are meant to race.
    """
    workers = [
        subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for command in commands
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            ready = worker.stdout.readline().strip()
            assert ready == "ready", worker.communicate(timeout=60)[1]
        go.touch()
        results = [worker.communicate(timeout=timeout) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return [
        Finished(worker.returncode, out, err)
        for worker, (out, err) in zip(workers, results, strict=True)
    ]
