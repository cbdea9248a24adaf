"""Running one contract-kit test on a defective adapter, for the kit's negative controls."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import Order, RecordFilter, RecordPage
from flowvault.application.testing import (
    BatchLoadContract,
    LabelListingContract,
    LabelLoadContract,
    SealCounterContract,
    StoreEpochContract,
    StoreStatsContract,
    StreamCatalogContract,
)

StoreFactory = Callable[[], InMemorySecureObjectStore]
KitFailure = AssertionError | pytest.fail.Exception


class _Kit(
    StoreStatsContract,
    StreamCatalogContract,
    StoreEpochContract,
    SealCounterContract,
    LabelListingContract,
    LabelLoadContract,
    BatchLoadContract,
):
    """The kit bound to one store factory; not collected, its tests are called one by one."""

    def __init__(self, factory: StoreFactory) -> None:
        self._factory = factory

    def make_store(self) -> InMemorySecureObjectStore:
        return self._factory()


def kit_failure(factory: StoreFactory, test: str, **params: object) -> KitFailure | None:
    """Run one kit test on a fresh store from ``factory``; return its failure, if any.

    A failure is a failed assertion or a ``pytest.raises`` that saw nothing
    raised. Memory stores hold nothing to release, so the store is not
    closed afterwards (a defective ``close`` would only muddle the verdict).
    """
    kit = _Kit(factory)
    try:
        getattr(kit, test)(kit.make_store(), **params)
    except (AssertionError, pytest.fail.Exception) as failure:
        return failure
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class LabelCall:
    """One call of ``list_by_label``, its arguments in one value a defect can rewrite."""

    namespace: str
    label: str
    descending: bool = False
    filters: tuple[RecordFilter, ...] = ()
    cursor: str | None = None
    limit: int = 100


class LabelListingDefect(InMemorySecureObjectStore):
    """A control whose defect is in ``list_by_label``: subclasses rewrite ``listed_by_label``."""

    def list_by_label(
        self,
        namespace: str,
        label: str,
        *,
        descending: bool = False,
        filters: Sequence[RecordFilter] = (),
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        call = LabelCall(namespace, label, descending, tuple(filters), cursor, limit)
        return self.listed_by_label(call)

    def listed_by_label(self, call: LabelCall) -> RecordPage:
        """Answer ``call``; the sound answer unless a subclass says otherwise."""
        return self.sound_by_label(call)

    def sound_by_label(self, call: LabelCall) -> RecordPage:
        """Return the reference adapter's answer to ``call``."""
        return InMemorySecureObjectStore.list_by_label(
            self,
            call.namespace,
            call.label,
            descending=call.descending,
            filters=call.filters,
            cursor=call.cursor,
            limit=call.limit,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ListCall:
    """One call of ``list``, its arguments in one value a defect can rewrite."""

    namespace: str
    filters: tuple[RecordFilter, ...] = ()
    order: Order = Order.KEY
    cursor: str | None = None
    limit: int = 100


class ListDefect(InMemorySecureObjectStore):
    """A control whose one defect is in ``list``: subclasses rewrite ``listed``."""

    def list(
        self,
        namespace: str,
        *,
        filters: Sequence[RecordFilter] = (),
        order: Order = Order.KEY,
        cursor: str | None = None,
        limit: int = 100,
    ) -> RecordPage:
        return self.listed(ListCall(namespace, tuple(filters), order, cursor, limit))

    def listed(self, call: ListCall) -> RecordPage:
        """Answer ``call``; the sound answer unless a subclass says otherwise."""
        return self.sound(call)

    def sound(self, call: ListCall) -> RecordPage:
        """Return the reference adapter's answer to ``call``."""
        return InMemorySecureObjectStore.list(
            self,
            call.namespace,
            filters=call.filters,
            order=call.order,
            cursor=call.cursor,
            limit=call.limit,
        )
