"""How a graph run is read back from its sealed row, and whether any run names a definition."""

from __future__ import annotations

from dataclasses import dataclass

from flowvault.application._graph_namespaces import GRAPH_RUNS
from flowvault.application._record_kind import open_listed
from flowvault.application._records import LabelFilter, RecordMetadata
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.domain import GraphRun, IntegrityFailure, InvalidInput, JsonValue


@dataclass(frozen=True, slots=True)
class LoadedRun:
    """A run as read, with the row it came from."""

    run: GraphRun
    metadata: RecordMetadata


def sealed_mapping(opened: SealedDocument) -> dict[str, JsonValue]:
    """Return an opened row's document, which every graph row holds as a mapping."""
    if not isinstance(opened.document, dict):
        raise IntegrityFailure(
            "sealed document has an unexpected shape", key_digest=opened.metadata.key_digest
        )
    return opened.document


def sealed_run(opened: SealedDocument) -> GraphRun:
    """Return the run an opened row holds, checked against the row's revision."""
    try:
        run = GraphRun.model_validate(sealed_mapping(opened).get("run"))
    except InvalidInput:
        raise IntegrityFailure("sealed run has an unexpected shape") from None
    if run.revision != opened.revision:
        raise IntegrityFailure("run record disagrees with its row revision")
    return run


def open_listed_run(repository: SealedRepository, metadata: RecordMetadata) -> LoadedRun | None:
    """Open a listed run, or ``None`` if it vanished since the listing."""
    opened = open_listed(repository, metadata)
    if opened is None:
        return None
    run = sealed_run(opened)
    if repository.key_digest(GRAPH_RUNS, run.run_id) != metadata.key_digest:
        raise IntegrityFailure("run record names another run than its row")
    return LoadedRun(run, metadata)


def runs_reference(repository: SealedRepository, label: str, digest: str) -> bool:
    """Return whether any stored run carries ``digest`` in its ``label`` label."""
    page = repository.store.list(GRAPH_RUNS, filters=[LabelFilter(label, digest)], limit=1)
    return bool(page.items)
