"""Moving one workflow state scope: its state row and history stream, into a store that lives on.

A scope is what ``StateRepository`` reads: one sealed state row and the
stream ``scope/<name>`` that vouches for it. Both travel as stored, so the
target needs the source's key ring. Added to a store that holds other data,
the scope must be new there; the seal counts that came with it are added to
the target's, which only ever over-counts the seals a key has made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flowvault.application._audit import AuditReport, LedgerAudit, Progress, no_progress
from flowvault.application._records import StoreContents
from flowvault.application._sealed import SealedRepository
from flowvault.application._state import (
    STATE_NAMESPACE,
    StateRepository,
    check_scope,
    history_stream,
)
from flowvault.application._transfer import ContentSummary, read_events
from flowvault.application.ports import StoreFill
from flowvault.domain import (
    IntegrityFailure,
    NotFound,
    RevisionConflict,
    StoreNotEmpty,
    StoreUnavailable,
)


def _epoch(repository: SealedRepository) -> int:
    epoch = repository.capabilities.epoch
    if epoch is None:
        raise StoreUnavailable("this store cannot tell its commit count (no StoreEpoch)")
    return epoch.epoch()


def read_scope(repository: SealedRepository, scope: str) -> StoreContents:
    """Read one scope's state row and history stream as stored, with the store's seal counts.

    The whole store's seal counts travel with the scope: more than its row
    used, never fewer. Like ``read_contents``, a write meanwhile is
    ``RevisionConflict``.

    Raises:
        InvalidInput: ``scope`` is not a scope name.
        NotFound: the store holds neither a state row nor history for it.
        RevisionConflict: the store was written while it was read.

    """
    store = repository.store
    before = _epoch(repository)
    record = store.load(STATE_NAMESPACE, repository.key_digest(STATE_NAMESPACE, check_scope(scope)))
    events = list(read_events(store, [history_stream(scope)]))
    if record is None and not events:
        raise NotFound("this store holds no state and no history for the scope")
    seals = repository.capabilities.seals
    counts = {} if seals is None else dict(seals.seal_counts())
    after = _epoch(repository)
    if after != before:
        raise RevisionConflict(
            "the store changed while the scope was read; stop its writers and run again",
            guard="epoch",
            expected=before,
            actual=after,
        )
    return StoreContents(
        records=[] if record is None else [record], events=events, seal_counts=counts, epoch=before
    )


def require_scope(contents: StoreContents, repository: SealedRepository, scope: str) -> None:
    """Refuse contents holding anything but ``scope``'s state row and history stream.

    Raises:
        IntegrityFailure: a record or event of another scope or kind.

    """
    row = (STATE_NAMESPACE, repository.key_digest(STATE_NAMESPACE, check_scope(scope)))
    stream = history_stream(scope)
    if any((r.metadata.namespace, r.metadata.key_digest) != row for r in contents.records) or any(
        event.stream != stream for event in contents.events
    ):
        raise IntegrityFailure(
            "the scope archive holds rows of something other than its scope; nothing was written",
            part="contents",
        )


@dataclass(frozen=True, slots=True)
class ScopeReport:
    """What a verified scope import wrote, and the target's audit after it."""

    summary: ContentSummary
    revision: int | None
    audit: AuditReport


def add_scope_verified(
    contents: StoreContents,
    scope: str,
    target: SealedRepository,
    audit: Callable[[SealedRepository], LedgerAudit],
    *,
    progress: Progress = no_progress,
    report: Callable[[str], None] = lambda _: None,
) -> ScopeReport:
    """Add ``scope`` to the target in one transaction, then prove it.

    Proof: the scope reads back from the target as it came (the same row
    and events, byte for byte), its state row checks out against its
    history through ``StateRepository``, and ``audit(target)`` is clean.
    A failed proof is ``IntegrityFailure`` and leaves the scope in place.

    Raises:
        StoreUnavailable: the target cannot take rows from a move (no ``StoreFill``).
        IntegrityFailure: ``contents`` hold more than the scope, or the
            written scope does not verify.
        StoreNotEmpty: the target holds the scope's state row or history
            already; nothing was written.

    """
    require_scope(contents, target, scope)
    store = target.store
    if not isinstance(store, StoreFill):
        raise StoreUnavailable("this store cannot take rows from a move (no StoreFill)")
    report(f"adding {len(contents.records)} records and {len(contents.events)} events")
    try:
        store.add(contents)
    except StoreNotEmpty:
        raise StoreNotEmpty(
            "the target already holds this scope's state or history; nothing was written: "
            "import the scope into a store that has never held it"
        ) from None
    report("reading the scope back")
    found = read_scope(target, scope)
    if (found.records, found.events) != (contents.records, contents.events):
        raise IntegrityFailure(
            "the scope does not read back from the target as it was exported", part="contents"
        )
    StateRepository(target, scope).check_current()
    report("auditing the target under the key")
    audited = audit(target).run(progress=progress)
    if not audited.ok:
        raise IntegrityFailure(
            "the target's keyed audit found defects: run `flowvault ledger verify --all` on it",
            part="audit",
        )
    revision = contents.records[0].metadata.revision if contents.records else None
    return ScopeReport(summary=ContentSummary.of(contents), revision=revision, audit=audited)
