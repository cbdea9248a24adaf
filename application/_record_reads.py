"""The rules of the two optional reads, ``list_by_label`` and ``load_many``, written once.

The reference adapter and the fallback in ``StoreCapabilities`` both page
through these, so a store without the capabilities answers exactly as one
with them; the SQL adapters check and order their rows by the same rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import TypeAlias

from flowvault.application._cursor import LabelCursor, effective_limit
from flowvault.application._records import (
    LabelValue,
    RecordMetadata,
    RecordPage,
    check_filters,
    check_label,
)
from flowvault.domain import InvalidInput

LabelRank: TypeAlias = tuple[int, LabelValue, str]
"""A record's place by label: 0 for an integer value, 1 for text; the value; the key digest."""


def label_rank(value: LabelValue, key_digest: str) -> LabelRank:
    """Return the ascending sort key of a record whose label holds ``value``.

    The type comes first, so an integer is never compared with text.
    """
    return (1 if isinstance(value, str) else 0, value, key_digest)


def label_listing_args(
    namespace: object,
    label: object,
    *,
    descending: object,
    filters: object,
    cursor: object,
    limit: int,
) -> tuple[int, LabelCursor | None]:
    """Check a ``list_by_label`` call; return its clamped limit and the decoded cursor.

    Raises:
        InvalidInput: a namespace that is not text, a label name no record
            could carry, a direction that is not a bool, filters that are not
            ``LabelFilter`` or ``TagFilter`` values, a cursor this listing did
            not issue, or a limit below 1.

    """
    if not isinstance(namespace, str):
        raise InvalidInput("namespace must be text")
    check_label(label, "")
    assert isinstance(label, str)  # noqa: S101 - check_label refused anything else
    if not isinstance(descending, bool):
        raise InvalidInput("descending must be a bool")
    check_filters(filters)
    limit = effective_limit(limit)
    if cursor is None:
        return limit, None
    return limit, LabelCursor.decode(cursor, label, descending=descending)  # type: ignore[arg-type]


def label_page(
    candidates: Iterable[RecordMetadata],
    label: str,
    *,
    descending: bool,
    position: LabelCursor | None,
    limit: int,
) -> RecordPage:
    """Return the page of ``candidates`` after ``position``, by ``label``'s value.

    Candidates without the label are dropped; filters are the caller's.
    """
    ranked = [
        (label_rank(meta.labels[label], meta.key_digest), meta)
        for meta in candidates
        if label in meta.labels
    ]
    if position is not None:
        mark = label_rank(position.value, position.key_digest)
        ranked = [
            (rank, meta) for rank, meta in ranked if (rank < mark if descending else rank > mark)
        ]
    ranked.sort(key=lambda pair: pair[0], reverse=descending)
    items = tuple(meta for _, meta in ranked[:limit])
    if len(ranked) <= limit:
        return RecordPage(items=items, next_cursor=None)
    last = items[-1]
    after = LabelCursor(label, descending, last.labels[label], last.key_digest)
    return RecordPage(items=items, next_cursor=after.encode())


def key_digest_names(key_digests: object, most: int | None = None) -> list[str]:
    """Return the distinct names of a ``load_many`` call, refusing what it cannot take.

    A bare string is refused, not read as one-letter names. With ``most``,
    names are counted by taking at most one over it, so a huge ``range`` is
    refused rather than read whole.
    """
    if isinstance(key_digests, str) or not isinstance(key_digests, Sequence):
        raise InvalidInput("key_digests must be a sequence of key digests")
    names = list(key_digests if most is None else islice(key_digests, most + 1))
    if most is not None and len(names) > most:
        raise InvalidInput(f"at most {most} key digests per call")
    if not all(isinstance(name, str) for name in names):
        raise InvalidInput("key digests must be text")
    return list(dict.fromkeys(names))
