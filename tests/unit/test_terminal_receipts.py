"""Terminal receipts on every path that ends a run, and their Ed25519 signatures.

Each scenario runs on memory, a real SQLite file and PostgreSQL. Whatever
call ends a run (``finish_run``, ``set_status`` to a terminal status,
``recover_incomplete_runs``), the unit that ends it writes the receipt; a
signing key makes the receipt checkable with the public key alone.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from graph_services import graph_runs

from flowvault.adapters.crypto import AesGcmCipher, Ed25519ReceiptSigner
from flowvault.application import (
    DefinitionRegistry,
    RunService,
    SealedRepository,
    SecureObjectStore,
    TerminalReceipts,
    UnitOfWork,
    authenticate_terminal,
)
from flowvault.application._graph_namespaces import GRAPH_RUN_RECEIPTS, GRAPH_RUNS
from flowvault.application._receipts import authenticate, issue_receipt, sign_terminal_receipt
from flowvault.application._streams import read_stream, run_stream
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    TerminalReceipt,
    content_hash,
    parse_terminal_receipt,
)
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._graph_runs import RUN_LIFECYCLE
from flowvault.domain._receipt import HeadReceipt, ReceiptSignature

KEY = bytes(range(32))
INPUT_MARKER = "input-marker-5d21-do-not-leak"
FINAL_MARKER = "final-marker-e0c4-do-not-leak"
TERMINAL = sorted(RUN_LIFECYCLE.terminal)


class CrashingStore:
    """A store that raises on a chosen unit of work before delegating: an injected fault."""

    def __init__(self, inner: SecureObjectStore, when: Callable[[UnitOfWork], bool]) -> None:
        self._inner = inner
        self._when = when

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def commit(self, unit: UnitOfWork) -> None:
        if self._when(unit):
            raise RuntimeError("injected fault")
        self._inner.commit(unit)


def _holds_receipt(unit: UnitOfWork) -> bool:
    return any(upsert.header.namespace == GRAPH_RUN_RECEIPTS for upsert in unit.upserts)


class World:
    """A run service over one store, signing with a fresh Ed25519 key."""

    def __init__(self, store: SecureObjectStore) -> None:
        self.store = store
        self.clock = FrozenClock()
        self.repository = SealedRepository(store, AesGcmCipher(KEY), self.clock)
        self.signer = Ed25519ReceiptSigner(Ed25519PrivateKey.generate())
        self.service = self.service_over(self.repository, signer=self.signer)
        self.receipts = TerminalReceipts(self.repository, self.repository, signer=self.signer)
        DefinitionRegistry(self.repository, self.clock).register_definition(
            "triage", {"nodes": ["plan", "act"]}
        )

    def service_over(
        self, repository: SealedRepository, *, signer: Ed25519ReceiptSigner | None = None
    ) -> RunService:
        return graph_runs(repository, self.clock, SequentialIds("run"), signer=signer)

    def crashing(self, when: Callable[[UnitOfWork], bool]) -> RunService:
        store = CrashingStore(self.store, when)
        repository = SealedRepository(store, AesGcmCipher(KEY), self.clock)  # type: ignore[arg-type]
        return self.service_over(repository, signer=self.signer)

    def start(self, service: RunService | None = None) -> str:
        run, _ = (service or self.service).start_run("triage", {"ask": INPUT_MARKER})
        return run.run_id

    def running(self, service: RunService | None = None) -> str:
        run_id = self.start(service)
        (service or self.service).set_status(run_id, "running", expected_status="accepted")
        return run_id

    def events(self, run_id: str) -> list[LedgerEvent]:
        return list(read_stream(self.store, run_stream(run_id)))

    def visible(self, run_id: str) -> tuple[object, ...]:
        """Everything a failed call must leave exactly as it was."""
        rows = tuple(
            self.store.list(space, limit=200) for space in (GRAPH_RUNS, GRAPH_RUN_RECEIPTS)
        )
        return (*rows, tuple(self.events(run_id)))


@pytest.fixture
def world(backend_store: SecureObjectStore) -> World:
    """Provide a fresh world with one registered definition on each backend."""
    return World(backend_store)


def _assert_ended_with_receipt(world: World, run_id: str, status: str) -> TerminalReceipt:
    """Check the receipt verifies, covers the ``run.<status>`` event, and that event names it."""
    receipt = world.receipts.terminal_receipt(run_id)
    ended = world.events(run_id)[-1]
    assert (receipt.status, ended.type, ended.to_state) == (status, f"run.{status}", status)
    assert receipt.event_count == 1
    assert receipt.events_digest == content_hash([ended.event_hash])
    assert receipt.issued_at == world.service.get_run(run_id).finished_at
    assert isinstance(ended.payload, dict)
    digest = world.repository.key_digest(GRAPH_RUN_RECEIPTS, run_id)
    assert ended.payload["records"] == [digest]
    assert ended.payload["final_state_digest"] == receipt.final_state_digest
    authenticate_terminal(receipt, world.signer.verifier())
    return receipt


@pytest.mark.parametrize("status", TERMINAL)
def test_set_status_to_a_terminal_status_writes_a_receipt(world: World, status: str) -> None:
    """Ending a run through set_status writes the same kind of receipt finish_run does."""
    run_id = world.running()
    world.service.set_status(run_id, status, expected_status="running", payload={"why": "x"})
    receipt = _assert_ended_with_receipt(world, run_id, status)
    ended = world.events(run_id)[-1]
    assert isinstance(ended.payload, dict)
    assert ended.payload["detail"] == {"why": "x"}
    assert receipt.final_state_digest == world.repository.keyed_digest(
        "flowvault.run-final-state/1", canonical_bytes(None)
    )


@pytest.mark.parametrize("status", TERMINAL)
def test_finish_run_writes_a_signed_receipt_for_every_terminal_status(
    world: World, status: str
) -> None:
    """Every terminal status finish_run takes gets a receipt the public key checks."""
    run_id = world.running()
    returned = world.service.finish_run(
        run_id, status, expected_status="running", final_state={"answer": FINAL_MARKER}
    )
    assert _assert_ended_with_receipt(world, run_id, status) == returned


def test_recovery_writes_a_receipt_for_every_run_it_interrupts(world: World) -> None:
    """Accepted and running runs each end interrupted with their receipt; others keep theirs."""
    accepted, running = world.start(), world.running()
    paused = world.running()
    world.service.set_status(paused, "awaiting_approval", expected_status="running")
    assert world.service.recover_incomplete_runs() == 2
    for run_id in (accepted, running):
        _assert_ended_with_receipt(world, run_id, "interrupted_non_resumable")
    assert world.service.get_run(paused).status == "awaiting_approval"
    assert len(world.store.list(GRAPH_RUN_RECEIPTS, limit=10).items) == 2


@pytest.mark.parametrize("status", TERMINAL)
def test_a_failed_commit_ending_a_run_writes_neither_status_nor_receipt(
    world: World, status: str
) -> None:
    """A fault on the unit ending the run leaves the run, its events and receipts untouched."""
    crashing = world.crashing(_holds_receipt)
    run_id = world.running()
    before = world.visible(run_id)
    with pytest.raises(RuntimeError, match="injected fault"):
        crashing.set_status(run_id, status, expected_status="running")
    assert world.visible(run_id) == before
    with pytest.raises(RuntimeError, match="injected fault"):
        crashing.finish_run(run_id, status, expected_status="running", final_state=None)
    assert world.visible(run_id) == before
    assert world.service.get_run(run_id).status == "running"


def test_recovery_interrupted_by_a_fault_leaves_the_run_as_it_was(world: World) -> None:
    """Recovery writes a run's status and receipt together or not at all."""
    crashing = world.crashing(_holds_receipt)
    run_id = world.running()
    before = world.visible(run_id)
    with pytest.raises(RuntimeError, match="injected fault"):
        crashing.recover_incomplete_runs()
    assert world.visible(run_id) == before


def test_only_endings_write_receipts_and_each_ending_writes_one(world: World) -> None:
    """Moves that do not end a run write no receipt; a terminal move and recovery each write one."""
    run_id = world.running()
    world.service.set_status(run_id, "checkpointed", expected_status="running")
    assert world.store.list(GRAPH_RUN_RECEIPTS, limit=10).items == ()
    world.service.set_status(run_id, "cancelled", expected_status="checkpointed")
    assert world.receipts.terminal_receipt(run_id).status == "cancelled"
    other = world.running()
    assert world.service.recover_incomplete_runs() == 1
    assert world.receipts.terminal_receipt(other).status == "interrupted_non_resumable"


def test_without_a_signer_receipts_carry_the_mac_only(world: World) -> None:
    """An unsigned receipt keeps the body it had before receipts could be signed."""
    unsigned = world.service_over(world.repository)
    run_id = world.running(unsigned)
    unsigned.set_status(run_id, "failed", expected_status="running")
    receipt = world.receipts.terminal_receipt(run_id)
    assert (receipt.signer_hint, receipt.ed25519_signature) == (None, None)
    assert set(receipt.body()) == {
        "kind",
        "issued_at",
        "run",
        "status",
        "definition_version",
        "final_state_digest",
        "events_digest",
        "event_count",
        "signature",
    }
    with pytest.raises(IntegrityFailure, match="issued without a signing key"):
        authenticate_terminal(receipt, world.signer.verifier())


def test_a_signed_receipt_round_trips_as_text_without_plaintext(world: World) -> None:
    """The text form parses back to the same receipt and names no run, input or state."""
    run_id = world.running()
    receipt = world.service.finish_run(
        run_id, "completed", expected_status="running", final_state={"answer": FINAL_MARKER}
    )
    text = receipt.text()
    assert parse_terminal_receipt(text) == receipt
    assert receipt.signer_hint == world.signer.hint.hex()
    for secret in (run_id, INPUT_MARKER, FINAL_MARKER):
        assert secret not in text


def _edited(receipt: TerminalReceipt, **changes: object) -> TerminalReceipt:
    return TerminalReceipt.model_validate({**receipt.model_dump(), **changes})


def test_an_edited_or_foreign_receipt_is_refused(world: World) -> None:
    """Any changed field, another key, or a signature re-spelt fails with INTEGRITY_FAILURE."""
    run_id = world.running()
    receipt = world.service.finish_run(
        run_id, "completed", expected_status="running", final_state=None
    )
    verifier = world.signer.verifier()
    authenticate_terminal(receipt, verifier)
    other = Ed25519ReceiptSigner(Ed25519PrivateKey.generate())
    edits = [
        _edited(receipt, status="failed"),
        _edited(receipt, event_count=2),
        _edited(receipt, final_state_digest=content_hash("other")),
        _edited(receipt, issued_at=receipt.issued_at.replace(year=2000)),
    ]
    for edited in edits:
        with pytest.raises(IntegrityFailure, match="altered or forged") as caught:
            authenticate_terminal(edited, verifier)
        assert caught.value.code == "INTEGRITY_FAILURE"
    with pytest.raises(IntegrityFailure, match="no flowvault-ed25519 signature for this key"):
        authenticate_terminal(receipt, other.verifier())
    rehinted = _edited(receipt, signer_hint=other.hint.hex())
    with pytest.raises(IntegrityFailure, match="altered or forged"):
        authenticate_terminal(rehinted, other.verifier())
    resigned = sign_terminal_receipt(_edited(receipt, status="failed"), other)
    authenticate_terminal(resigned, other.verifier())
    with pytest.raises(IntegrityFailure):
        authenticate_terminal(resigned, verifier)


def test_a_terminal_signature_is_bound_to_its_own_tag(world: World) -> None:
    """The signature covers the terminal tag, so it is no signature of the bare body."""
    run_id = world.running()
    receipt = world.service.finish_run(
        run_id, "cancelled", expected_status="running", final_state=None
    )
    assert receipt.ed25519_signature is not None
    raw = base64.b64decode(receipt.ed25519_signature)
    message = receipt.signed_message()
    assert message.startswith(b"flowvault.terminal-receipt/1\n")
    verifier = world.signer.verifier()
    assert verifier.verify(message, raw)
    assert not verifier.verify(canonical_bytes(receipt.unsigned_body()), raw)


def test_head_and_terminal_signatures_do_not_pass_for_each_other(world: World) -> None:
    """One key signs both kinds; neither kind's signature checks as the other's."""
    run_id = world.running()
    receipt = world.service.finish_run(
        run_id, "completed", expected_status="running", final_state=None
    )
    head = issue_receipt(
        world.store,
        world.repository,
        run_stream(run_id),
        issued_at=world.clock.now(),
        signers=(world.signer,),
    )
    verifier = world.signer.verifier()
    authenticate(head, verifier)
    head_line = head.signed_by(verifier.name, verifier.hint)[0]
    swapped = _edited(receipt, ed25519_signature=base64.b64encode(head_line.value).decode())
    with pytest.raises(IntegrityFailure, match="altered or forged"):
        authenticate_terminal(swapped, verifier)
    assert receipt.ed25519_signature is not None
    terminal_line = ReceiptSignature(
        verifier.name, verifier.hint, base64.b64decode(receipt.ed25519_signature)
    )
    with pytest.raises(IntegrityFailure, match="altered or forged"):
        authenticate(HeadReceipt(head.note, (terminal_line,)), verifier)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}\n",
        '{"kind":"head"}\n',
        "not json\n",
        '{"kind":"terminal"}',
    ],
)
def test_malformed_terminal_receipts_are_invalid_input(text: str) -> None:
    """Only a terminal receipt's canonical text parses."""
    with pytest.raises(InvalidInput):
        parse_terminal_receipt(text)


def test_a_receipt_in_any_but_its_canonical_spelling_is_invalid_input(world: World) -> None:
    """Whitespace or key order changed is refused, so a parsed receipt is the signed text."""
    run_id = world.running()
    text = world.service.finish_run(
        run_id, "completed", expected_status="running", final_state=None
    ).text()
    with pytest.raises(InvalidInput):
        parse_terminal_receipt(text.replace(",", ", ", 1))
    with pytest.raises(InvalidInput):
        parse_terminal_receipt(text + "\n")
