"""The opaque list cursor every adapter hands out and accepts.

Adapters share one encoding so that a cursor is a position in the order,
not a row offset: it stays valid while other records are written.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from flowvault.application._records import MAX_LIST_LIMIT, Order
from flowvault.domain import InvalidInput
from flowvault.domain._canonical import canonical_bytes, parse_json

CURSOR_FIX = (
    "pass the next_cursor the previous page printed, with the same verb and filters, or drop "
    "--cursor to start over"
)
"""The remedy for a cursor this listing did not issue."""
LIMIT_FIX = f"pass --limit between 1 and {MAX_LIST_LIMIT} (larger is read as {MAX_LIST_LIMIT})"
"""The remedy for a page size below one."""


@dataclass(frozen=True, slots=True)
class ListCursor:
    """The sort key of the last item returned, for a given order."""

    order: Order
    key_digest: str
    written_at: str

    def encode(self) -> str:
        """Return the opaque text form handed to callers."""
        body = {"o": self.order.value, "k": self.key_digest, "w": self.written_at}
        return base64.urlsafe_b64encode(canonical_bytes(body)).decode("ascii")

    @classmethod
    def decode(cls, cursor: str, order: Order) -> ListCursor:
        """Parse a cursor issued for ``order``; anything else is ``InvalidInput``."""
        if not isinstance(cursor, str):
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        try:
            body = parse_json(base64.urlsafe_b64decode(cursor.encode("ascii")))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX) from None
        if not isinstance(body, dict) or set(body) != {"o", "k", "w"}:
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        key, written = body["k"], body["w"]
        if body["o"] != order.value:
            raise InvalidInput("list cursor was issued for another order", fix=CURSOR_FIX)
        if not isinstance(key, str) or not isinstance(written, str):
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        return cls(order=order, key_digest=key, written_at=written)


def effective_limit(limit: int) -> int:
    """Clamp a requested page size to ``MAX_LIST_LIMIT``; below 1 is refused."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInput("limit must be a positive integer", fix=LIMIT_FIX)
    return min(limit, MAX_LIST_LIMIT)
