"""Negative controls for the kit's drop rules: the guard, atomicity, and what a drop removes.

Each control is the in-memory reference adapter with one defect in how it
drops a stream; the kit tests named beside it must fail on it and pass on
the sound adapter.
"""

from __future__ import annotations

import builtins
import dataclasses
from typing import Any

import pytest
from kit_controls import StoreFactory, kit_failure

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import LedgerDrop, LedgerTrim, UnitOfWork


class DropIgnoresGuard(InMemorySecureObjectStore):
    """Drops a stream whatever head the drop names."""

    def commit(self, unit: UnitOfWork) -> None:
        drops = [
            drop
            if (head := self.ledger_head(drop.stream)) is None
            else LedgerDrop(drop.stream, head.index)
            for drop in unit.drops
        ]
        super().commit(dataclasses.replace(unit, drops=drops))


class DropsApartFromTheUnit(InMemorySecureObjectStore):
    """Commits a unit's drops first, so a unit that fails has dropped already."""

    def commit(self, unit: UnitOfWork) -> None:
        if unit.drops:
            super().commit(UnitOfWork(drops=unit.drops))
        super().commit(dataclasses.replace(unit, drops=()))


class DropKeepsTheHead(InMemorySecureObjectStore):
    """Drops as a trim does: every event but the head goes."""

    def commit(self, unit: UnitOfWork) -> None:
        trims = [LedgerTrim(drop.stream, drop.head_index) for drop in unit.drops]
        super().commit(dataclasses.replace(unit, drops=(), trims=(*unit.trims, *trims)))


class CatalogKeepsDropped(InMemorySecureObjectStore):
    """Deletes a dropped stream's events but still lists its name."""

    def __init__(self) -> None:
        super().__init__()
        self._dropped: set[str] = set()

    def commit(self, unit: UnitOfWork) -> None:
        super().commit(unit)
        self._dropped |= {drop.stream for drop in unit.drops}

    def list_streams(self, *, after: str | None = None, limit: int = 200) -> builtins.list[str]:
        names = set(super().list_streams(after=after, limit=limit))
        names |= {name for name in self._dropped if after is None or name > after}
        return sorted(names)[:limit]


class EpochSkipsDrops(InMemorySecureObjectStore):
    """Does not count a unit that only drops."""

    def commit(self, unit: UnitOfWork) -> None:
        before = self._epoch
        super().commit(unit)
        if unit.drops and not (unit.upserts or unit.deletes or unit.appends or unit.trims):
            self._epoch = before


CONTROLS: builtins.list[Any] = [
    pytest.param(
        DropIgnoresGuard,
        [
            ("test_drop_must_name_the_current_head", {}),
            ("test_an_append_since_the_read_head_fails_the_drop", {}),
        ],
    ),
    pytest.param(
        DropsApartFromTheUnit, [("test_a_failing_guard_anywhere_in_the_unit_keeps_the_stream", {})]
    ),
    pytest.param(
        DropKeepsTheHead,
        [
            ("test_drop_removes_every_event_and_the_head", {}),
            ("test_a_dropped_stream_starts_again_at_index_zero", {}),
        ],
    ),
    pytest.param(CatalogKeepsDropped, [("test_drop_removes_every_event_and_the_head", {})]),
    pytest.param(EpochSkipsDrops, [("test_a_drop_counts_as_a_commit", {})]),
]


@pytest.mark.parametrize(
    ("defective", "tests"), CONTROLS, ids=[p.values[0].__name__ for p in CONTROLS]
)
def test_the_kit_fails_the_defect(
    defective: StoreFactory, tests: builtins.list[tuple[str, dict[str, object]]]
) -> None:
    """Every kit test aimed at the defect fails on it and passes on the sound adapter."""
    for test, params in tests:
        assert kit_failure(InMemorySecureObjectStore, test, **params) is None, test
        assert kit_failure(defective, test, **params) is not None, (test, params)


def test_every_control_is_sound_but_for_its_defect() -> None:
    """Each defective adapter passes a kit test its defect does not reach."""
    for param in CONTROLS:
        assert kit_failure(param.values[0], "test_empty_stream") is None, param.values[0]
