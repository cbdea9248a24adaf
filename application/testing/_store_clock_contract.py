"""The ``StoreClock`` contract: the server's time, timezone-aware UTC, read afresh on every call.

Run leases are set and judged by it. An adapter that returned a naive or
local time, a cached value, or the start time of a transaction it keeps
open (PostgreSQL's ``now()``) would let leases expire late or never; the
tests below catch each. Mix ``StoreClockContract`` into a store's contract
test class; it reuses the ``make_store`` hook.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from flowvault.application import SecureObjectStore, StoreClock, UnitOfWork
from flowvault.application.testing._fakes import make_event, make_upsert
from flowvault.application.testing._store_contract import StoreHarness

PAUSE = 0.2
"""Seconds slept between two readings; long beside a round trip, short for a test."""
SLACK = 1.0
"""Seconds two readings may differ from the host's elapsed time by (scheduling, round trips)."""


def _clock(store: SecureObjectStore) -> StoreClock:
    assert isinstance(store, StoreClock)
    return store


class StoreClockContract(StoreHarness):
    """What every ``StoreClock`` adapter must do."""

    def test_satisfies_the_store_clock_protocol(self, store: SecureObjectStore) -> None:
        """The adapter is recognised as a ``StoreClock`` at runtime."""
        assert isinstance(store, StoreClock)

    def test_the_time_is_timezone_aware_utc(self, store: SecureObjectStore) -> None:
        """A naive or local time would be compared wrongly with the leases already stored."""
        now = _clock(store).store_now()
        assert isinstance(now, datetime)
        assert now.tzinfo is not None
        assert now.utcoffset() == timedelta(0)

    def test_each_reading_is_fresh_and_keeps_pace_with_real_time(
        self, store: SecureObjectStore
    ) -> None:
        """Two readings apart by a pause differ by about the pause, also across a commit."""
        clock = _clock(store)
        first, started = clock.store_now(), time.monotonic()
        store.commit(
            UnitOfWork(
                upserts=[make_upsert("contract", "clock", b"sealed")],
                appends=[make_event("s/clock", 0)],
            )
        )
        time.sleep(PAUSE)
        second, elapsed = clock.store_now(), time.monotonic() - started
        moved = (second - first).total_seconds()
        assert moved >= PAUSE * 0.8, f"the store's clock moved {moved:.3f} s in {elapsed:.3f} s"
        assert abs(moved - elapsed) < SLACK

    def test_readings_never_go_backwards(self, store: SecureObjectStore) -> None:
        """Successive readings are in order, so a renewed lease never ends before the old one."""
        clock = _clock(store)
        readings = [clock.store_now() for _ in range(50)]
        assert readings == sorted(readings)
