"""A pause between re-runs of a unit of work that lost a compare-and-swap race.

Re-running at once lets the same writers collide again: with eight
processes on one PostgreSQL record, over half of the updates used up their
retries that way. A random pause that grows with each lost race spreads
the writers out (full jitter), so most updates land within a few tries.
"""

from __future__ import annotations

import random
import time
from typing import Final

FIRST_PAUSE: Final = 0.0005
"""Seconds: the longest pause after the first lost race; it doubles with each one after."""
LONGEST_PAUSE: Final = 0.05
"""Seconds: no pause is longer, so a retried update stays well under a second."""


def pause_after_conflict(lost: int) -> None:
    """Sleep a random time up to ``FIRST_PAUSE * 2 ** (lost - 1)``, capped at ``LONGEST_PAUSE``."""
    ceiling = min(LONGEST_PAUSE, FIRST_PAUSE * 2 ** max(0, lost - 1))
    time.sleep(random.uniform(0, ceiling))  # noqa: S311 - spreading writers out, not a secret
