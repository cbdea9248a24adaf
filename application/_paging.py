"""The page every service listing returns, its cursor, and reading a page row by row.

A listing pages in the store's own total order, so paging through it visits
each item once, and a row that does not verify is reported on its own
instead of failing the whole listing. The cursor a listing hands out names
the listing and its filters, so one issued for another listing, or for the
same listing with other filters, is refused rather than read as a position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from flowvault.application._cursor import CURSOR_FIX, effective_limit
from flowvault.application._records import LabelFilter, Order, RecordMetadata
from flowvault.application.ports import SecureObjectStore
from flowvault.domain import IntegrityFailure, InvalidInput, JsonValue, content_hash
from flowvault.domain._canonical import MAX_SAFE_INTEGER

T = TypeVar("T")

_INDEX_DIGITS = len(str(MAX_SAFE_INTEGER))


@dataclass(frozen=True, slots=True)
class UnreadableItem:
    """A listed row that did not verify: its key digest and the error's code, nothing else."""

    key_digest: str
    code: str


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing; ``next_cursor`` is ``None`` on the last page."""

    items: tuple[T, ...]
    unreadable: tuple[UnreadableItem, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class PageScope:
    """What a cursor is valid for: one listing with one set of filters."""

    listing: str
    filters: tuple[JsonValue, ...] = ()

    @property
    def _tag(self) -> str:
        """A short digest of the scope: enough to tell listings apart, not a secret."""
        return content_hash([self.listing, *self.filters]).removeprefix("sha256:")[:16]

    def issue(self, position: str | int | None) -> str | None:
        """Return the cursor for ``position``; ``None`` stays ``None`` (no next page)."""
        return None if position is None else f"{self._tag}.{position}"

    def position(self, cursor: str | None) -> str | None:
        """Return the position a cursor of this scope holds; anything else is ``InvalidInput``."""
        if cursor is None:
            return None
        if not isinstance(cursor, str):
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        tag, dot, position = cursor.partition(".")
        if not dot or not position:
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        if tag != self._tag:
            raise InvalidInput(
                "list cursor was issued for another listing or other filters", fix=CURSOR_FIX
            )
        return position

    def index(self, cursor: str | None) -> int:
        """Return the event index a ledger listing's cursor holds (0 without one)."""
        position = self.position(cursor)
        if position is None:
            return 0
        if not (position.isascii() and position.isdigit()) or len(position) > _INDEX_DIGITS:
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        return int(position)


def read_page(
    store: SecureObjectStore,
    scope: PageScope,
    namespace: str,
    filters: Sequence[LabelFilter],
    read: Callable[[RecordMetadata], T | None],
    *,
    cursor: str | None,
    limit: int,
) -> Page[T]:
    """Read one page of ``namespace``, most recently written first, row by row.

    ``read`` opens and checks one listed row; ``None`` means the row went
    away after it was listed. A row whose read fails with an integrity error
    is reported in ``unreadable``; any other error (the store is down, the
    key is missing) is not about that row, and fails the page.
    """
    listed = store.list(
        namespace,
        filters=filters,
        order=Order.WRITTEN_AT_DESC,
        cursor=scope.position(cursor),
        limit=effective_limit(limit),
    )
    items: list[T] = []
    unreadable: list[UnreadableItem] = []
    for metadata in listed.items:
        try:
            item = read(metadata)
        except IntegrityFailure as failure:
            unreadable.append(UnreadableItem(metadata.key_digest, failure.code))
            continue
        if item is not None:
            items.append(item)
    return Page(tuple(items), tuple(unreadable), scope.issue(listed.next_cursor))


__all__ = ["Page", "PageScope", "UnreadableItem", "read_page"]
