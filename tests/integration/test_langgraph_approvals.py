"""A graph's ``interrupt()`` answered through a flowvault approval: who decided is on record."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from refund_graph import build

from flowvault.adapters.langgraph import FlowvaultSaver, GraphApprovals
from flowvault.composition import Settings, bootstrap
from flowvault.domain import ApprovalStatus, InvalidInput

KEY = secrets.token_bytes(32)


@pytest.mark.parametrize(
    ("decision", "result", "run_status"),
    [
        ("approve", "refunded", "completed"),
        ("reject", "declined", "cancelled"),
    ],
)
def test_a_decision_resumes_the_graph_and_ends_its_run_with_a_receipt(
    tmp_path: Path, decision: str, result: str, run_status: str
) -> None:
    """The pause becomes an approval; deciding it gives the resume command and a receipt."""
    config: Any = {"configurable": {"thread_id": "refund-7"}}
    with bootstrap(Settings(backend="sqlite", home=tmp_path), key=KEY, create=True) as runtime:
        graph = build().compile(checkpointer=FlowvaultSaver.from_runtime(runtime))
        graph.invoke({"order": "7"}, config)
        paused = graph.get_state(config)
        assert paused.next == ("approve",)
        approvals = GraphApprovals(runtime)
        approval = approvals.request(paused.config, audience="finance", prompt="Refund order 7?")
        assert (
            approvals.request(paused.config, audience="finance", prompt="Refund order 7?")
            == approval
        )
        decided = approvals.decide(approval.approval_id, decision, "ann@example.org")
        assert decided.command is not None
        assert decided.command.resume == decision
        assert decided.outcome.approval.actor == "ann@example.org"
        assert decided.outcome.approval.status is ApprovalStatus.DECIDED
        assert decided.receipt is not None
        assert decided.receipt.status == run_status
        assert runtime.runs.get_run(approval.run_id).status == run_status
        again = approvals.decide(approval.approval_id, decision, "ann@example.org")
        assert again.receipt == decided.receipt
        state = graph.invoke(decided.command, config)
        assert state["result"] == result
        receipt = runtime.approvals.approval_receipt(decided.outcome.approval)
        assert "ann@example.org" not in repr(receipt)


def test_a_config_without_a_checkpoint_is_refused() -> None:
    """Only a paused graph's own config names the pause to approve."""
    with (
        bootstrap(Settings(backend="memory"), key=KEY) as runtime,
        pytest.raises(InvalidInput, match="get_state"),
    ):
        GraphApprovals(runtime).request(
            {"configurable": {"thread_id": "t"}}, audience="a", prompt="p"
        )


def test_the_saver_imports_without_the_graph_package() -> None:
    """``flowvault[langgraph]`` brings langgraph-checkpoint only; the saver must not need more."""
    blocked = (
        "import sys; sys.modules['langgraph.types'] = None; sys.modules['langgraph.graph'] = None\n"
    )
    script = (
        blocked
        + "from flowvault.adapters.langgraph import FlowvaultSaver, GraphApprovals\nprint('ok')"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert (ran.returncode, ran.stdout.strip()) == (0, "ok"), ran.stderr
