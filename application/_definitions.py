"""The registry of graph definitions: versions named by content hash, one of them current.

Every mutation is one unit of work with an event of the definition's record
stream, which names the rows it wrote or deleted, so a row put back from an
older copy or deleted outside flowvault is refused, never read as current.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial

from flowvault.application._backoff import LOST, Lost, settle
from flowvault.application._compaction import compact_after_commit
from flowvault.application._freshness import (
    DEFINITION_KIND,
    DELETED_FIELD,
    StreamPolicy,
    leaves_unnamed,
    record_event,
    record_payload,
    record_stream,
)
from flowvault.application._graph_namespaces import (
    GRAPH_DEFINITION_VERSIONS,
    GRAPH_DEFINITIONS,
    definition_digest,
    version_digest,
)
from flowvault.application._instants import micros
from flowvault.application._natural_keys import joined
from flowvault.application._record_kind import list_all, open_listed
from flowvault.application._records import (
    Delete,
    Guard,
    LabelFilter,
    LabelValue,
    UnitOfWork,
    Upsert,
)
from flowvault.application._run_records import runs_reference, sealed_mapping
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application.ports import Clock
from flowvault.domain import (
    DefinitionReferenced,
    DefinitionVersion,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    NotFound,
    RevisionConflict,
    content_hash,
)
from flowvault.domain._envelope import DIGEST_PATTERN
from flowvault.domain._graph_runs import DEFINITION_ID_PATTERN


@dataclass(frozen=True, slots=True)
class DefinitionReference:
    """What a starting run commits with it to pin a definition version.

    ``event`` (``definition.referenced``) goes to the definition's record
    stream and ``head`` rewrites the head bound to it, so a concurrent delete
    or replacement of the definition cannot miss the run.
    """

    version: str
    event: LedgerEvent
    head: Upsert


class DefinitionRegistry:
    """Register, read, list and delete versioned graph definitions."""

    def __init__(self, repository: SealedRepository, clock: Clock) -> None:
        self._repo = repository
        self._store = repository.store
        self._clock = clock
        self._fresh = StreamPolicy[SealedDocument](
            "graph definition", repository, leaves_record=leaves_unnamed
        )

    def register_definition(
        self, definition_id: str, spec: JsonValue, *, overwrite: bool = False
    ) -> DefinitionVersion:
        """Store ``spec`` as a version named by its content hash and make it current.

        The same content again is a no-op returning the existing version.
        Replacing a current version that runs reference needs ``overwrite``,
        so a host cannot silently change what a run's definition id means.

        Raises:
            DefinitionReferenced: the current version is referenced and
                ``overwrite`` is false.
            InvalidInput: a malformed id or a spec outside the JSON profile.

        """
        check_definition_id(definition_id)
        version = content_hash(spec)

        def attempt() -> DefinitionVersion | Lost:
            try:
                return self._register(definition_id, spec, version, overwrite=overwrite)
            except RevisionConflict:
                return LOST

        return settle(attempt, "definition", definition_id=definition_id)

    def _register(
        self, definition_id: str, spec: JsonValue, version: str, *, overwrite: bool
    ) -> DefinitionVersion:
        head = self._head_row(definition_id)
        if head is None:
            made = self._new_version(definition_id, version)
            event = self._event(
                definition_id, "definition.registered", record_payload(*self._digests(made))
            )
            upserts = [
                self._head_upsert(definition_id, version, Guard.ABSENT, event.index),
                self._version_upsert(made, spec, event.index),
            ]
            self._store.commit(UnitOfWork(upserts=upserts, appends=[event]))
            return made
        current = _head_version(head, definition_id)
        if current == version:
            return self._version(definition_id, version)[0]
        if not overwrite and runs_reference(
            self._repo, "version", version_digest(self._repo, definition_id, current)
        ):
            raise DefinitionReferenced(
                "runs reference the current definition version; pass overwrite=True to replace it",
                definition_id=definition_id,
            )
        return self._replace(head, definition_id, spec, version)

    def _replace(
        self, head: SealedDocument, definition_id: str, spec: JsonValue, version: str
    ) -> DefinitionVersion:
        """Make ``version`` current, storing it first unless it was registered before."""
        existing = self._version_row(definition_id, version)
        made = (
            self._new_version(definition_id, version)
            if existing is None
            else _definition_version(existing, definition_id, version)[0]
        )
        written = self._digests(made) if existing is None else self._digests(made)[:1]
        event = self._event(definition_id, "definition.registered", record_payload(*written))
        upserts = [self._head_upsert(definition_id, version, head.revision, event.index)]
        if existing is None:
            upserts.append(self._version_upsert(made, spec, event.index))
        self._store.commit(UnitOfWork(upserts=upserts, appends=[event]))
        return made

    def _new_version(self, definition_id: str, version: str) -> DefinitionVersion:
        return DefinitionVersion(
            definition_id=definition_id, version=version, created_at=self._clock.now()
        )

    def get_definition(
        self, definition_id: str, version: str | None = None
    ) -> tuple[DefinitionVersion, JsonValue]:
        """Return a version of a definition and its spec; the current one by default.

        Raises:
            IntegrityFailure: the head or version row is older than the
                definition's record stream says, or missing although the
                stream records it and no delete.
            NotFound: no such definition or version.

        """
        check_definition_id(definition_id)
        if version is None:
            version = self._head(definition_id)[0]
        return self._version(definition_id, check_version(version))

    def definition_versions(self, definition_id: str) -> list[DefinitionVersion]:
        """Return every stored version of a definition, oldest first.

        Each row is checked against the definition's record stream; a row
        deleted while it is listed is skipped.
        """
        check_definition_id(definition_id)
        self._head(definition_id)
        stream = self._stream(definition_id)
        found = []
        for metadata in list_all(
            self._store, GRAPH_DEFINITION_VERSIONS, self._versions_of(definition_id)
        ):
            listed = open_listed(self._repo, metadata)
            opened = (
                None
                if listed is None
                else self._fresh.check_listed(
                    self._store, stream, listed, partial(open_listed, self._repo, metadata)
                )
            )
            if opened is not None:
                found.append(_definition_version(opened, definition_id)[0])
        return sorted(found, key=lambda item: (item.created_at, item.version))

    def delete_definition(self, definition_id: str) -> int:
        """Delete a definition's head and every version in one unit; return the versions removed.

        The unit appends ``definition.deleted`` to the definition's record
        stream, naming the deleted rows, so their absence is legitimate.

        Raises:
            DefinitionReferenced: any stored run references any version.
            NotFound: no such definition.

        """
        check_definition_id(definition_id)
        deleted = settle(
            partial(self._delete, definition_id), "definition", definition_id=definition_id
        )
        compact_after_commit(self._repo.capabilities.compactor)
        return deleted

    def _delete(self, definition_id: str) -> int | Lost:
        digest = definition_digest(self._repo, definition_id)
        revision = self._head(definition_id)[1]
        if runs_reference(self._repo, "definition", digest):
            raise DefinitionReferenced(
                "runs still reference this definition", definition_id=definition_id
            )
        versions = list(
            list_all(self._store, GRAPH_DEFINITION_VERSIONS, self._versions_of(definition_id))
        )
        deletes = [Delete(GRAPH_DEFINITIONS, digest, revision)]
        deletes += [Delete(meta.namespace, meta.key_digest, meta.revision) for meta in versions]
        gone: list[JsonValue] = [delete.key_digest for delete in deletes]
        event = self._event(definition_id, "definition.deleted", {DELETED_FIELD: gone})
        try:
            self._store.commit(UnitOfWork(deletes=deletes, appends=[event]))
        except RevisionConflict:
            return LOST
        return len(versions)

    def reference(
        self, definition_id: str, version: str | None, at: datetime
    ) -> DefinitionReference:
        """Pin the current (or the given) version for a run starting ``at``.

        Returns what the run's unit of work must commit with the run: the
        definition's ``definition.referenced`` event and its head rewritten,
        bound to that event, so the head from before the start cannot come
        back.

        Raises:
            InvalidInput: a malformed id or version.
            NotFound: no such definition or version.

        """
        check_definition_id(definition_id)
        head = self._head_row(definition_id)
        if head is None:
            raise NotFound("no such definition", definition_id=definition_id)
        current = _head_version(head, definition_id)
        if version is not None:
            self._version(definition_id, check_version(version))
        referenced = record_payload(definition_digest(self._repo, definition_id))
        event = self._event(definition_id, "definition.referenced", referenced, at)
        upsert = self._head_upsert(definition_id, current, head.revision, event.index)
        return DefinitionReference(version or current, event, upsert)

    def _head(self, definition_id: str) -> tuple[str, int]:
        opened = self._head_row(definition_id)
        if opened is None:
            raise NotFound("no such definition", definition_id=definition_id)
        return _head_version(opened, definition_id), opened.revision

    def _head_row(self, definition_id: str) -> SealedDocument | None:
        """Read a definition's head; one its record stream vouches for must be there."""
        return self._fresh.read_vouched(
            self._store,
            self._stream(definition_id),
            (GRAPH_DEFINITIONS, definition_digest(self._repo, definition_id)),
            lambda: self._repo.read(GRAPH_DEFINITIONS, definition_id),
        )

    def _version(self, definition_id: str, version: str) -> tuple[DefinitionVersion, JsonValue]:
        opened = self._version_row(definition_id, version)
        if opened is None:
            raise NotFound("no such definition version", definition_id=definition_id)
        return _definition_version(opened, definition_id, version)

    def _version_row(self, definition_id: str, version: str) -> SealedDocument | None:
        """Read a definition version; one its definition's stream vouches for must be there."""
        natural = joined(definition_id, version)
        return self._fresh.read_vouched(
            self._store,
            self._stream(definition_id),
            (GRAPH_DEFINITION_VERSIONS, version_digest(self._repo, definition_id, version)),
            lambda: self._repo.read(GRAPH_DEFINITION_VERSIONS, natural),
        )

    def _stream(self, definition_id: str) -> str:
        """Name the record stream of a definition's head and versions."""
        return record_stream(DEFINITION_KIND, definition_digest(self._repo, definition_id))

    def _event(
        self,
        definition_id: str,
        event_type: str,
        payload: JsonValue,
        at: datetime | None = None,
    ) -> LedgerEvent:
        return record_event(
            self._repo,
            self._stream(definition_id),
            event_type,
            payload,
            self._clock.now() if at is None else at,
        )

    def _digests(self, made: DefinitionVersion) -> tuple[str, str]:
        """Return the key digests of a definition's head and of the version ``made``."""
        return (
            definition_digest(self._repo, made.definition_id),
            version_digest(self._repo, made.definition_id, made.version),
        )

    def _head_upsert(
        self, definition_id: str, current: str, expected: int | Guard, ledger_index: int
    ) -> Upsert:
        """Seal a definition head bound to the record-stream event committed with it."""
        document = {"definition_id": definition_id, "current": current}
        return self._repo.prepare(
            GRAPH_DEFINITIONS, definition_id, document, expected=expected, ledger_index=ledger_index
        )

    def _version_upsert(
        self, made: DefinitionVersion, spec: JsonValue, ledger_index: int
    ) -> Upsert:
        labels: dict[str, LabelValue] = {
            "definition": definition_digest(self._repo, made.definition_id),
            "created_at": micros(made.created_at),
        }
        return self._repo.prepare(
            GRAPH_DEFINITION_VERSIONS,
            joined(made.definition_id, made.version),
            {"definition": made.model_dump(mode="json"), "spec": spec},
            expected=Guard.ABSENT,
            labels=labels,
            ledger_index=ledger_index,
        )

    def _versions_of(self, definition_id: str) -> list[LabelFilter]:
        return [LabelFilter("definition", definition_digest(self._repo, definition_id))]


def check_definition_id(definition_id: object) -> str:
    """Return a well-formed definition id, or raise ``InvalidInput``."""
    if not isinstance(definition_id, str) or not DEFINITION_ID_PATTERN.fullmatch(definition_id):
        raise InvalidInput("a definition id is 1-64 of [a-z0-9_.-], starting with a letter")
    return definition_id


def check_version(version: object) -> str:
    """Return a well-formed definition version (a content hash), or raise ``InvalidInput``."""
    if not isinstance(version, str) or not DIGEST_PATTERN.fullmatch(version):
        raise InvalidInput("a definition version is a sha256:<64 hex> content hash")
    return version


def _head_version(opened: SealedDocument, definition_id: str) -> str:
    document = sealed_mapping(opened)
    current = document.get("current")
    if document.get("definition_id") != definition_id or not isinstance(current, str):
        raise IntegrityFailure("definition head disagrees with its row")
    return current


def _definition_version(
    opened: SealedDocument, definition_id: str, version: str | None = None
) -> tuple[DefinitionVersion, JsonValue]:
    document = sealed_mapping(opened)
    try:
        made = DefinitionVersion.model_validate(document.get("definition"))
    except InvalidInput:
        raise IntegrityFailure("sealed definition version has an unexpected shape") from None
    spec = document.get("spec")
    if made.definition_id != definition_id or made.version != (version or made.version):
        raise IntegrityFailure("definition version disagrees with its row")
    if content_hash(spec) != made.version:
        raise IntegrityFailure("definition spec does not match its version hash")
    return made, spec
