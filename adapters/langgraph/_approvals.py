"""A graph's ``interrupt()`` answered through a flowvault approval, so who decided is on record.

LangGraph resumes a paused thread with whatever ``Command(resume=...)`` is
given; nothing records who answered. ``GraphApprovals`` puts a flowvault
approval in between: the pause becomes a run waiting on an approval bound
to a checkpoint, the answer a decision by a named actor (with its keyed
digests in the ledger), and only then the resume command. The run is
ended in the same call, with its signed terminal receipt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol

from langchain_core.runnables import RunnableConfig

from flowvault.application import (
    ApprovalFlow,
    ApprovalOutcome,
    DefinitionRegistry,
    RunService,
    SealedRepository,
    TerminalReceipts,
)
from flowvault.domain import Approval, ApprovalStatus, InvalidInput, JsonValue, TerminalReceipt
from flowvault.domain._graph_runs import RUN_LIFECYCLE

if TYPE_CHECKING:
    from langgraph.types import Command

DEFINITION_ID: Final = "langgraph.interrupt"
"""The definition every interrupt's run follows: a pause for one decision."""
_SPEC: Final[dict[str, JsonValue]] = {"kind": "langgraph-interrupt", "version": 1}
_THREAD_TAG: Final = "flowvault.langgraph-approval-thread/1"
"""Tag of the keyed digest that names a thread in its approval run, so its id stays sealed."""
APPROVE: Final = "approve"


class ApprovalRuntime(Protocol):
    """What ``GraphApprovals`` needs of a flowvault runtime (``bootstrap(...)`` gives all of it)."""

    @property
    def repository(self) -> SealedRepository: ...

    @property
    def definitions(self) -> DefinitionRegistry: ...

    @property
    def runs(self) -> RunService: ...

    @property
    def approval_flow(self) -> ApprovalFlow: ...

    @property
    def receipts(self) -> TerminalReceipts: ...


@dataclass(frozen=True, slots=True)
class GraphDecision:
    """A decision on an interrupt: the command that resumes the graph, and the record of it."""

    outcome: ApprovalOutcome
    receipt: TerminalReceipt | None
    """The ended run's receipt; ``None`` while a quorum still collects votes."""

    @property
    def command(self) -> Command[Any] | None:
        """``Command(resume=decision)`` once the approval is settled; ``None`` before."""
        from langgraph.types import Command  # noqa: PLC0415 - the graph package, not the saver's

        approval = self.outcome.approval
        if approval.status is not ApprovalStatus.DECIDED:
            return None
        return Command(resume=approval.decision)


class GraphApprovals:
    """Ask for, and record, the decision a graph waits for at its ``interrupt()``."""

    def __init__(self, runtime: ApprovalRuntime) -> None:
        self._repo = runtime.repository
        self._definitions = runtime.definitions
        self._runs = runtime.runs
        self._flow = runtime.approval_flow
        self._receipts = runtime.receipts

    def request(
        self,
        config: RunnableConfig,
        *,
        audience: str,
        prompt: str,
        allowed_decisions: Sequence[str] = (APPROVE, "reject"),
        expires_in: timedelta = timedelta(days=1),
    ) -> Approval:
        """Record that the paused checkpoint ``config`` names waits for ``audience``'s decision.

        ``config`` is the paused graph's (``graph.get_state(config).config``):
        its thread and checkpoint id name the pause, so asking again for the
        same pause returns the same approval. ``prompt`` is stored only as a
        digest.

        Raises:
            InvalidInput: ``config`` names no thread and checkpoint.
            Any error of ``ApprovalFlow.pause_for_approval``.

        """
        thread, checkpoint_id = _pause(config)
        self._definitions.register_definition(DEFINITION_ID, dict(_SPEC))
        thread_digest = self._repo.keyed_digest(_THREAD_TAG, thread)
        run, _ = self._runs.start_run(
            DEFINITION_ID,
            {"thread": thread_digest, "checkpoint_id": checkpoint_id},
            idempotency_key=f"{thread_digest}/{checkpoint_id}",
        )
        if run.status == "accepted":
            run = self._runs.set_status(run.run_id, "running", expected_status="accepted")
        return self._flow.pause_for_approval(
            run.run_id,
            {"checkpoint_id": checkpoint_id},
            audience=audience,
            prompt=prompt,
            allowed_decisions=allowed_decisions,
            expires_in=expires_in,
        )

    def decide(
        self, approval_id: str, decision: str, actor: str, *, signature: bytes | None = None
    ) -> GraphDecision:
        """Record ``actor``'s decision and, once it settles, end the run and give the command.

        An approval settled as ``approve`` ends its run ``completed``; any
        other decision ends it ``cancelled``. Either way ``command`` resumes
        the graph with the decision, which ``interrupt()`` then returns.
        The same call again (a retry after a lost reply) returns the same
        decision and receipt and writes nothing new.

        Raises:
            Any error of ``ApprovalFlow.decide_and_resume`` (an expired or
            already decided approval, a decision not allowed, ...).

        """
        outcome = self._flow.decide_and_resume(approval_id, decision, actor, signature=signature)
        approval = outcome.approval
        if approval.status is not ApprovalStatus.DECIDED:
            return GraphDecision(outcome, None)
        run = self._runs.get_run(approval.run_id)
        if run.status in RUN_LIFECYCLE.terminal:
            return GraphDecision(outcome, self._receipts.terminal_receipt(run.run_id))
        receipt = self._runs.finish_run(
            run.run_id,
            "completed" if outcome.approved else "cancelled",
            expected_status=run.status,
            final_state={"decision": approval.decision},
        )
        return GraphDecision(outcome, receipt)


def _pause(config: RunnableConfig) -> tuple[str, str]:
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    if not isinstance(configurable, Mapping):
        configurable = {}
    thread, checkpoint_id = configurable.get("thread_id"), configurable.get("checkpoint_id")
    if not (
        isinstance(thread, str) and thread and isinstance(checkpoint_id, str) and checkpoint_id
    ):
        raise InvalidInput(
            "request() takes the paused graph's config, with its thread_id and checkpoint_id "
            "(graph.get_state(config).config)"
        )
    return thread, checkpoint_id
