"""The ledger streams as the store lists them: names, kinds and sizes, never a payload.

A stream name is what the store keeps in the clear (``docs/security.md``):
a record stream is named by its kind and the keyed digest of its record,
so listing names shows no natural key the store keeps only as a digest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from flowvault.application import SecureObjectStore, StoreCapabilities
from flowvault.application._decider_keys import DECIDER_KEY_KIND
from flowvault.application._freshness import (
    ACTION_RESULT_KIND,
    CHECKPOINT_KIND,
    DEFINITION_KIND,
    IDEMPOTENCY_KIND,
    RESULT_KIND,
    WITNESS_KIND,
)
from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.domain import StoreUnavailable

OWN_KINDS: Final = ("workflow", "run", "scope")
"""Streams named by a workflow id, a run id or a scope name: ``workflow/<id>`` and so on."""
RECORD_KINDS: Final = (
    CHECKPOINT_KIND,
    IDEMPOTENCY_KIND,
    WITNESS_KIND,
    ACTION_RESULT_KIND,
    DEFINITION_KIND,
    RESULT_KIND,
    DECIDER_KEY_KIND,
)
"""Record streams, named by their kind and the keyed digest of their record."""
HOST_KIND: Final = "host"
"""Any other name: a stream host code writes with ``vault.stream(name)``."""
PAGE_LIMIT: Final = MAX_LIST_LIMIT


def stream_kind(name: str) -> str:
    """Return the kind a stream name shows: its prefix when flowvault names it so, else host."""
    prefix, slash, _ = name.partition("/")
    if slash and prefix in (*OWN_KINDS, *RECORD_KINDS):
        return prefix
    return HOST_KIND


@dataclass(frozen=True, slots=True)
class StreamSize:
    """One stream: its name, kind and head index; ``size`` events were ever appended to it."""

    stream: str
    kind: str
    head_index: int

    @property
    def size(self) -> int:
        """The events the stream has had, trimmed ones included (its head receipt's size)."""
        return self.head_index + 1


def stream_page(
    store: SecureObjectStore, *, after: str | None, limit: int, prefix: str = ""
) -> tuple[list[StreamSize], str | None]:
    """Return up to ``limit`` streams after ``after`` whose names start with ``prefix``.

    The second item is the name to continue after, ``None`` on the last page.

    Raises:
        StoreUnavailable: the store cannot list its streams (no ``StreamCatalog``).

    """
    catalog = StoreCapabilities.of(store).catalog
    if catalog is None:
        raise StoreUnavailable("this store cannot list its ledger streams (no StreamCatalog)")
    start = after if after is not None and after > prefix else (prefix or None)
    names = catalog.list_streams(after=start, limit=limit)
    wanted = [name for name in names if name.startswith(prefix)]
    heads = StoreCapabilities.of(store).head_indexes(store, wanted)
    sizes = [StreamSize(name, stream_kind(name), heads[name]) for name in wanted if name in heads]
    more = len(names) == min(limit, PAGE_LIMIT) and len(wanted) == len(names)
    return sizes, (names[-1] if more and names else None)


def every_stream(store: SecureObjectStore, prefix: str = "") -> Iterator[StreamSize]:
    """Yield every stream whose name starts with ``prefix``, a page at a time, in name order."""
    after: str | None = None
    while True:
        sizes, after = stream_page(store, after=after, limit=PAGE_LIMIT, prefix=prefix)
        yield from sizes
        if after is None:
            return
