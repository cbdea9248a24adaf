"""Negative controls for the kit's base rules: guards, atomicity, listing, ledger, capabilities.

Each control is the in-memory reference adapter with one defect in a rule
the kit enforced before the later classes were added; the kit tests named
beside it must fail on it and pass on the sound adapter, on every run.
"""

from __future__ import annotations

import builtins
import dataclasses
from typing import Any

import pytest
from kit_controls import ListCall, ListDefect, StoreFactory, kit_failure

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    Delete,
    Guard,
    LedgerPage,
    LedgerTrim,
    Order,
    RecordPage,
    StoredRecord,
    UnitOfWork,
    Upsert,
)
from flowvault.domain import InvalidInput, LedgerEvent


def _without(unit: UnitOfWork, keep: Any) -> UnitOfWork:
    return dataclasses.replace(unit, upserts=tuple(u for u in unit.upserts if keep(u)))


class AbsentGuardIgnored(InMemorySecureObjectStore):
    """A must-be-absent create overwrites a record that exists."""

    def _check(self, unit: UnitOfWork) -> list[tuple[str, str]]:
        return super()._check(_without(unit, lambda u: u.expected is not Guard.ABSENT))


class ExactGuardIgnored(InMemorySecureObjectStore):
    """An upsert expecting a revision lands whatever revision is stored."""

    def _check(self, unit: UnitOfWork) -> list[tuple[str, str]]:
        return super()._check(_without(unit, lambda u: not isinstance(u.expected, int)))


class AnyGuardGoesBack(InMemorySecureObjectStore):
    """``Guard.ANY`` writes even when it would not move the revision forward."""

    def _check(self, unit: UnitOfWork) -> list[tuple[str, str]]:
        return super()._check(_without(unit, lambda u: u.expected is not Guard.ANY))


class ResealIgnoresDigest(InMemorySecureObjectStore):
    """A re-seal checks the revision but not the payload digest it replaces."""

    def _check(self, unit: UnitOfWork) -> list[tuple[str, str]]:
        def revision_holds(upsert: Upsert) -> bool:
            stored = self._records.get((upsert.header.namespace, upsert.header.key_digest))
            return stored is not None and stored.metadata.revision == upsert.expected

        return super()._check(_without(unit, lambda u: u.replaces is None or not revision_holds(u)))


class DeleteIgnoresGuard(InMemorySecureObjectStore):
    """A delete removes whatever is stored, and an exact delete of nothing passes."""

    def _check_delete(self, delete: Delete) -> tuple[str, str] | None:
        key = (delete.namespace, delete.key_digest)
        return key if key in self._records else None


def _stored(upsert: Upsert, **header: object) -> StoredRecord:
    metadata = upsert.metadata
    changed = dataclasses.replace(metadata, header=metadata.header.model_copy(update=header))
    return StoredRecord(metadata=changed, payload=upsert.payload)


class DropsLedgerIndex(InMemorySecureObjectStore):
    """Keeps every header but its ``ledger_index``."""

    def _apply_upsert(self, upsert: Upsert) -> None:
        key = (upsert.header.namespace, upsert.header.key_digest)
        self._records[key] = _stored(upsert, ledger_index=None)


class DropsLabels(InMemorySecureObjectStore):
    """Keeps a record's header and payload but not its labels."""

    def _apply_upsert(self, upsert: Upsert) -> None:
        key = (upsert.header.namespace, upsert.header.key_digest)
        metadata = dataclasses.replace(upsert.metadata, labels={})
        self._records[key] = StoredRecord(metadata=metadata, payload=upsert.payload)


class UpsertsApartFromTheUnit(InMemorySecureObjectStore):
    """Commits a unit's upserts one by one before the rest, so a later failure keeps them."""

    def commit(self, unit: UnitOfWork) -> None:
        for upsert in unit.upserts:
            super().commit(UnitOfWork(upserts=[upsert]))
        super().commit(dataclasses.replace(unit, upserts=()))


class TrimsApartFromTheUnit(InMemorySecureObjectStore):
    """Commits a unit's trims first, so a unit that fails has trimmed already."""

    def commit(self, unit: UnitOfWork) -> None:
        if unit.trims:
            super().commit(UnitOfWork(trims=unit.trims))
        super().commit(dataclasses.replace(unit, trims=()))


class KeyOrderReversed(ListDefect):
    """Returns each page of the key order backwards."""

    def listed(self, call: ListCall) -> RecordPage:
        page = self.sound(call)
        if call.order is not Order.KEY:
            return page
        return RecordPage(items=tuple(reversed(page.items)), next_cursor=page.next_cursor)


class FiltersIgnored(ListDefect):
    """Lists every record of the namespace, whatever the label filters."""

    def listed(self, call: ListCall) -> RecordPage:
        return self.sound(dataclasses.replace(call, filters=()))


class ListUncapped(ListDefect):
    """Returns as many records as asked for, past the 200 cap."""

    def listed(self, call: ListCall) -> RecordPage:
        page = self.sound(call)
        items = list(page.items)
        while len(items) < call.limit and page.next_cursor is not None:
            page = self.sound(dataclasses.replace(call, cursor=page.next_cursor, limit=200))
            items += page.items
        return RecordPage(items=tuple(items[: call.limit]), next_cursor=page.next_cursor)


class BadCursorStartsOver(ListDefect):
    """Takes a cursor it cannot read as no cursor, and a limit below one as the default."""

    def listed(self, call: ListCall) -> RecordPage:
        call = dataclasses.replace(call, limit=max(call.limit, 1))
        try:
            return self.sound(call)
        except InvalidInput:
            return self.sound(dataclasses.replace(call, cursor=None))


class NamespacesMixedInLists(ListDefect):
    """Lists the records of every namespace, not only the one asked for."""

    def listed(self, call: ListCall) -> RecordPage:
        spaces = sorted({space for space, _ in self._records} | {call.namespace})
        items = [
            item
            for space in spaces
            for item in self.sound(dataclasses.replace(call, namespace=space, cursor=None)).items
        ]
        return RecordPage(items=tuple(items[: call.limit]), next_cursor=None)


class NamesNotChecked(InMemorySecureObjectStore):
    """Answers a namespace or key digest that is not text as if nothing were stored."""

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        if not isinstance(namespace, str) or not isinstance(key_digest, str):
            return None
        return super().load(namespace, key_digest)


class DropsChainMac(InMemorySecureObjectStore):
    """Stores every field of an event but its ``chain_mac``."""

    def _apply_append(self, event: LedgerEvent) -> None:
        super()._apply_append(event.model_copy(update={"chain_mac": None}))


class AppendsUnchecked(InMemorySecureObjectStore):
    """Appends any event, whatever the stream's head: streams can fork and skip."""

    def _check(self, unit: UnitOfWork) -> list[tuple[str, str]]:
        return super()._check(dataclasses.replace(unit, appends=()))


class TrimTakesTheHead(InMemorySecureObjectStore):
    """Trims up to ``before_index`` even when that removes the stream's head."""

    def _apply_trim(self, trim: LedgerTrim) -> None:
        stream = self._streams.get(trim.stream)
        if stream is None:
            return
        cut = max(0, trim.before_index - stream.first_index)
        stream.events = stream.events[cut:]
        stream.first_index += min(cut, trim.before_index)


class NoGapFlag(InMemorySecureObjectStore):
    """Never says that events before the first retained one were trimmed."""

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        page = super().read_ledger(stream, from_index=from_index, limit=limit)
        return dataclasses.replace(page, gap=False)


class NoNextIndex(InMemorySecureObjectStore):
    """Returns one page of events and never says where the next begins."""

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        page = super().read_ledger(stream, from_index=from_index, limit=limit)
        return dataclasses.replace(page, next_index=None)


class NegativeIndexReadsFromZero(InMemorySecureObjectStore):
    """Reads a negative ``from_index`` as 0."""

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        return super().read_ledger(stream, from_index=max(from_index, 0), limit=limit)


class HeadIndexCounts(InMemorySecureObjectStore):
    """Answers the head index as the number of retained events."""

    def ledger_head_index(self, stream: str) -> int | None:
        found = self._streams.get(stream)
        return None if found is None or not found.events else len(found.events)


class EventsAreNotData(InMemorySecureObjectStore):
    """Counts records only, so a store holding only ledger events looks empty."""

    def has_records(self) -> bool:
        return bool(self._records)


class WorksAfterClose(InMemorySecureObjectStore):
    """``close()`` does nothing: the store keeps answering."""

    def close(self) -> None:
        return None


class EpochOnlyForRecords(InMemorySecureObjectStore):
    """Counts units that write records; a unit that only appends or trims is not counted."""

    def commit(self, unit: UnitOfWork) -> None:
        before = self._epoch
        super().commit(unit)
        if not (unit.upserts or unit.deletes):
            self._epoch = before


class CatalogForgetsTrimmed(InMemorySecureObjectStore):
    """Leaves out of the stream catalog every stream that has been trimmed."""

    def list_streams(self, *, after: str | None = None, limit: int = 200) -> builtins.list[str]:
        names = super().list_streams(after=after, limit=limit)
        return [name for name in names if self._streams[name].first_index == 0]


class CatalogInInsertionOrder(InMemorySecureObjectStore):
    """Lists streams in the order they were first written, not by code point."""

    def list_streams(self, *, after: str | None = None, limit: int = 200) -> builtins.list[str]:
        listed = set(super().list_streams(after=after, limit=limit))
        return [name for name in self._streams if name in listed]


class CatalogUncapped(InMemorySecureObjectStore):
    """Lists as many streams as asked for, past the 200 cap."""

    def list_streams(self, *, after: str | None = None, limit: int = 200) -> builtins.list[str]:
        names = sorted(name for name, found in self._streams.items() if found.events)
        return [name for name in names if after is None or name > after][: max(limit, 1)]


class SealCountsNotAdded(InMemorySecureObjectStore):
    """Keeps the last reservation per key id instead of the running total."""

    def reserve_seals(self, key_id: str, count: int) -> int:
        super().reserve_seals(key_id, count)
        self._seals[key_id] = count
        return count


CONTROLS: builtins.list[Any] = [
    pytest.param(AbsentGuardIgnored, [("test_create_of_existing_record_conflicts", {})]),
    pytest.param(
        ExactGuardIgnored,
        [
            ("test_stale_guard_conflicts_and_leaves_record_unchanged", {}),
            ("test_exact_guard_on_absent_record_conflicts", {}),
        ],
    ),
    pytest.param(AnyGuardGoesBack, [("test_any_guard_writes_forward_only", {})]),
    pytest.param(ResealIgnoresDigest, [("test_reseal_never_lands_on_a_recreated_row", {})]),
    pytest.param(
        DeleteIgnoresGuard,
        [
            ("test_stale_delete_conflicts_and_keeps_record", {}),
            ("test_delete_of_absent_record", {}),
        ],
    ),
    pytest.param(
        DropsLedgerIndex,
        [("test_ledger_index_reads_back_from_every_read", {"ledger_index": 2**40})],
    ),
    pytest.param(DropsLabels, [("test_create_round_trips_header_payload_and_labels", {})]),
    pytest.param(
        UpsertsApartFromTheUnit,
        [
            ("test_one_failing_guard_applies_nothing", {"failing": failing})
            for failing in ("delete", "append", "second_append")
        ],
    ),
    pytest.param(TrimsApartFromTheUnit, [("test_failed_unit_does_not_trim", {})]),
    pytest.param(KeyOrderReversed, [("test_list_orders_by_key_digest", {})]),
    pytest.param(FiltersIgnored, [("test_list_filters_on_labels", {})]),
    pytest.param(ListUncapped, [("test_limit_is_capped", {})]),
    pytest.param(BadCursorStartsOver, [("test_bad_list_arguments_are_invalid_input", {})]),
    pytest.param(NamespacesMixedInLists, [("test_namespaces_are_isolated_and_unicode", {})]),
    pytest.param(
        NamesNotChecked,
        [("test_names_that_are_not_text_are_invalid_input", {"name": name}) for name in (7, None)],
    ),
    pytest.param(DropsChainMac, [("test_chain_mac_reads_back_set_and_unset", {})]),
    pytest.param(
        AppendsUnchecked,
        [
            ("test_stale_previous_hash_is_rejected", {}),
            ("test_append_must_follow_the_head_index", {}),
            ("test_two_writers_on_one_head_do_not_fork", {}),
        ],
    ),
    pytest.param(TrimTakesTheHead, [("test_trim_keeps_head_and_flags_gap", {})]),
    pytest.param(NoGapFlag, [("test_trim_keeps_head_and_flags_gap", {})]),
    pytest.param(NoNextIndex, [("test_ledger_pages_with_next_index", {})]),
    pytest.param(NegativeIndexReadsFromZero, [("test_ledger_read_rejects_negative_index", {})]),
    pytest.param(HeadIndexCounts, [("test_head_index_is_the_head_events_index", {})]),
    pytest.param(EventsAreNotData, [("test_ledger_events_alone_count_as_data", {})]),
    pytest.param(WorksAfterClose, [("test_closed_store_refuses_work", {})]),
    pytest.param(EpochOnlyForRecords, [("test_every_non_empty_commit_raises_the_epoch", {})]),
    pytest.param(CatalogForgetsTrimmed, [("test_trimmed_stream_is_still_listed", {})]),
    pytest.param(CatalogInInsertionOrder, [("test_streams_list_in_code_point_order", {})]),
    pytest.param(CatalogUncapped, [("test_limit_is_capped_and_must_be_positive", {})]),
    pytest.param(SealCountsNotAdded, [("test_reservations_return_running_totals_per_key", {})]),
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
        factory = param.values[0]
        assert kit_failure(factory, "test_empty_stream") is None, factory
