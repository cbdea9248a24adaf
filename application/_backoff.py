"""How a unit of work that lost a compare-and-swap race is re-run, and when it gives up.

Re-running at once lets the same writers collide again, and a small fixed
number of tries gives up under ordinary contention: eight processes
incrementing one SQLite record saw hundreds of updates run out of eight
tries. A random pause that grows with each lost race spreads the writers
out (full jitter), and a bound on the total time spent, rather than on the
number of tries, lets an update that keeps losing wait its turn while
still failing closed when the record never settles.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, TypeVar

from flowvault.application import _observability as observe
from flowvault.domain import InvalidInput, RevisionConflict

_Result = TypeVar("_Result")

FIRST_PAUSE: Final = 0.0005
"""Seconds: the longest pause after the first lost race; it doubles with each one after."""
LONGEST_PAUSE: Final = 0.05
"""Seconds: no single pause is longer, so a writer that loses often still retries soon."""
TIME_BUDGET: Final = 30.0
"""Seconds from the first try after which a race that keeps being lost is given up."""

_MOST_DOUBLINGS = 64
"""Past this many the ceiling is long reached; a float cannot hold 2**1024."""


def _jitter(low: float, high: float) -> float:
    return random.uniform(low, high)  # noqa: S311 - spreading writers out, not a secret


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a lost race is re-run: after a jittered pause, until a time budget or try cap is spent.

    After the ``n``-th lost race the writer sleeps a random time up to
    ``min(longest_pause, first_pause * 2 ** (n - 1))``, then tries again,
    unless ``time_budget`` seconds have passed since its first try or it
    has already re-run ``max_retries`` times (``None``: no cap on the count).
    ``sleep``, ``monotonic`` and ``jitter`` are injectable so tests control
    time and chance.
    """

    time_budget: float = TIME_BUDGET
    first_pause: float = FIRST_PAUSE
    longest_pause: float = LONGEST_PAUSE
    max_retries: int | None = None
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    monotonic: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    jitter: Callable[[float, float], float] = field(default=_jitter, repr=False, compare=False)

    def __post_init__(self) -> None:
        timings = (self.time_budget, self.first_pause, self.longest_pause)
        if not all(isinstance(value, int | float) and value >= 0 for value in timings):
            raise InvalidInput("a retry policy's budget and pauses are seconds, 0 or more")
        if self.max_retries is not None and (
            type(self.max_retries) is not int or self.max_retries < 0
        ):
            raise InvalidInput("max_retries is a whole number, 0 or more, or None for no cap")

    def pause(self, lost: int) -> float:
        """Return the random pause after the ``lost``-th lost race (1 for the first)."""
        doublings = min(max(0, lost - 1), _MOST_DOUBLINGS)
        ceiling = min(self.longest_pause, self.first_pause * 2**doublings)
        return self.jitter(0, ceiling)

    def start(self) -> Retries:
        """Begin counting the lost races of one unit of work."""
        return Retries(self, self.monotonic())


@dataclass(slots=True)
class Retries:
    """The lost races of one unit of work so far, under its policy."""

    policy: RetryPolicy
    started: float
    lost: int = 0

    def after_lost_race(self, what: str, **details: str | int) -> None:
        """Pause before the next try, or raise ``RevisionConflict`` once the policy is spent.

        ``what`` names the thing that kept changing in the message; the
        details name it for a program, with the tries and seconds spent.
        """
        self.lost += 1
        policy = self.policy
        spent = policy.monotonic() - self.started
        capped = policy.max_retries is not None and self.lost > policy.max_retries
        if capped or spent >= policy.time_budget:
            observe.retries_exhausted(what, self.lost, spent)
            raise RevisionConflict(
                f"{what} kept changing; gave up after {self.lost} tries in {spent:.1f} s",
                tries=self.lost,
                milliseconds=int(spent * 1000),
                **details,
            )
        pause = min(policy.pause(self.lost), policy.time_budget - spent)
        observe.unit_retried(what, self.lost, pause)
        policy.sleep(pause)


DEFAULT_RETRY: Final = RetryPolicy()


class Lost(Enum):
    """The outcome of an attempt whose unit lost a race and must be rebuilt from a fresh read."""

    RACE = "race"


LOST: Final = Lost.RACE


def settle(
    attempt: Callable[[], _Result | Lost],
    what: str,
    *,
    policy: RetryPolicy = DEFAULT_RETRY,
    **details: str | int,
) -> _Result:
    """Run ``attempt`` until it returns a result rather than ``LOST``, under ``policy``.

    Each service builds a unit of work from what it read, commits it, and
    returns ``LOST`` when another writer moved what it read first; the
    rebuild reads again. Every service re-runs lost units this one way, so
    how long a writer keeps trying is one decision, not one per call site.
    """
    retries = policy.start()
    while True:
        outcome = attempt()
        if not isinstance(outcome, Lost):
            return outcome
        retries.after_lost_race(what, **details)


def ledger_head_moved(conflict: RevisionConflict) -> bool:
    """Return whether only a stream's ledger head moved, so rebuilding the unit may succeed."""
    return conflict.details.get("guard") == "append"
