"""Reference semantics of the compare-and-swap guards, shared by adapters.

Adapters that evaluate guards in their own process (memory, SQLite under a
write lock) call these so every backend refuses exactly the same writes;
SQL adapters that push guards into ``WHERE`` clauses mirror them.
"""

from __future__ import annotations

from flowvault.application._records import ExpectedRevision, Guard
from flowvault.domain import LedgerEvent, RevisionConflict
from flowvault.domain._ledger import GENESIS_HASH


def _describe(expected: ExpectedRevision) -> str | int:
    return expected.value if isinstance(expected, Guard) else expected


def check_upsert(
    namespace: str,
    key_digest: str,
    expected: ExpectedRevision,
    stored: int | None,
    new: int,
    *,
    replaces: str | None = None,
    stored_digest: str | None = None,
) -> None:
    """Raise ``RevisionConflict`` unless an upsert may replace ``stored`` with ``new``.

    A re-seal (``replaces`` set) also needs the stored payload digest to be
    the one it replaces, so it never lands on a row deleted and re-created.
    """
    if expected is Guard.ABSENT:
        ok = stored is None
    elif expected is Guard.ANY:
        ok = stored is None or new > stored
    else:
        ok = stored == expected and (replaces is None or stored_digest == replaces)
    if not ok:
        raise RevisionConflict(
            "record revision does not match the write's guard",
            guard="upsert",
            namespace=namespace,
            key_digest=key_digest,
            expected=_describe(expected),
            actual=stored,
        )


def check_delete(
    namespace: str, key_digest: str, expected: ExpectedRevision, stored: int | None
) -> bool:
    """Return whether a delete removes something; raise ``RevisionConflict`` on a stale guard.

    ``Guard.ANY`` on an absent record is a no-op rather than a conflict.
    """
    if expected is Guard.ANY:
        return stored is not None
    if stored != expected:
        raise RevisionConflict(
            "record revision does not match the delete's guard",
            guard="delete",
            namespace=namespace,
            key_digest=key_digest,
            expected=_describe(expected),
            actual=stored,
        )
    return True


def check_append(event: LedgerEvent, head_index: int | None, head_hash: str | None) -> None:
    """Raise ``RevisionConflict`` unless ``event`` extends the stream head exactly."""
    expected_index = 0 if head_index is None else head_index + 1
    expected_previous = GENESIS_HASH if head_hash is None else head_hash
    if event.index != expected_index or event.previous_hash != expected_previous:
        raise RevisionConflict(
            "ledger append does not extend the stream head",
            guard="append",
            stream=event.stream,
            index=event.index,
            head_index=head_index,
        )


def check_drop(stream: str, expected_head: int, head_index: int | None) -> None:
    """Raise ``RevisionConflict`` unless the stream's head is the one the drop names."""
    if head_index != expected_head:
        raise RevisionConflict(
            "ledger drop does not name the stream head",
            guard="drop",
            stream=stream,
            expected=expected_head,
            head_index=head_index,
        )
