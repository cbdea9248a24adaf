"""Sizes and figures shared by the reliability families in ``tests/reliability``.

Every family runs at CI size inside ``make test``; ``make reliability``
sets ``RELIABILITY_PROFILE=long`` for the long runs. Each family records
one figure per harness (trials, anomalies, whether its negative control
was caught); with ``RELIABILITY_REPORT`` set, figures are appended to that
file as JSON lines and ``tests/reliability/report.py`` prints them as a table.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

PROFILE_ENV: Final = "RELIABILITY_PROFILE"
REPORT_ENV: Final = "RELIABILITY_REPORT"
PROFILES: Final = ("ci", "long")
SPLIT_ENV: Final = "RELIABILITY_SPLIT"
SPLIT_SEED_STRIDE: Final = 1_000_003
"""How far apart the seed bases of a split's parts lie, so no two parts replay the same trials."""


def profile() -> str:
    """Return ``ci`` (the default) or ``long``; refuse anything else."""
    name = os.environ.get(PROFILE_ENV, "ci")
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_ENV} must be one of {PROFILES}, not {name!r}")
    return name


def is_long() -> bool:
    """Whether this is a long run (``make reliability``)."""
    return profile() == "long"


def split() -> tuple[int, int]:
    """Return ``(k, n)`` from ``RELIABILITY_SPLIT=k/n`` (a long run's k-th of n parts); ``(1, 1)``.

    A long family of hours can then run as ``n`` shorter processes, on
    several cores or on different days: each runs ``1/n`` of the trials
    from its own seeds, and the parts' figures add up to the whole run.
    """
    text = os.environ.get(SPLIT_ENV, "").strip()
    if not text:
        return 1, 1
    match = re.fullmatch(r"([1-9][0-9]*)/([1-9][0-9]*)", text)
    if match is None or int(match[1]) > int(match[2]):
        raise ValueError(f"{SPLIT_ENV} must be k/n with 1 <= k <= n, not {text!r}")
    if not is_long():
        raise ValueError(f"{SPLIT_ENV} splits a long run; set {PROFILE_ENV}=long")
    return int(match[1]), int(match[2])


def size(ci: int, long: int) -> int:
    """Return the trial count for this profile (this part's share of a split long run)."""
    _, parts = split()
    return math.ceil(long / parts) if is_long() else ci


def seed_base() -> int:
    """Return the first seed; ``RELIABILITY_SEED`` replays a reported run (with its split)."""
    part, _ = split()
    return int(os.environ.get("RELIABILITY_SEED", "20261129")) + (part - 1) * SPLIT_SEED_STRIDE


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
        part, parts = split()
        fields = {**asdict(figure), "profile": profile(), "split": f"{part}/{parts}"}
        line = json.dumps(fields, sort_keys=True)
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
