"""Sizes and figures shared by the reliability families in ``tests/reliability``.

Every family runs at CI size inside ``make test``; ``make reliability``
sets ``RELIABILITY_PROFILE=long`` for the long runs. Each family records
one figure per harness (trials, anomalies, whether its negative control
was caught); with ``RELIABILITY_REPORT`` set, figures are appended to that
file as JSON lines and ``tests/reliability/report.py`` prints them as a table.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

PROFILE_ENV: Final = "RELIABILITY_PROFILE"
REPORT_ENV: Final = "RELIABILITY_REPORT"
PROFILES: Final = ("ci", "long")


def profile() -> str:
    """Return ``ci`` (the default) or ``long``; refuse anything else."""
    name = os.environ.get(PROFILE_ENV, "ci")
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_ENV} must be one of {PROFILES}, not {name!r}")
    return name


def is_long() -> bool:
    """Whether this is a long run (``make reliability``)."""
    return profile() == "long"


def size(ci: int, long: int) -> int:
    """Return the trial count for this profile."""
    return long if is_long() else ci


def seed_base() -> int:
    """Return the first seed; ``RELIABILITY_SEED`` replays a reported run."""
    return int(os.environ.get("RELIABILITY_SEED", "20261129"))


@dataclass(frozen=True, slots=True)
class Figure:
    """One harness's outcome, as the report table shows it."""

    family: str
    trials: int
    anomalies: int
    control_caught: bool | None
    """``True``/``False`` for a harness with a negative control; ``None`` when it has none."""
    detail: str = ""
    seconds: float = 0.0


def record(figure: Figure) -> Figure:
    """Append ``figure`` to the report file, when one is named, and return it."""
    target = os.environ.get(REPORT_ENV)
    if target:
        line = json.dumps({**asdict(figure), "profile": profile()}, sort_keys=True)
        with Path(target).open("a", encoding="utf-8") as report:
            report.write(line + "\n")
    return figure


class Stopwatch:
    """Seconds since creation, for the ``seconds`` column of a figure."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    @property
    def seconds(self) -> float:
        """Elapsed seconds, rounded to a tenth."""
        return round(time.monotonic() - self._start, 1)
