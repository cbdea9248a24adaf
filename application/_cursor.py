"""The opaque list cursor every adapter hands out and accepts.

Adapters share one encoding so that a cursor is a position in the order,
not a row offset: it stays valid while other records are written.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Final

from flowvault.application._records import MAX_LIST_LIMIT, LabelValue, Order, check_label
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
        body = _decode_body(cursor)
        if not isinstance(body, dict) or set(body) != {"o", "k", "w"}:
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        key, written = body["k"], body["w"]
        if body["o"] != order.value:
            raise InvalidInput("list cursor was issued for another order", fix=CURSOR_FIX)
        if not isinstance(key, str) or not isinstance(written, str):
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        return cls(order=order, key_digest=key, written_at=written)


_BY_LABEL: Final = {False: "label", True: "label_desc"}
"""A label cursor's order field; no ``Order`` value shares it, so ``list`` refuses one."""
_DECIMAL: Final = re.compile(r"-?(0|[1-9][0-9]{0,18})")


def _decode_body(cursor: object) -> object:
    if not isinstance(cursor, str):
        raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
    try:
        return parse_json(base64.urlsafe_b64decode(cursor.encode("ascii")))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise InvalidInput("malformed list cursor", fix=CURSOR_FIX) from None


@dataclass(frozen=True, slots=True)
class LabelCursor:
    """The sort key of the last item ``list_by_label`` returned: the label's value and key digest.

    Integers travel as decimal text with a type tag: a 64-bit label is
    past the integers canonical JSON carries exactly.
    """

    label: str
    descending: bool
    value: LabelValue
    key_digest: str

    def encode(self) -> str:
        """Return the opaque text form handed to callers."""
        kind = "text" if isinstance(self.value, str) else "int"
        body = {
            "o": _BY_LABEL[self.descending],
            "n": self.label,
            "t": kind,
            "v": self.value if isinstance(self.value, str) else str(self.value),
            "k": self.key_digest,
        }
        return base64.urlsafe_b64encode(canonical_bytes(body)).decode("ascii")

    @classmethod
    def decode(cls, cursor: str, label: str, *, descending: bool) -> LabelCursor:
        """Parse a cursor issued for ``label`` and this direction; else ``InvalidInput``."""
        body = _decode_body(cursor)
        if not isinstance(body, dict) or set(body) != {"o", "n", "t", "v", "k"}:
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        if body["o"] != _BY_LABEL[descending] or body["n"] != label:
            raise InvalidInput(
                "list cursor was issued for another label or direction", fix=CURSOR_FIX
            )
        kind, text, key = body["t"], body["v"], body["k"]
        if not isinstance(text, str) or not isinstance(key, str) or kind not in ("text", "int"):
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
        value: LabelValue = text
        if kind == "int":
            if not _DECIMAL.fullmatch(text):
                raise InvalidInput("malformed list cursor", fix=CURSOR_FIX)
            value = int(text)
        try:
            check_label(label, value)
        except InvalidInput:
            raise InvalidInput("malformed list cursor", fix=CURSOR_FIX) from None
        return cls(label=label, descending=descending, value=value, key_digest=key)


def effective_limit(limit: int) -> int:
    """Clamp a requested page size to ``MAX_LIST_LIMIT``; below 1 is refused."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInput("limit must be a positive integer", fix=LIMIT_FIX)
    return min(limit, MAX_LIST_LIMIT)
