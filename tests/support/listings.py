"""Reading service listings in tests: every page, and what a page reported unreadable."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from flowvault.application import Page, UnreadableItem
from flowvault.domain import CheckpointIntegrityFailure, IntegrityFailure

T = TypeVar("T")

_ERRORS: dict[str, type[IntegrityFailure]] = {
    IntegrityFailure.code: IntegrityFailure,
    CheckpointIntegrityFailure.code: CheckpointIntegrityFailure,
}


def every_page(read: Callable[[str | None], Page[T]]) -> tuple[list[T], list[UnreadableItem]]:
    """Follow ``next_cursor`` from the first page to the last; return all items and reports."""
    items: list[T] = []
    unreadable: list[UnreadableItem] = []
    cursor: str | None = None
    while True:
        page = read(cursor)
        items += page.items
        unreadable += page.unreadable
        if page.next_cursor is None:
            return items, unreadable
        cursor = page.next_cursor


def refused(page: Page[T]) -> list[T]:
    """Return a page's items, or raise the error of its first unreadable item.

    For suites that require every read of a damaged record to end in a typed
    error: a listing reports the record instead of failing, and this turns
    the report back into that error.
    """
    if page.unreadable:
        first = page.unreadable[0]
        error = _ERRORS[first.code]
        raise error("listing reported an unreadable item", key_digest=first.key_digest)
    return list(page.items)
