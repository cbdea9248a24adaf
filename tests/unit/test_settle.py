"""The one way services re-run a unit of work that lost a race."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from flowvault.application._backoff import LOST, RetryPolicy, ledger_head_moved, settle
from flowvault.application._instants import aware, from_micros, micros
from flowvault.application._natural_keys import joined
from flowvault.domain import InvalidInput, RevisionConflict


def _policy(**fields: object) -> RetryPolicy:
    return RetryPolicy(sleep=lambda _: None, jitter=lambda low, high: high, **fields)  # type: ignore[arg-type]


def test_settle_returns_the_first_result_that_is_not_lost() -> None:
    """An attempt that loses twice then commits is run three times and its result returned."""
    outcomes = iter([LOST, LOST, "done"])
    calls: list[int] = []

    def attempt() -> str | object:
        calls.append(1)
        return next(outcomes)

    assert settle(attempt, "the thing", policy=_policy()) == "done"  # type: ignore[arg-type]
    assert len(calls) == 3


def test_settle_gives_up_with_revision_conflict_once_the_policy_is_spent() -> None:
    """An attempt that always loses raises RevisionConflict naming what kept changing."""
    with pytest.raises(RevisionConflict) as caught:
        settle(lambda: LOST, "run ledger", policy=_policy(max_retries=3), run_id="r1")
    assert "run ledger kept changing" in str(caught.value)
    assert caught.value.details["tries"] == 4
    assert caught.value.details["run_id"] == "r1"


def test_ledger_head_moved_tells_an_append_race_from_a_record_race() -> None:
    """Only a conflict on the append guard is a moved ledger head."""
    assert ledger_head_moved(RevisionConflict("moved", guard="append"))
    assert not ledger_head_moved(RevisionConflict("stale", guard="record"))


def test_micros_round_trips_and_aware_refuses_naive_times() -> None:
    """Labels hold whole microseconds; a naive datetime is refused by name."""
    moment = datetime(2026, 12, 3, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert from_micros(micros(moment)) == moment.astimezone(UTC)
    assert aware(moment, "now") is moment
    with pytest.raises(InvalidInput, match="now must be a timezone-aware datetime"):
        aware(datetime(2026, 12, 3), "now")


def test_joined_keeps_parts_apart() -> None:
    """Parts are joined with a separator no accepted id contains."""
    assert joined("a", "b") != joined("ab", "")
    assert joined("a", "b").split("\x1f") == ["a", "b"]
