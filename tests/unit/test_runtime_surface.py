"""The runtime's short paths: settings from plain strings, typed state, the approval flow."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from flowvault.application import ApprovalFlow, ApprovalOutcome
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    ApprovalStatus,
    CheckpointStatus,
    FlowvaultError,
    InvalidInput,
    InvalidTransition,
    StoreUnavailable,
    WorkflowState,
)

ROOT = Path(__file__).resolve().parents[2]


class Cart(BaseModel):
    items: list[str] = []


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Runtime]:
    """Yield a runtime on a fresh SQLite store."""
    with bootstrap(Settings(home=tmp_path / "home"), create=True) as runtime:
        yield runtime


def _running_run(vault: Runtime) -> str:
    vault.definitions.register_definition("wire.send", {"nodes": ["draft", "send"]})
    run, _ = vault.runs.start_run("wire.send", {"amount": 900})
    vault.runs.set_status(run.run_id, "running", expected_status="accepted")
    return run.run_id


def _contents(vault: Runtime) -> tuple[dict[str, int], list[tuple[str, int | None]]]:
    stats = vault.store.namespace_counts()  # type: ignore[attr-defined]
    heads = [
        (name, getattr(vault.store.ledger_head(name), "index", None))
        for name in vault.store.list_streams(limit=200)  # type: ignore[attr-defined]
    ]
    return dict(stats), heads


def test_settings_take_plain_strings_for_paths(tmp_path: Path) -> None:
    """``Settings(home="...")`` validates to a ``Path``, as do the key and mark files."""
    settings = Settings(
        home=str(tmp_path / "home"),
        key_file=str(tmp_path / "keys" / "store.key"),
        signing_key_file=str(tmp_path / "keys" / "signing.pem"),
        high_water_file=str(tmp_path / "mark"),
    )
    assert settings.home == tmp_path / "home"
    assert isinstance(settings.key_file, Path)
    assert settings.key_path == tmp_path / "keys" / "store.key"
    assert settings.high_water_path == tmp_path / "mark"
    with pytest.raises(InvalidInput):
        Settings(key_file="..")


def test_settings_typed_initialiser_names_every_field_with_its_default() -> None:
    """The initialiser a type checker sees lists exactly the model's fields, all optional."""
    tree = ast.parse((ROOT / "composition" / "_settings.py").read_text(encoding="utf-8"))
    (settings,) = [
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Settings"
    ]
    (init,) = [
        node
        for block in settings.body
        if isinstance(block, ast.If)
        for node in block.body
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    ]
    names = [arg.arg for arg in init.args.kwonlyargs]
    assert names == list(Settings.model_fields)
    assert all(default is not None for default in init.args.kw_defaults)


def test_runtime_state_takes_a_model(vault: Runtime) -> None:
    """``vault.state(scope, model=Cart)`` loads and saves ``Cart``; else ``WorkflowState``."""
    carts = vault.state("cart-17", model=Cart)
    assert carts.load().state == Cart()
    assert carts.load().revision is None
    assert carts.save(Cart(items=["paper"])) == 1
    loaded: Cart = carts.load().state
    assert loaded == Cart(items=["paper"])
    assert isinstance(vault.state("main").load().state, WorkflowState)
    with pytest.raises(InvalidInput):
        carts.save(WorkflowState())  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        vault.state("cart-17", model=dict)  # type: ignore[type-var]


def test_pause_for_approval_checkpoints_requests_and_waits(vault: Runtime) -> None:
    """One call: a checkpoint, an approval bound to it, and the run ``awaiting_approval``."""
    run_id = _running_run(vault)
    flow = vault.approval_flow
    assert isinstance(flow, ApprovalFlow)
    approval = flow.pause_for_approval(
        run_id, {"node": "send"}, state={"draft": 1}, audience="finance", prompt="Send?"
    )
    assert approval.status is ApprovalStatus.PENDING
    assert approval.run_id == run_id
    checkpoint = vault.checkpoints.load_checkpoint(approval.checkpoint_id)
    assert (checkpoint.next_cursor, checkpoint.state) == ({"node": "send"}, {"draft": 1})
    assert approval.expires_at == checkpoint.created_at + timedelta(days=1)
    assert vault.runs.get_run(run_id).status == "awaiting_approval"
    types = [event.type for event in vault.runs.read_run_events(run_id).events]
    assert types[-1] == "run.awaiting_approval"
    again = flow.pause_for_approval(
        run_id, {"node": "send"}, state={"draft": 1}, audience="finance", prompt="Send?"
    )
    assert again == approval  # a retry completes the pause, it does not refuse it


def test_decide_and_resume_moves_an_approved_run_on(vault: Runtime) -> None:
    """Approve: the checkpoint is consumed, the run is ``running`` and ``resume_from`` is set."""
    run_id = _running_run(vault)
    flow = vault.approval_flow
    approval = flow.pause_for_approval(run_id, "send", audience="finance", prompt="Send?")
    outcome = flow.decide_and_resume(approval.approval_id, "approve", "ann@example.org")
    assert isinstance(outcome, ApprovalOutcome)
    assert outcome.approved
    assert outcome.run.status == "running" == vault.runs.get_run(run_id).status
    assert outcome.resume_from is not None
    assert outcome.resume_from.status is CheckpointStatus.CONSUMED
    assert outcome.resume_from.next_cursor == "send"
    types = [event.type for event in vault.runs.read_run_events(run_id).events]
    assert types[-2:] == ["approval.decided", "run.running"]
    before = _contents(vault)
    assert flow.decide_and_resume(approval.approval_id, "approve", "ann@example.org") == outcome
    assert _contents(vault) == before  # a retry writes nothing
    receipt = vault.approvals.approval_receipt(outcome.approval)
    assert "ann@example.org" not in receipt.model_dump_json()


def test_a_rejected_run_waits_for_the_host(vault: Runtime) -> None:
    """Reject: recorded, nothing to resume, and the run is left for the host to end."""
    run_id = _running_run(vault)
    flow = vault.approval_flow
    approval = flow.pause_for_approval(run_id, "send", audience="finance", prompt="Send?")
    outcome = flow.decide_and_resume(approval.approval_id, "reject", "ann@example.org")
    assert not outcome.approved
    assert outcome.resume_from is None
    assert outcome.approval.decision == "reject"
    assert outcome.run.status == "awaiting_approval"
    vault.runs.finish_run(
        run_id, "cancelled", expected_status="awaiting_approval", final_state=None
    )


@pytest.mark.parametrize(
    ("arguments", "refusal"),
    [
        ({"audience": ""}, InvalidInput),
        ({"audience": 7}, InvalidInput),
        ({"prompt": b"bytes"}, InvalidInput),
        ({"allowed_decisions": "approve"}, InvalidInput),
        ({"allowed_decisions": ["Approve!"]}, InvalidInput),
        ({"expires_in": timedelta(0)}, InvalidInput),
        ({"expires_in": 60}, InvalidInput),
    ],
)
def test_pause_refuses_bad_input_before_writing(
    vault: Runtime, arguments: dict[str, object], refusal: type[FlowvaultError]
) -> None:
    """A malformed argument is refused before the checkpoint is written, so nothing is left."""
    run_id = _running_run(vault)
    before = _contents(vault)
    call = {"audience": "finance", "prompt": "Send?", **arguments}
    with pytest.raises(refusal):
        vault.approval_flow.pause_for_approval(run_id, "send", **call)  # type: ignore[arg-type]
    assert _contents(vault) == before


def test_pause_refuses_a_run_that_cannot_wait_before_writing(vault: Runtime) -> None:
    """A run not yet running cannot wait for approval: refused before any write."""
    vault.definitions.register_definition("wire.send", {"nodes": ["send"]})
    run, _ = vault.runs.start_run("wire.send", {"amount": 1})
    before = _contents(vault)
    with pytest.raises(InvalidTransition):
        vault.approval_flow.pause_for_approval(run.run_id, "send", audience="a", prompt="p")
    assert _contents(vault) == before


def test_a_pause_cut_short_is_finished_by_the_same_call(
    vault: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status change fails after the checkpoint and request: calling again completes it."""
    run_id = _running_run(vault)
    set_status = vault.runs.set_status

    def failing(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("injected: the store went away")

    monkeypatch.setattr(vault.runs, "set_status", failing)
    with pytest.raises(StoreUnavailable):
        vault.approval_flow.pause_for_approval(run_id, "send", audience="ops", prompt="Go?")
    assert vault.runs.get_run(run_id).status == "running"
    monkeypatch.setattr(vault.runs, "set_status", set_status)
    approval = vault.approval_flow.pause_for_approval(run_id, "send", audience="ops", prompt="Go?")
    assert vault.runs.get_run(run_id).status == "awaiting_approval"
    pending = vault.approvals.list_approvals(run_id).items
    assert [a.approval_id for a in pending] == [approval.approval_id]
