"""The graph run service wired to the definition registry and receipts it works through."""

from __future__ import annotations

from flowvault.application import (
    Clock,
    DefinitionRegistry,
    IdFactory,
    ReceiptSigner,
    RunService,
    SealedRepository,
    TerminalReceipts,
)


def graph_runs(
    repository: SealedRepository,
    clock: Clock,
    ids: IdFactory,
    *,
    signer: ReceiptSigner | None = None,
) -> RunService:
    """Return a run service over ``repository``, keyed by it, as the composition root wires one."""
    return RunService(
        repository,
        clock,
        ids,
        definitions=DefinitionRegistry(repository, clock),
        receipts=TerminalReceipts(repository, repository, signer=signer),
    )
