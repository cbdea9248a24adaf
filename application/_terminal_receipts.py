"""Terminal receipts: the keyed, optionally Ed25519-signed proof of how a run ended.

A receipt is written in the unit of work that ends its run, and never
rewritten: the run's ``run.<status>`` event names the receipt's key digest,
and the receipt's row names that event, so a receipt deleted outside
flowvault is refused, not read as never issued.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from flowvault.application._freshness import StreamPolicy, leaves_unnamed
from flowvault.application._graph_namespaces import GRAPH_RUN_RECEIPTS, GRAPH_RUNS
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._receipts import ReceiptSigner, sign_terminal_receipt
from flowvault.application._records import Guard, Upsert
from flowvault.application._sealed import SealedDocument, SealedRepository
from flowvault.application._streams import run_stream
from flowvault.domain import (
    GraphRun,
    IntegrityFailure,
    InvalidInput,
    JsonValue,
    LedgerEvent,
    NotFound,
    TerminalReceipt,
    content_hash,
)
from flowvault.domain._canonical import canonical_bytes

_FINAL_STATE_TAG = "flowvault.run-final-state/1"
_RECEIPT_TAG = "flowvault.run-receipt/1"
_UNSIGNED = "sha256:" + "0" * 64


@dataclass(frozen=True, slots=True)
class IssuedReceipt:
    """A run's receipt and the row write that stores it with the run's ending."""

    receipt: TerminalReceipt
    upsert: Upsert


class TerminalReceipts:
    """Build, MAC, sign and verify the receipts of runs' endings.

    ``digester`` MACs each receipt and digests final states under the
    integrity key; ``signer``, an Ed25519 key, also signs each receipt, so
    that it can be checked with the public key alone.
    """

    def __init__(
        self,
        repository: SealedRepository,
        digester: KeyedDigester,
        *,
        signer: ReceiptSigner | None = None,
    ) -> None:
        self._repo = repository
        self._digester = digester
        self._signer = signer
        self._fresh = StreamPolicy[SealedDocument](
            "terminal receipt",
            repository,
            leaves_record=leaves_unnamed,
        )

    def final_state_digest(self, final_state: JsonValue) -> str:
        """Return the keyed digest of a run's final state, as its ending event records it."""
        return self._digester.keyed_digest(_FINAL_STATE_TAG, canonical_bytes(final_state))

    def receipt_digest(self, run_id: str) -> str:
        """Return the key digest of a run's receipt row, as its ending event names it."""
        return self._repo.key_digest(GRAPH_RUN_RECEIPTS, run_id)

    def issue(
        self, run: GraphRun, final_digest: str, appended: Sequence[LedgerEvent], issued_at: datetime
    ) -> IssuedReceipt:
        """Return the receipt of ``run``'s ending and its row, bound to the last event appended.

        ``appended`` are the events the ending unit appends (the caller's,
        then ``run.<status>``); the receipt's ``events_digest`` covers their
        hashes, and the last one commits to the run's whole chain.
        """
        draft = TerminalReceipt(
            issued_at=issued_at,
            run=self._repo.key_digest(GRAPH_RUNS, run.run_id),
            status=run.status,
            definition_version=run.definition_version,
            final_state_digest=final_digest,
            events_digest=content_hash([event.event_hash for event in appended]),
            event_count=len(appended),
            signature=_UNSIGNED,
        )
        if self._signer is not None:
            draft = sign_terminal_receipt(draft, self._signer)
        receipt = draft.model_copy(update={"signature": self._signature(draft)})
        upsert = self._repo.prepare(
            GRAPH_RUN_RECEIPTS,
            run.run_id,
            receipt.model_dump(mode="json", exclude_none=True),
            expected=Guard.ABSENT,
            ledger_index=appended[-1].index,
        )
        return IssuedReceipt(receipt, upsert)

    def terminal_receipt(self, run_id: str) -> TerminalReceipt:
        """Return a finished run's receipt after checking its signature and its run.

        Raises:
            IntegrityFailure: the signature or the run digest does not verify,
                the row names another event than the run's stream says wrote
                it, or it is missing although that event records it.
            NotFound: the run has no receipt.

        """
        row = (GRAPH_RUN_RECEIPTS, self.receipt_digest(run_id))
        opened = self._fresh.read_vouched(
            self._repo.store,
            run_stream(run_id),
            row,
            lambda: self._repo.read(GRAPH_RUN_RECEIPTS, run_id),
        )
        if opened is None:
            raise NotFound("run has no terminal receipt", run_id=run_id)
        try:
            receipt = TerminalReceipt.model_validate(opened.document)
        except InvalidInput:
            raise IntegrityFailure("sealed terminal receipt has an unexpected shape") from None
        if not hmac.compare_digest(self._signature(receipt), receipt.signature):
            raise IntegrityFailure("terminal receipt signature does not verify", run_id=run_id)
        if receipt.run != self._repo.key_digest(GRAPH_RUNS, run_id):
            raise IntegrityFailure("terminal receipt names another run", run_id=run_id)
        return receipt

    def _signature(self, receipt: TerminalReceipt) -> str:
        body = canonical_bytes(receipt.unsigned_body())
        return self._digester.keyed_digest(_RECEIPT_TAG, body)
