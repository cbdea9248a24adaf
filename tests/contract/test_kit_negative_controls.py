"""Negative controls: the contract kit fails every adapter carrying one known defect.

Each control is the in-memory reference adapter with one deliberate defect,
of a kind that passes a careless kit yet breaks real use. The relevant kit
tests are called directly on it, as plain methods, and must fail with an
assertion; the same tests pass on the unmodified adapter, so each failure is
the defect's. Every source of chance is seeded, so each verdict is the same
on every run.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import pytest
from kit_controls import (
    LabelCall,
    LabelListingDefect,
    ListCall,
    ListDefect,
    StoreFactory,
    kit_failure,
)

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    LabelCursor,
    LedgerPage,
    ListCursor,
    Order,
    RecordFilter,
    RecordMetadata,
    RecordPage,
    StoredRecord,
    TagFilter,
    UnitOfWork,
    Upsert,
    effective_limit,
)
from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.application.testing import (
    make_upsert,
)
from flowvault.application.testing._label_listing_contract import (
    FILTERS as LABEL_FILTERS,
)
from flowvault.application.testing._label_listing_contract import (
    TAG_FILTERS as LABEL_TAG_FILTERS,
)
from flowvault.application.testing._tags_contract import TAG_FILTERS
from flowvault.domain import StoreUnavailable

# -- the defective adapters ---------------------------------------------------


def _truncate(value: datetime, unit: str) -> datetime:
    if unit == "seconds":
        return value.replace(microsecond=0)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


class TruncatesTimes(InMemorySecureObjectStore):
    """Keeps ``written_at`` or ``occurred_at`` to whole seconds or milliseconds only."""

    def __init__(self, unit: str, field: str) -> None:
        super().__init__()
        self._unit = unit
        self._field = field

    def commit(self, unit: UnitOfWork) -> None:
        upserts = unit.upserts
        appends = unit.appends
        if self._field == "written_at":
            upserts = tuple(
                dataclasses.replace(
                    upsert,
                    header=upsert.header.model_copy(
                        update={"written_at": _truncate(upsert.header.written_at, self._unit)}
                    ),
                )
                for upsert in unit.upserts
            )
        else:
            appends = tuple(
                event.model_copy(update={"occurred_at": _truncate(event.occurred_at, self._unit)})
                for event in unit.appends
            )
        super().commit(dataclasses.replace(unit, upserts=upserts, appends=appends))


class TimeOnlyCursor(ListDefect):
    """Resumes after the cursor's time alone, so records tied with the last one are skipped."""

    def listed(self, call: ListCall) -> RecordPage:
        if call.cursor is not None and call.order is not Order.KEY:
            mark = ListCursor.decode(call.cursor, call.order)
            past_every_tie = "" if call.order is Order.WRITTEN_AT_DESC else "\U0010ffff"
            cursor = ListCursor(call.order, past_every_tie, mark.written_at).encode()
            call = dataclasses.replace(call, cursor=cursor)
        return self.sound(call)


class AscendingTiesUnderDesc(ListDefect):
    """Breaks ties under ``WRITTEN_AT_DESC`` by key digest ascending instead of descending."""

    def listed(self, call: ListCall) -> RecordPage:
        page = self.sound(call)
        if call.order is not Order.WRITTEN_AT_DESC:
            return page
        by_key = sorted(page.items, key=lambda meta: meta.key_digest)
        items = sorted(by_key, key=lambda meta: meta.header.written_at, reverse=True)
        return RecordPage(items=tuple(items), next_cursor=page.next_cursor)


class OffsetCursor(ListDefect):
    """Hands out cursors that count records from the start instead of naming a position."""

    def listed(self, call: ListCall) -> RecordPage:
        offset = (
            0 if call.cursor is None else int(ListCursor.decode(call.cursor, call.order).key_digest)
        )
        limit = effective_limit(call.limit)
        everything: list[Any] = []
        page = self.sound(dataclasses.replace(call, cursor=None, limit=MAX_LIST_LIMIT))
        everything.extend(page.items)
        while page.next_cursor is not None:
            page = self.sound(
                dataclasses.replace(call, cursor=page.next_cursor, limit=MAX_LIST_LIMIT)
            )
            everything.extend(page.items)
        items = tuple(everything[offset : offset + limit])
        more = offset + limit < len(everything)
        after = ListCursor(call.order, str(offset + limit), "").encode() if more else None
        return RecordPage(items=items, next_cursor=after)


def _label_rank(meta: RecordMetadata, label: str) -> tuple[int, Any]:
    value = meta.labels[label]
    return (1 if isinstance(value, str) else 0, value)


class AscendingLabelTiesUnderDesc(LabelListingDefect):
    """Under ``descending`` lists records tied on the label by key digest ascending."""

    def listed_by_label(self, call: LabelCall) -> RecordPage:
        page = self.sound_by_label(call)
        if not call.descending:
            return page
        by_key = sorted(page.items, key=lambda meta: meta.key_digest)
        items = sorted(by_key, key=lambda meta: _label_rank(meta, call.label), reverse=True)
        return RecordPage(items=tuple(items), next_cursor=page.next_cursor)


class FoldedLabelOrder(LabelListingDefect):
    """Orders text values case-insensitively, as a database collation other than "C" would."""

    def listed_by_label(self, call: LabelCall) -> RecordPage:
        page = self.sound_by_label(call)

        def folded(meta: RecordMetadata) -> tuple[int, Any, str]:
            kind, value = _label_rank(meta, call.label)
            return (kind, value.casefold() if kind else value, meta.key_digest)

        items = sorted(page.items, key=folded, reverse=call.descending)
        return RecordPage(items=tuple(items), next_cursor=page.next_cursor)


class OffsetLabelCursor(LabelListingDefect):
    """Hands out ``list_by_label`` cursors that count records from the start."""

    def listed_by_label(self, call: LabelCall) -> RecordPage:
        offset = 0
        if call.cursor is not None:
            mark = LabelCursor.decode(call.cursor, call.label, descending=call.descending)
            offset = int(mark.key_digest)
        everything: list[Any] = []
        cursor: str | None = None
        while True:
            page = self.sound_by_label(
                dataclasses.replace(call, cursor=cursor, limit=MAX_LIST_LIMIT)
            )
            everything.extend(page.items)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        limit = effective_limit(call.limit)
        items = tuple(everything[offset : offset + limit])
        more = offset + limit < len(everything)
        after = LabelCursor(call.label, call.descending, "", str(offset + limit))
        return RecordPage(items=items, next_cursor=after.encode() if more else None)


class UncappedLedger(InMemorySecureObjectStore):
    """Returns as many events as ``read_ledger`` is asked for, past the cap."""

    def read_ledger(self, stream: str, *, from_index: int = 0, limit: int = 100) -> LedgerPage:
        page = super().read_ledger(stream, from_index=from_index, limit=limit)
        events = list(page.events)
        while page.next_index is not None and len(events) < limit:
            page = super().read_ledger(
                stream, from_index=page.next_index, limit=min(limit - len(events), MAX_LIST_LIMIT)
            )
            events.extend(page.events)
        return LedgerPage(events=tuple(events), next_index=page.next_index, gap=False)


class _FoldedKeys(dict[Any, Any]):
    """A dictionary whose keys compare as a database collation would, folded first."""

    def __init__(self, fold: Callable[[str], str]) -> None:
        super().__init__()
        self._fold = fold

    def _key(self, key: Any) -> Any:
        if isinstance(key, tuple):
            return tuple(self._fold(part) for part in key)
        return self._fold(key)

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(self._key(key))

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(self._key(key), value)

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(self._key(key))

    def __contains__(self, key: object) -> bool:
        return super().__contains__(self._key(key))

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(self._key(key), default)

    def pop(self, key: Any, *default: Any) -> Any:
        return super().pop(self._key(key), *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return super().setdefault(self._key(key), default)


FOLDS: dict[str, Callable[[str], str]] = {
    "case": str.casefold,
    "trailing spaces": lambda name: name.rstrip(" "),
}


class FoldsNames(InMemorySecureObjectStore):
    """Compares namespaces and digests, or stream names, ignoring case or trailing spaces."""

    def __init__(self, fold: str, names: str) -> None:
        super().__init__()
        if names == "records":
            self._records = _FoldedKeys(FOLDS[fold])
        else:
            self._streams = _FoldedKeys(FOLDS[fold])


class RaisesOnSecondClose(InMemorySecureObjectStore):
    """Refuses a second ``close()`` as it refuses any other call on a closed store."""

    def close(self) -> None:
        if self._closed:
            raise StoreUnavailable("the store is closed")
        super().close()


class SometimesStaleLoad(InMemorySecureObjectStore):
    """``load`` (and ``peek_metadata`` through it) returns the previous revision 1 time in 20."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._previous: dict[tuple[str, str], StoredRecord | None] = {}
        self._chance = random.Random(seed)

    def _apply_upsert(self, upsert: Upsert) -> None:
        key = (upsert.header.namespace, upsert.header.key_digest)
        self._previous[key] = self._records.get(key)
        super()._apply_upsert(upsert)

    def _apply_delete(self, key: tuple[str, str]) -> None:
        self._previous[key] = self._records.get(key)
        super()._apply_delete(key)

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        record = super().load(namespace, key_digest)
        key = (namespace, key_digest)
        if key in self._previous and self._chance.random() < 0.05:
            return self._previous[key]
        return record


class BlindOverwrite(InMemorySecureObjectStore):
    """Writes every upsert whatever revision it expects; deletes and appends stay guarded."""

    def _check(self, unit: UnitOfWork) -> list[tuple[str, str]]:
        return super()._check(dataclasses.replace(unit, upserts=()))


class DropsTags(InMemorySecureObjectStore):
    """Stores every record without its tags, as an adapter that never learnt of them."""

    def commit(self, unit: UnitOfWork) -> None:
        upserts = [dataclasses.replace(upsert, tags=frozenset()) for upsert in unit.upserts]
        super().commit(dataclasses.replace(unit, upserts=upserts))


@dataclasses.dataclass(frozen=True, slots=True)
class _AnyTag(TagFilter):
    """A tag filter matching a record that carries any one of its tags."""

    others: tuple[str, ...] = ()

    def admits(self, metadata: RecordMetadata) -> bool:
        return bool(metadata.tags & {self.tag, *self.others})


class AnyTagFilter(ListDefect):
    """Keeps records carrying any of a listing's tags rather than all of them."""

    def listed(self, call: ListCall) -> RecordPage:
        tags = [one.tag for one in call.filters if isinstance(one, TagFilter)]
        if len(tags) > 1:
            others = [one for one in call.filters if not isinstance(one, TagFilter)]
            call = dataclasses.replace(call, filters=(*others, _AnyTag(tags[0], tuple(tags[1:]))))
        return self.sound(call)


class KeepsOldTags(InMemorySecureObjectStore):
    """Adds a rewrite's tags to those the record held, as an index never pruned would."""

    def commit(self, unit: UnitOfWork) -> None:
        upserts = []
        for upsert in unit.upserts:
            held = self.peek_metadata(upsert.header.namespace, upsert.header.key_digest)
            kept = frozenset() if held is None else held.tags
            upserts.append(dataclasses.replace(upsert, tags=upsert.tags | kept))
        super().commit(dataclasses.replace(unit, upserts=upserts))


class TrimsBeforeAppends(InMemorySecureObjectStore):
    """Applies a unit's trims before its appends, so a trim cannot reach the events it adds."""

    def commit(self, unit: UnitOfWork) -> None:
        if unit.trims and unit.appends:
            super().commit(dataclasses.replace(unit, appends=()))
            super().commit(dataclasses.replace(unit, upserts=(), deletes=(), trims=()))
            return
        super().commit(unit)


# -- which kit tests each defect must fail --------------------------------------

TIES = [
    ("test_tied_write_times_page_in_key_digest_order", {"order": order})
    for order in (Order.WRITTEN_AT, Order.WRITTEN_AT_DESC)
]
NAMES = [("test_names_differing_only_by_case_or_trailing_space_are_distinct", {})]


class AscendingLabelLoad(InMemorySecureObjectStore):
    """Loads the first records of the ascending order whichever direction is asked for."""

    def load_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        limit: int = 1,
    ) -> list[StoredRecord]:
        return super().load_by_label(namespace, label, filters=filters, limit=limit)


class LimitsBeforeFilters(InMemorySecureObjectStore):
    """Takes the first ``limit`` records by the label, then drops those the filters refuse."""

    def load_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        limit: int = 1,
    ) -> list[StoredRecord]:
        first = super().load_by_label(namespace, label, descending=descending, limit=limit)
        return [record for record in first if all(f.admits(record.metadata) for f in filters)]


CONTROLS: list[Any] = [
    *(
        pytest.param(
            lambda unit=unit, field=field: TruncatesTimes(unit, field),
            [("test_sub_second_times_read_back_exactly", {})],
            id=f"{field} to {unit}",
        )
        for unit in ("seconds", "milliseconds")
        for field in ("written_at", "occurred_at")
    ),
    pytest.param(TimeOnlyCursor, TIES, id="cursor holding the time only"),
    pytest.param(
        AscendingTiesUnderDesc,
        [("test_tied_write_times_page_in_key_digest_order", {"order": Order.WRITTEN_AT_DESC})],
        id="ascending ties under WRITTEN_AT_DESC",
    ),
    pytest.param(
        OffsetCursor,
        [("test_cursor_neither_repeats_nor_skips_under_inserts", {"order": o}) for o in Order],
        id="offset cursor",
    ),
    pytest.param(
        AscendingLabelTiesUnderDesc,
        [("test_lists_records_carrying_the_label_in_value_order", {"descending": True})],
        id="ascending label ties under descending",
    ),
    pytest.param(
        FoldedLabelOrder,
        [
            ("test_lists_records_carrying_the_label_in_value_order", {"descending": d})
            for d in (False, True)
        ],
        id="label text ordered by a case-folding collation",
    ),
    pytest.param(
        OffsetLabelCursor,
        [
            ("test_paging_neither_repeats_nor_skips_under_writes", {"descending": d})
            for d in (False, True)
        ],
        id="offset label cursor",
    ),
    pytest.param(
        AscendingLabelLoad,
        [("test_loads_the_first_records_of_the_label_order", {"descending": True, "limit": 2})],
        id="label load ignoring the direction",
    ),
    pytest.param(
        LimitsBeforeFilters,
        [
            ("test_filters_select_as_in_the_label_listing", {"descending": d, "filters": f})
            for d in (False, True)
            for f in (LABEL_FILTERS[1], LABEL_TAG_FILTERS[0])
        ],
        id="label load limiting before it filters",
    ),
    pytest.param(
        UncappedLedger, [("test_ledger_limit_is_capped", {})], id="read_ledger without cap"
    ),
    *(
        pytest.param(
            lambda fold=fold, names=names: FoldsNames(fold, names),
            NAMES,
            id=f"{names} folding {fold}",
        )
        for fold in FOLDS
        for names in ("records", "streams")
    ),
    pytest.param(
        RaisesOnSecondClose, [("test_close_twice_is_harmless", {})], id="second close raises"
    ),
    *(
        pytest.param(
            lambda seed=seed: SometimesStaleLoad(seed),
            [("test_every_write_reads_back_at_once", {})],
            id=f"stale load, seed {seed}",
        )
        for seed in range(5)
    ),
    pytest.param(
        BlindOverwrite,
        [("test_concurrent_writers_have_one_winner_per_revision", {})],
        id="blind overwrite",
    ),
    pytest.param(
        TrimsBeforeAppends,
        [("test_a_trim_counts_the_events_appended_in_its_unit", {})],
        id="trims before appends",
    ),
    pytest.param(
        DropsTags,
        [
            ("test_tags_round_trip_through_every_read", {}),
            ("test_tag_filters_keep_records_carrying_every_tag", {"filters": TAG_FILTERS[0]}),
            (
                "test_tag_filters_apply_with_the_label_order",
                {"descending": False, "filters": LABEL_TAG_FILTERS[0]},
            ),
        ],
        id="tags dropped",
    ),
    pytest.param(
        AnyTagFilter,
        [
            ("test_tag_filters_keep_records_carrying_every_tag", {"filters": filters})
            for filters in (TAG_FILTERS[1], TAG_FILTERS[3])
        ],
        id="tag filters matched by any, not all",
    ),
    pytest.param(
        KeepsOldTags,
        [("test_rewrites_and_deletes_move_tag_matches", {})],
        id="a rewrite keeps the tags it replaced",
    ),
]


@pytest.mark.parametrize(("defective", "tests"), CONTROLS)
def test_the_kit_fails_the_defect(
    defective: StoreFactory, tests: list[tuple[str, dict[str, object]]]
) -> None:
    """Every kit test aimed at the defect fails on it and passes on the sound adapter."""
    for test, params in tests:
        assert kit_failure(InMemorySecureObjectStore, test, **params) is None, test
        assert kit_failure(defective, test, **params) is not None, (test, params)


def test_every_control_is_sound_but_for_its_defect() -> None:
    """Each defective adapter passes kit tests its defect does not reach.

    So a control is the reference adapter but for its one defect, and the
    failures above are that defect's, not a broken control's.
    """
    for factory in (
        TimeOnlyCursor,
        AscendingTiesUnderDesc,
        OffsetCursor,
        UncappedLedger,
        RaisesOnSecondClose,
        BlindOverwrite,
        TrimsBeforeAppends,
        DropsTags,
        AnyTagFilter,
        KeepsOldTags,
        AscendingLabelTiesUnderDesc,
        FoldedLabelOrder,
        OffsetLabelCursor,
        AscendingLabelLoad,
        LimitsBeforeFilters,
        lambda: FoldsNames("case", "records"),
        lambda: FoldsNames("trailing spaces", "streams"),
    ):
        assert kit_failure(factory, "test_sub_second_times_read_back_exactly") is None, factory
        assert kit_failure(factory, "test_ledger_appends_read_back_in_order") is None, factory


def test_the_stale_load_fires_about_once_in_twenty_reads() -> None:
    """The stale-load defect is as rare as it claims, so its catch above is no accident."""
    store = SometimesStaleLoad(seed=0)
    first = UnitOfWork(upserts=[make_upsert("n", "k", b"v1")])
    store.commit(first)
    store.commit(UnitOfWork(upserts=[make_upsert("n", "k", b"v2", expected=1)]))
    digest = first.upserts[0].header.key_digest
    stale = 0
    for _ in range(2000):
        loaded = store.load("n", digest)
        assert loaded is not None
        stale += loaded.payload == b"v1"
    assert 50 <= stale <= 150
