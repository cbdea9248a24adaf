"""Where graph definitions, runs and their receipts are stored, and the digests that find them."""

from __future__ import annotations

from flowvault.application._natural_keys import joined
from flowvault.application._sealed import SealedRepository

GRAPH_DEFINITIONS = "flowvault.graph-definitions"
"""Definition heads: which version is current."""
GRAPH_DEFINITION_VERSIONS = "flowvault.graph-definition-versions"
"""Every distinct definition content ever registered, keyed by id and content hash."""
GRAPH_RUNS = "flowvault.graph-runs"
GRAPH_RUN_IDEMPOTENCY = "flowvault.graph-run-idempotency"
GRAPH_RUN_RECEIPTS = "flowvault.graph-run-receipts"


def definition_digest(repository: SealedRepository, definition_id: str) -> str:
    """Return the key digest of a definition's head row (runs carry it as a label)."""
    return repository.key_digest(GRAPH_DEFINITIONS, definition_id)


def version_digest(repository: SealedRepository, definition_id: str, version: str) -> str:
    """Return the key digest of one version's row (runs carry it as a label)."""
    return repository.key_digest(GRAPH_DEFINITION_VERSIONS, joined(definition_id, version))
