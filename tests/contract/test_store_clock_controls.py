"""Negative controls for ``StoreClockContract``: each clock defect a real adapter could have fails.

The sound control is the in-memory adapter with a ``store_now`` that reads
the host's clock; each defective one changes only that reading. The kit's
tests are called directly, as plain methods.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import StoreClock
from flowvault.application.testing import StoreClockContract

Reading = Callable[[], datetime]


class ClockedStore(InMemorySecureObjectStore):
    """The memory adapter with a ``store_now`` taken from ``reading``."""

    def __init__(self, reading: Reading) -> None:
        super().__init__()
        self._reading = reading

    def store_now(self) -> datetime:
        """Return what the reading says."""
        return self._reading()


def _cached() -> Reading:
    first = datetime.now(UTC)
    return lambda: first


def _slowed() -> Reading:
    start = datetime.now(UTC)
    return lambda: start + (datetime.now(UTC) - start) / 1000


def _jittered() -> Reading:
    steps = itertools.cycle((0, -1))
    return lambda: datetime.now(UTC) + timedelta(seconds=next(steps))


DEFECTS: dict[str, tuple[Callable[[], Reading], str]] = {
    "naive": (lambda: datetime.now, "test_the_time_is_timezone_aware_utc"),
    "local offset": (
        lambda: lambda: datetime.now(timezone(timedelta(hours=2))),
        "test_the_time_is_timezone_aware_utc",
    ),
    "cached, or a transaction's start": (
        _cached,
        "test_each_reading_is_fresh_and_keeps_pace_with_real_time",
    ),
    "a thousand times slow": (_slowed, "test_each_reading_is_fresh_and_keeps_pace_with_real_time"),
    "stepping back": (_jittered, "test_readings_never_go_backwards"),
}

KIT_TESTS = [name for name in dir(StoreClockContract) if name.startswith("test_")]


def _failure(reading: Reading, test: str) -> AssertionError | None:
    store = ClockedStore(reading)
    try:
        getattr(StoreClockContract, test)(None, store)
    except AssertionError as failure:
        return failure
    finally:
        store.close()
    return None


def test_the_sound_control_passes_every_clock_test() -> None:
    """The host's own UTC clock read afresh passes, so each failure below is its defect's."""
    assert isinstance(ClockedStore(lambda: datetime.now(UTC)), StoreClock)
    for test in KIT_TESTS:
        assert _failure(lambda: datetime.now(UTC), test) is None, test


@pytest.mark.parametrize("defect", DEFECTS)
def test_the_kit_fails_the_defect(defect: str) -> None:
    """The kit test aimed at the defect fails on it."""
    make, test = DEFECTS[defect]
    assert _failure(make(), test) is not None
