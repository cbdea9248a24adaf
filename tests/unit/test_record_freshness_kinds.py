"""Action results, terminal receipts, graph definitions and run results, bound to the ledger.

Each write of these kinds appends an event that names the row's key digest
(an action result, a definition with its versions and a run result on a
record stream of their own; a terminal receipt on its run's stream, in the
``run.<status>`` event) and the row's header names that event. So an older
row put back whole is refused by every read, a row deleted outside
flowvault is refused where the stream says it exists, a retry is refused
rather than repeated, and the full audit reports both. The attacks go
through the port itself, which is what an editor of the database leaves
behind; every adapter runs them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from graph_services import graph_runs
from row_edits import PassThroughStore, RowEditor, refused
from workflow_services import workflow_services

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import (
    ActionResultService,
    DefinitionRegistry,
    Guard,
    LedgerAudit,
    LedgerPage,
    ResultRepository,
    SealedRepository,
    SecureObjectStore,
    StoredRecord,
    TerminalReceipts,
    UnreadableItem,
)
from flowvault.application._action_results import ACTION_RESULTS
from flowvault.application._audit import list_all_streams
from flowvault.application._freshness import (
    ACTION_RESULT_KIND,
    DEFINITION_KIND,
    RESULT_KIND,
    record_stream,
)
from flowvault.application._graph_namespaces import (
    GRAPH_DEFINITION_VERSIONS,
    GRAPH_DEFINITIONS,
    GRAPH_RUN_RECEIPTS,
)
from flowvault.application._record_audit import BoundRecords
from flowvault.application._run_retention import purge_finished_runs
from flowvault.application._runs import RUNS
from flowvault.application._streams import mac_matches, run_stream
from flowvault.application._tombstones import RETENTION_TOMBSTONE
from flowvault.application._workflow_records import stream_of
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import IntegrityFailure, NotFound, WorkflowResult, WorkOrder, content_hash
from flowvault.domain._canonical import canonical_json

KEY = bytes(range(5, 37))
SECRET = "kinds-secret-41c7-never-in-errors"
DEFINITION = "secretdef41c7"
RESULT_RUN = "run-secret-41c7"
ACTION = content_hash("send the invoice")
SECOND = timedelta(seconds=1)
DAY = timedelta(days=1)
STALE = "older than its ledger"
DELETED = "deleted outside flowvault"


class World(RowEditor):
    """The services that write these kinds, over one store and a frozen clock."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.clock = FrozenClock()
        super().__init__(store, SealedRepository(store, AesGcmCipher(KEY), self.clock))
        services = workflow_services(self.repository, self.clock, SequentialIds("wf"))
        self.workflows = services.workflows
        self.workflow_events = services.events
        self.action_results = services.results
        self.runs = graph_runs(self.repository, self.clock, SequentialIds("run"))
        self.definitions = DefinitionRegistry(self.repository, self.clock)
        self.receipts = TerminalReceipts(self.repository, self.repository)
        self.results = ResultRepository(self.repository)

    def workflow(self) -> str:
        record, _ = self.workflows.create(
            WorkOrder(kind="invoice", requester="ops", idempotency_key="order-1")
        )
        return record.workflow_id

    def finished_run(self) -> str:
        self.definitions.register_definition(DEFINITION, {"nodes": [SECRET]})
        run, _ = self.runs.start_run(DEFINITION, {"input": SECRET})
        self.runs.set_status(run.run_id, "running", expected_status="accepted")
        self.runs.finish_run(
            run.run_id, "completed", expected_status="running", final_state={"s": SECRET}
        )
        return run.run_id

    def result(self, status: str = "completed") -> WorkflowResult:
        return WorkflowResult(
            run_id=RESULT_RUN,
            status=status,
            started_at=self.clock.now(),
            finished_at=self.clock.now(),
            output={"answer": SECRET},
        )

    def audit(self) -> LedgerAudit:
        return LedgerAudit(
            self.store, self.repository, BoundRecords(self.repository, self.workflows, self.runs)
        )

    def reader_at(self, moment: datetime) -> ActionResultService:
        """Return a workflow service whose clock shows ``moment``, over the same store."""
        return workflow_services(self.repository, FrozenClock(moment), SequentialIds("wf")).results


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world on each backend."""
    return World(backend_store)


def _refused(call: Callable[[], object], wording: str) -> IntegrityFailure:
    """Check a refusal with none of this module's secrets in it."""
    return refused(call, wording, SECRET, DEFINITION)


class _OlderOnce(PassThroughStore):
    """Returns an older copy of one row on its first load, as if a rewrite landed just after."""

    def __init__(self, inner: SecureObjectStore, older: StoredRecord) -> None:
        super().__init__(inner)
        self._older = older
        self.served = 0

    def load(self, namespace: str, key_digest: str) -> StoredRecord | None:
        metadata = self._older.metadata
        if (namespace, key_digest) == (metadata.namespace, metadata.key_digest) and not self.served:
            self.served += 1
            return self._older
        return self._inner.load(namespace, key_digest)


def _racing(world: World, older: StoredRecord) -> tuple[_OlderOnce, SealedRepository]:
    racing = _OlderOnce(world.store, older)
    repository = SealedRepository(racing, AesGcmCipher(KEY), world.clock)  # type: ignore[arg-type]
    return racing, repository


# -- action results ----------------------------------------------------------------


def _replaced_result(world: World) -> tuple[str, StoredRecord, datetime]:
    """Store a result, let it expire, store another in its place; return the older row."""
    workflow_id = world.workflow()
    stored_at = world.clock.now()
    world.action_results.put_action_result(workflow_id, ACTION, {"v": SECRET}, retention=SECOND)
    older = world.row(ACTION_RESULTS, f"{workflow_id}\x1f{ACTION}")
    world.clock.advance(2 * SECOND)
    world.action_results.put_action_result(workflow_id, ACTION, {"v": 2}, retention=DAY)
    return workflow_id, older, stored_at


def test_each_action_result_write_names_its_record_stream_event(world: World) -> None:
    """A put and a replacement after expiry each append ``action_result.stored`` naming the row."""
    workflow_id, _, _ = _replaced_result(world)
    digest = world.digest(ACTION_RESULTS, f"{workflow_id}\x1f{ACTION}")
    events = world.events(record_stream(ACTION_RESULT_KIND, digest))
    assert [e.type for e in events] == ["action_result.stored"] * 2
    assert all(e.payload == {"records": [digest]} for e in events)
    assert all(mac_matches(e, world.repository) for e in events)
    assert world.row(ACTION_RESULTS, f"{workflow_id}\x1f{ACTION}").metadata.header.ledger_index == 1
    assert world.events(stream_of(workflow_id))[-1].type == "action_result.purged"


def test_an_older_action_result_put_back_is_refused_by_every_read(world: World) -> None:
    """The expired first result put back opens, but a later event of its stream replaced it.

    A reader whose clock shows the first result unexpired would otherwise
    get it back from the read and from the listing.
    """
    workflow_id, older, stored_at = _replaced_result(world)
    world.replay(older)
    early = world.reader_at(stored_at)
    failure = _refused(lambda: early.get_action_result(workflow_id, ACTION), STALE)
    assert failure.details["ledger_index"] == 0
    _refused(lambda: early.list_action_results(workflow_id), STALE)
    _refused(lambda: world.action_results.get_action_result(workflow_id, ACTION), STALE)
    _refused(
        lambda: world.action_results.put_action_result(
            workflow_id, ACTION, {"v": 2}, retention=DAY
        ),
        STALE,
    )


def test_a_deleted_action_result_is_refused_and_not_stored_again(world: World) -> None:
    """Its stream still vouches for it: a read and a retried put refuse instead of starting over."""
    workflow_id = world.workflow()
    world.action_results.put_action_result(workflow_id, ACTION, {"v": 1}, retention=DAY)
    digest = world.digest(ACTION_RESULTS, f"{workflow_id}\x1f{ACTION}")
    world.delete(ACTION_RESULTS, digest)
    _refused(lambda: world.action_results.get_action_result(workflow_id, ACTION), DELETED)
    for body in ({"v": 1}, {"v": 2}):
        _refused(
            lambda body=body: world.action_results.put_action_result(workflow_id, ACTION, body),
            DELETED,
        )
    assert len(world.events(record_stream(ACTION_RESULT_KIND, digest))) == 1
    assert world.action_results.get_action_result(workflow_id, content_hash("other")) is None


def test_a_purged_action_result_is_gone_and_its_row_cannot_come_back(world: World) -> None:
    """The purge tombstones the record stream too, so the result reads as absent.

    It can then be stored again, while its purged row put back is refused.
    """
    workflow_id = world.workflow()
    world.action_results.put_action_result(workflow_id, ACTION, {"v": SECRET}, retention=SECOND)
    purged = world.row(ACTION_RESULTS, f"{workflow_id}\x1f{ACTION}")
    world.clock.advance(2 * SECOND)
    assert world.action_results.purge_expired() == 1
    digest = purged.metadata.key_digest
    stream = record_stream(ACTION_RESULT_KIND, digest)
    tombstone = world.events(stream)[-1]
    assert tombstone.type == RETENTION_TOMBSTONE
    assert mac_matches(tombstone, world.repository)
    assert world.action_results.get_action_result(workflow_id, ACTION) is None
    world.replay(purged)
    _refused(lambda: world.action_results.get_action_result(workflow_id, ACTION), STALE)
    stale = world.audit().run().stale
    assert [(found.namespace, found.key_digest) for found in stale] == [(ACTION_RESULTS, digest)]
    _refused(world.action_results.purge_expired, STALE)
    world.delete(ACTION_RESULTS, digest)
    world.action_results.put_action_result(workflow_id, ACTION, {"v": 3}, retention=DAY)
    found = world.action_results.get_action_result(workflow_id, ACTION)
    assert found is not None
    assert found.result == {"v": 3}


def test_an_action_result_rewritten_during_a_read_is_no_false_alarm(world: World) -> None:
    """A read that met the row just before its rewrite reads again instead of refusing."""
    workflow_id, _, _ = _replaced_result(world)
    older = world.row(ACTION_RESULTS, f"{workflow_id}\x1f{ACTION}")
    world.clock.advance(2 * DAY)
    world.action_results.put_action_result(workflow_id, ACTION, {"v": 3}, retention=DAY)
    racing, repository = _racing(world, older)
    service = workflow_services(repository, world.clock, SequentialIds("wf")).results
    found = service.get_action_result(workflow_id, ACTION)
    assert found is not None
    assert found.result == {"v": 3}
    assert racing.served == 1


# -- terminal receipts ---------------------------------------------------------------


def test_a_receipt_is_bound_to_the_event_that_ended_its_run(world: World) -> None:
    """``run.<status>`` names the receipt's key digest; the receipt's row names that event."""
    run_id = world.finished_run()
    ended = world.events(run_stream(run_id))[-1]
    digest = world.digest(GRAPH_RUN_RECEIPTS, run_id)
    assert ended.type == "run.completed"
    assert isinstance(ended.payload, dict)
    assert ended.payload["records"] == [digest]
    assert world.row(GRAPH_RUN_RECEIPTS, run_id).metadata.header.ledger_index == ended.index
    assert world.receipts.terminal_receipt(run_id).status == "completed"


def test_a_deleted_receipt_is_refused_not_read_as_never_issued(world: World) -> None:
    """Its run's stream says it was issued; a run that has not ended still has none."""
    run_id = world.finished_run()
    world.delete(GRAPH_RUN_RECEIPTS, world.digest(GRAPH_RUN_RECEIPTS, run_id))
    failure = _refused(lambda: world.receipts.terminal_receipt(run_id), DELETED)
    assert failure.details["namespace"] == GRAPH_RUN_RECEIPTS
    run, _ = world.runs.start_run(DEFINITION, {"input": 2})
    world.runs.set_status(run.run_id, "running", expected_status="accepted")
    with pytest.raises(NotFound):
        world.receipts.terminal_receipt(run.run_id)


def test_a_receipt_stays_current_after_its_run_is_purged(world: World) -> None:
    """The purge tombstone after ``run.<status>`` does not name the receipt, so it still reads."""
    run_id = world.finished_run()
    receipt = world.receipts.terminal_receipt(run_id)
    world.clock.advance(2 * DAY)
    assert purge_finished_runs(world.repository, world.clock, world.clock.now(), DAY) == 1
    assert world.events(run_stream(run_id))[-1].type == RETENTION_TOMBSTONE
    assert world.receipts.terminal_receipt(run_id) == receipt


def test_a_receipt_row_without_an_index_is_refused(world: World) -> None:
    """A receipt row without an index is held to every event of its run's stream, so refused.

    Every receipt is written bound to its run's last event; one without an
    index is not excused as written by an earlier build.
    """
    elsewhere = World(InMemorySecureObjectStore())
    run_id = elsewhere.finished_run()
    opened = elsewhere.repository.read(GRAPH_RUN_RECEIPTS, run_id)
    assert opened is not None
    world.finished_run()
    world.delete(GRAPH_RUN_RECEIPTS, world.digest(GRAPH_RUN_RECEIPTS, run_id))
    world.repository.write(GRAPH_RUN_RECEIPTS, run_id, opened.document, expected=Guard.ABSENT)
    assert world.row(GRAPH_RUN_RECEIPTS, run_id).metadata.header.ledger_index is None
    _refused(lambda: world.receipts.terminal_receipt(run_id), STALE)


# -- graph definitions and their versions ------------------------------------------


def _definition_stream(world: World) -> str:
    return record_stream(DEFINITION_KIND, world.digest(GRAPH_DEFINITIONS, DEFINITION))


def test_definition_writes_name_their_record_stream_event(world: World) -> None:
    """Registering names the head and any new version; a run start names the head it rewrites."""
    first = world.definitions.register_definition(DEFINITION, {"nodes": [1]})
    second = world.definitions.register_definition(DEFINITION, {"nodes": [2]})
    world.definitions.register_definition(DEFINITION, {"nodes": [1]})
    head = world.digest(GRAPH_DEFINITIONS, DEFINITION)
    versions = [
        world.digest(GRAPH_DEFINITION_VERSIONS, f"{DEFINITION}\x1f{made.version}")
        for made in (first, second)
    ]
    events = world.events(_definition_stream(world))
    assert [e.type for e in events] == ["definition.registered"] * 3
    assert [e.payload for e in events] == [
        {"records": [head, versions[0]]},
        {"records": [head, versions[1]]},
        {"records": [head]},
    ]
    before = world.row(GRAPH_DEFINITIONS, DEFINITION).metadata
    world.runs.start_run(DEFINITION, {"input": 1})
    after = world.row(GRAPH_DEFINITIONS, DEFINITION).metadata
    referenced = world.events(_definition_stream(world))[-1]
    assert (referenced.type, referenced.payload) == ("definition.referenced", {"records": [head]})
    assert (before.header.ledger_index, after.header.ledger_index) == (2, 3)
    assert after.revision == before.revision + 1
    assert world.audit().run().ok


def test_an_older_definition_head_put_back_is_refused_by_every_read(world: World) -> None:
    """The head naming the first version opens, but a later registration rewrote it."""
    world.definitions.register_definition(DEFINITION, {"nodes": [1]})
    older = world.row(GRAPH_DEFINITIONS, DEFINITION)
    world.definitions.register_definition(DEFINITION, {"nodes": [2]})
    world.replay(older)
    failure = _refused(lambda: world.definitions.get_definition(DEFINITION), STALE)
    assert failure.details["ledger_index"] == 0
    _refused(lambda: world.definitions.definition_versions(DEFINITION), STALE)
    _refused(lambda: world.runs.start_run(DEFINITION, {"input": 1}), STALE)
    _refused(lambda: world.definitions.register_definition(DEFINITION, {"nodes": [3]}), STALE)
    _refused(lambda: world.definitions.delete_definition(DEFINITION), STALE)


def test_a_version_put_back_from_before_a_delete_is_refused(world: World) -> None:
    """Deleted and registered again, a version's older row names an event two writes back."""
    made = world.definitions.register_definition(DEFINITION, {"nodes": [1]})
    older = world.row(GRAPH_DEFINITION_VERSIONS, f"{DEFINITION}\x1f{made.version}")
    assert world.definitions.delete_definition(DEFINITION) == 1
    deleted = world.events(_definition_stream(world))[-1]
    assert deleted.type == "definition.deleted"
    assert isinstance(deleted.payload, dict)
    assert set(deleted.payload["deleted"]) == {
        world.digest(GRAPH_DEFINITIONS, DEFINITION),
        older.metadata.key_digest,
    }
    with pytest.raises(NotFound):
        world.definitions.get_definition(DEFINITION)
    world.replay(older)
    _refused(lambda: world.definitions.get_definition(DEFINITION, made.version), STALE)
    world.delete(GRAPH_DEFINITION_VERSIONS, older.metadata.key_digest)
    world.definitions.register_definition(DEFINITION, {"nodes": [1]})
    world.clock.advance(SECOND)
    world.definitions.register_definition(DEFINITION, {"nodes": [2]})
    world.replay(older)
    _refused(lambda: world.definitions.get_definition(DEFINITION, made.version), STALE)
    _refused(lambda: world.definitions.definition_versions(DEFINITION), STALE)


def test_deleted_definition_rows_are_refused_and_not_registered_again(world: World) -> None:
    """A head or version deleted outside flowvault is refused; registering again is too."""
    made = world.definitions.register_definition(DEFINITION, {"nodes": [1]})
    version = world.digest(GRAPH_DEFINITION_VERSIONS, f"{DEFINITION}\x1f{made.version}")
    world.delete(GRAPH_DEFINITION_VERSIONS, version)
    _refused(lambda: world.definitions.get_definition(DEFINITION), DELETED)
    _refused(lambda: world.definitions.register_definition(DEFINITION, {"nodes": [1]}), DELETED)
    _refused(lambda: world.runs.start_run(DEFINITION, {"input": 1}, version=made.version), DELETED)
    world.delete(GRAPH_DEFINITIONS, world.digest(GRAPH_DEFINITIONS, DEFINITION))
    _refused(lambda: world.definitions.get_definition(DEFINITION), DELETED)
    _refused(lambda: world.definitions.register_definition(DEFINITION, {"nodes": [1]}), DELETED)
    _refused(lambda: world.runs.start_run(DEFINITION, {"input": 1}), DELETED)
    assert len(world.events(_definition_stream(world))) == 1
    with pytest.raises(NotFound):
        world.definitions.get_definition("otherdef")


def test_a_definition_head_rewritten_during_a_read_is_no_false_alarm(world: World) -> None:
    """A read that met the head just before a registration rewrote it reads again."""
    world.definitions.register_definition(DEFINITION, {"nodes": [1]})
    older = world.row(GRAPH_DEFINITIONS, DEFINITION)
    second = world.definitions.register_definition(DEFINITION, {"nodes": [2]})
    racing, repository = _racing(world, older)
    service = DefinitionRegistry(repository, world.clock)
    assert service.get_definition(DEFINITION)[0] == second
    assert racing.served == 1


def test_a_head_put_back_from_before_a_run_start_is_refused(world: World) -> None:
    """The same content, one revision older: the start's ``definition.referenced`` rewrote it."""
    world.definitions.register_definition(DEFINITION, {"nodes": [1]})
    older = world.row(GRAPH_DEFINITIONS, DEFINITION)
    world.runs.start_run(DEFINITION, {"input": 1})
    world.replay(older)
    _refused(lambda: world.definitions.get_definition(DEFINITION), STALE)
    _refused(lambda: world.runs.start_run(DEFINITION, {"input": 2}), STALE)
    assert {(found.namespace, found.key_digest) for found in world.audit().run().stale} == {
        (GRAPH_DEFINITIONS, older.metadata.key_digest)
    }


# -- run results ---------------------------------------------------------------------


def test_each_save_of_a_run_result_names_its_record_stream_event(world: World) -> None:
    """A save appends ``result.saved`` naming the row, and the row's header names it."""
    world.results.save(world.result("failed"))
    world.results.save(world.result())
    digest = world.digest(RUNS, RESULT_RUN)
    events = world.events(record_stream(RESULT_KIND, digest))
    assert [e.type for e in events] == ["result.saved"] * 2
    assert all(e.payload == {"records": [digest]} for e in events)
    assert all(mac_matches(e, world.repository) for e in events)
    assert world.row(RUNS, RESULT_RUN).metadata.header.ledger_index == 1
    assert world.results.load(RESULT_RUN).status == "completed"


def test_an_older_run_result_put_back_is_refused_by_load_and_list(world: World) -> None:
    """The failed result saved first opens, but a later save of its stream replaced it."""
    world.results.save(world.result("failed"))
    older = world.row(RUNS, RESULT_RUN)
    world.results.save(world.result())
    world.replay(older)
    failure = _refused(lambda: world.results.load(RESULT_RUN), STALE)
    assert failure.details["ledger_index"] == 0
    listed = world.results.list()
    assert listed.items == ()
    assert listed.unreadable == (UnreadableItem(older.metadata.key_digest, "INTEGRITY_FAILURE"),)


def test_a_deleted_run_result_is_refused_not_read_as_never_saved(world: World) -> None:
    """Its record stream records a save: the absence is tampering, not NOT_FOUND."""
    world.results.save(world.result())
    world.delete(RUNS, world.digest(RUNS, RESULT_RUN))
    _refused(lambda: world.results.load(RESULT_RUN), DELETED)
    assert world.results.list().items == ()
    with pytest.raises(NotFound):
        world.results.load("run-never-saved")


def test_a_run_result_rewritten_during_a_read_is_no_false_alarm(world: World) -> None:
    """A load or a listing that met the row just before a save reads it again."""
    world.results.save(world.result("failed"))
    older = world.row(RUNS, RESULT_RUN)
    world.results.save(world.result())
    for read in ("load", "list"):
        racing, repository = _racing(world, older)
        results = ResultRepository(repository)
        found = results.load(RESULT_RUN) if read == "load" else results.list().items[0]
        assert found.status == "completed"
        assert racing.served == 1


# -- the full audit and what the events carry ---------------------------------------


def test_a_full_audit_finds_replays_and_deletions_of_every_kind(world: World) -> None:
    """``LedgerAudit`` with bound records reports each tampered row of these kinds in ``stale``.

    Legitimate removals (a purged action result, a deleted definition, a
    purged run) leave it ok.
    """
    workflow_id, older_result, _ = _replaced_result(world)
    run_id = world.finished_run()
    older_head = world.row(GRAPH_DEFINITIONS, DEFINITION)
    world.definitions.register_definition(DEFINITION, {"nodes": [2]}, overwrite=True)
    world.results.save(world.result("failed"))
    older_saved = world.row(RUNS, RESULT_RUN)
    world.results.save(world.result())
    world.definitions.register_definition("gonedef", {"nodes": []})
    world.definitions.delete_definition("gonedef")
    world.action_results.put_action_result(
        workflow_id, content_hash("b"), {"v": 1}, retention=SECOND
    )
    world.clock.advance(2 * SECOND)
    assert world.action_results.purge_expired() == 1
    assert purge_finished_runs(world.repository, world.clock, world.clock.now(), SECOND) == 1
    assert world.audit().run().ok

    world.replay(older_result)
    world.replay(older_head)
    world.replay(older_saved)
    receipt = world.digest(GRAPH_RUN_RECEIPTS, run_id)
    world.delete(GRAPH_RUN_RECEIPTS, receipt)
    version = world.store.list(GRAPH_DEFINITION_VERSIONS, limit=1).items[0].key_digest
    world.delete(GRAPH_DEFINITION_VERSIONS, version)
    report = world.audit().run()
    assert not report.ok
    assert all(stream.ok for stream in report.streams)
    found = {(stale.namespace, stale.key_digest) for stale in report.stale}
    assert found == {
        (ACTION_RESULTS, older_result.metadata.key_digest),
        (GRAPH_DEFINITIONS, older_head.metadata.key_digest),
        (RUNS, older_saved.metadata.key_digest),
        (None, receipt),
        (None, version),
    }


class _CountingReads(PassThroughStore):
    """Counts the ledger pages read from the start of each stream."""

    def __init__(self, inner: SecureObjectStore) -> None:
        super().__init__(inner)
        self.from_start: Counter[str] = Counter()

    def read_ledger(self, stream: str, *, from_index: int, limit: int) -> LedgerPage:
        if from_index == 0:
            self.from_start[stream] += 1
        return self._inner.read_ledger(stream, from_index=from_index, limit=limit)


def test_a_full_audit_reads_each_stream_once(world: World) -> None:
    """Records are held to the events the audit has just verified, not to a second read."""
    _replaced_result(world)
    world.finished_run()
    world.results.save(world.result())
    counting = _CountingReads(world.store)
    repository = SealedRepository(
        counting, AesGcmCipher(KEY), world.clock, capabilities=world.repository.capabilities
    )
    bound = BoundRecords(
        repository,
        workflow_services(repository, world.clock, SequentialIds("wf")).workflows,
        graph_runs(repository, world.clock, SequentialIds("run")),
    )
    report = LedgerAudit(counting, repository, bound).run()
    assert report.ok
    streams = [audit.stream for audit in report.streams]
    assert any(BoundRecords.reads_events(stream) for stream in streams)
    assert dict(counting.from_start) == dict.fromkeys(streams, 1)


def test_every_new_event_is_keyed_and_names_only_digests(world: World) -> None:
    """The events these kinds write carry their chain MAC and no natural key or payload."""
    workflow_id = world.workflow()
    world.action_results.put_action_result(workflow_id, ACTION, {"v": SECRET})
    world.finished_run()
    world.results.save(world.result())
    world.definitions.register_definition("otherdef", {"nodes": []})
    world.definitions.delete_definition("otherdef")
    kinds = (ACTION_RESULT_KIND, DEFINITION_KIND, RESULT_KIND, "run")
    streams = [name for name in list_all_streams(world.store) if name.split("/")[0] in kinds]
    assert len(streams) == 5
    for name in streams:
        for text in (SECRET, DEFINITION, "otherdef", RESULT_RUN, workflow_id):
            assert text not in name
        for event in world.events(name):
            assert mac_matches(event, world.repository)
            for text in (SECRET, DEFINITION, "otherdef", RESULT_RUN):
                assert text not in canonical_json(event.payload)
