"""The store key as the audit verbs find it, and the keyed audit ``ledger verify`` runs.

Neither ever creates a key: a root without one is audited unkeyed.
"""

from __future__ import annotations

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.system import RandomIdFactory, SystemClock
from flowvault.application import (
    DefinitionRegistry,
    LedgerAudit,
    RunService,
    SealedRepository,
    SecureObjectStore,
    TerminalReceipts,
    WorkflowService,
)
from flowvault.application._keys import KEY_ENV, KeyRing, parse_master_key
from flowvault.application._record_audit import BoundRecords
from flowvault.application._workflow_records import WorkflowRecords


def existing_ring(context: CliContext) -> KeyRing | None:
    """Return the keys from ``FLOWVAULT_KEY`` or the key file, never creating one."""
    settings = context.settings
    if settings.key is not None:
        return KeyRing(primary=parse_master_key(settings.key.get_secret_value(), KEY_ENV))
    if settings.backend != "sqlite" and settings.key_file is None:
        return None
    return context.key_file().read_ring()


def keyed_audit(
    store: SecureObjectStore, ring: KeyRing | None, context: CliContext | None = None
) -> LedgerAudit:
    """Return the audit ``ledger verify`` and ``doctor`` run: keyed, with bound records, if it can.

    The key is not checked against the store's records, as opening does:
    under a wrong key the audit reports the records unreadable. With the
    key, the audit also reads back each stream's bound record through the
    services' freshness checks, which only read, and, given ``context``,
    compares the store with its high-water mark without writing it.
    """
    if ring is None:
        return LedgerAudit(store, None)
    clock = SystemClock()
    cipher = AesGcmCipher.from_ring(ring)
    repository = SealedRepository(store, cipher, clock)
    ids = RandomIdFactory()
    bound = BoundRecords(
        repository,
        WorkflowService(WorkflowRecords(repository), clock, ids),
        RunService(
            repository,
            clock,
            ids,
            definitions=DefinitionRegistry(repository, clock),
            receipts=TerminalReceipts(repository, repository),
        ),
    )
    mark = (
        None if context is None else context.anti_rollback(store, cipher, repository.capabilities)
    )
    return LedgerAudit(store, repository, bound, mark)
