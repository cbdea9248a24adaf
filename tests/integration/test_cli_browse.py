"""The ``flowvault workflows|runs|approvals`` verbs, run as real console-script subprocesses.

Data is prepared in-process on a real SQLite home; every verb then runs as
a subprocess, and every output of every run is checked for the plaintext
markers planted in parameters, requesters, inputs, states, audiences,
actors and decisions.
"""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import time
from contextlib import closing
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from cli_helpers import FLOWVAULT, cli_env

from flowvault.adapters.cli._approvals import DecideRequest, approvals_decide_command
from flowvault.adapters.cli._io import CommandIO
from flowvault.application._graph_namespaces import GRAPH_RUNS
from flowvault.application._record_kinds import APPROVALS
from flowvault.application._workflow_records import WORKFLOWS
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import Approval, ApprovalStatus, InvalidInput, WorkOrder, content_hash

TIMEOUT = 60.0

PARAMETER = "param-marker-5c1e9a"
REQUESTER = "requester-marker-0b7d"
IDEMPOTENCY = "idem-marker-93fa"
STOP_REASON = "stop-marker-6d2c"
RUN_INPUT = "input-marker-a84f"
BUDGET = "budget-marker-71ce"
STATE = "state-marker-2e90"
FINAL_STATE = "final-marker-c3d5"
AUDIENCE = "audience-marker-4f18"
ACTOR = "actor-marker-d9b2"
APPROVE = "approve-qz7x"
REJECT = "reject-qz7x"
MARKERS = (
    PARAMETER, REQUESTER, IDEMPOTENCY, STOP_REASON, RUN_INPUT, BUDGET, STATE, FINAL_STATE,
    AUDIENCE, ACTOR, APPROVE, REJECT,
)  # fmt: skip


# -- helpers -------------------------------------------------------------------


def _run(tmp_path: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one verb; fail the test if any output carries a plaintext marker."""
    result = subprocess.run(
        [str(FLOWVAULT), "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        stdin=subprocess.DEVNULL,
        timeout=TIMEOUT,
        check=False,
    )
    for marker in MARKERS:
        assert marker not in result.stdout + result.stderr, (marker, args)
    return result


def _document(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    parsed = json.loads(lines[0])
    assert isinstance(parsed, dict)
    return parsed


def _rows(result: subprocess.CompletedProcess[str], key: str) -> list[dict[str, object]]:
    assert result.returncode == 0, result.stderr
    rows = _document(result)[key]
    assert isinstance(rows, list)
    return rows


def _error_code(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    error = _document(result)["error"]
    assert isinstance(error, dict)
    return str(error["code"])


def _settings(home: Path) -> Settings:
    return Settings(backend="sqlite", home=home)


def _order(key: str, kind: str = "invoice.review") -> WorkOrder:
    return WorkOrder(
        kind=kind,
        parameters={"secret": PARAMETER},
        requester=REQUESTER,
        idempotency_key=f"{IDEMPOTENCY}-{key}",
    )


@dataclass(frozen=True)
class Prepared:
    """The ids of what ``_prepare`` wrote."""

    open_workflow: str
    done_workflow: str
    paused_run: str
    finished_run: str
    approval: str
    spare_approval: str


def _request(runtime: Runtime, run_id: str, cursor: int, expires_in: timedelta) -> Approval:
    checkpoint = runtime.checkpoints.create_checkpoint(
        run_id,
        {"node": cursor},
        state={"draft": STATE},
        budgets={"tokens": BUDGET},
        counters={"nodes": cursor},
        dependency_summary={"tools": ["bank"]},
        terminal_cursor=None,
        event_cursor=cursor,
    )
    return runtime.approvals.request_approval(
        checkpoint.checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience=AUDIENCE,
        prompt_digest=content_hash("Pay the invoice?"),
        allowed_decisions=[APPROVE, REJECT],
        expires_at=runtime.clock.now() + expires_in,
    )


def _workflows(runtime: Runtime) -> tuple[str, str]:
    service = runtime.workflows
    open_one, _ = service.create(_order("open"))
    service.transition(
        open_one.workflow_id, "planning", expected_state="intake", expected_version=1
    )
    done, _ = service.create(_order("done", kind="report.build"))
    service.transition(
        done.workflow_id,
        "stopped",
        expected_state="intake",
        expected_version=1,
        stop_reason=STOP_REASON,
        output_content_hash=content_hash("out"),
    )
    return open_one.workflow_id, done.workflow_id


def _runs(runtime: Runtime) -> tuple[str, str]:
    runs = runtime.runs
    runtime.definitions.register_definition("invoice.pay", {"nodes": ["draft", "pay"]})
    paused, _ = runs.start_run("invoice.pay", {"invoice": RUN_INPUT}, budgets={"t": BUDGET})
    runs.set_status(paused.run_id, "running", expected_status="accepted")
    finished, _ = runs.start_run("invoice.pay", {"invoice": RUN_INPUT})
    runs.set_status(finished.run_id, "running", expected_status="accepted")
    runs.finish_run(
        finished.run_id, "completed", expected_status="running", final_state={"f": FINAL_STATE}
    )
    return paused.run_id, finished.run_id


def _prepare(home: Path) -> Prepared:
    with bootstrap(_settings(home), create=True) as runtime:
        open_workflow, done_workflow = _workflows(runtime)
        paused_run, finished_run = _runs(runtime)
        approval = _request(runtime, paused_run, 1, timedelta(hours=4))
        spare = _request(runtime, paused_run, 2, timedelta(hours=4))
        runtime.runs.set_status(paused_run, "awaiting_approval", expected_status="running")
    return Prepared(
        open_workflow=open_workflow,
        done_workflow=done_workflow,
        paused_run=paused_run,
        finished_run=finished_run,
        approval=approval.approval_id,
        spare_approval=spare.approval_id,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """Return a home that does not exist yet."""
    return tmp_path / "home"


@pytest.fixture
def prepared(home: Path) -> Prepared:
    """Prepare a home holding workflows, runs, checkpoints and approvals."""
    return _prepare(home)


# -- help and usage ------------------------------------------------------------

VERBS = [
    ["workflows", "list"],
    ["workflows", "show"],
    ["workflows", "events"],
    ["runs", "list"],
    ["runs", "show"],
    ["runs", "events"],
    ["approvals", "list"],
    ["approvals", "show"],
    ["approvals", "decide"],
]


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_every_verb_has_help_with_json_and_exit_codes(tmp_path: Path, verb: list[str]) -> None:
    """Each verb explains itself, offers --json and lists the exit codes."""
    result = _run(tmp_path, tmp_path / "home", *verb, "--help")
    assert result.returncode == 0, result.stderr
    assert "--json" in result.stdout
    assert "exit codes" in result.stdout
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "list", "--status", "bogus"],
        ["approvals", "list", "--limit", "many"],
        ["approvals", "decide", "a1", "--actor", "x"],
        ["workflows"],
    ],
    ids=" ".join,
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    """A bad status or limit, a missing required option or a missing leaf verb is a usage error."""
    assert _run(tmp_path, tmp_path / "home", *args).returncode == 2


# -- cold root -----------------------------------------------------------------

LISTS = [
    (["workflows", "list"], "workflows"),
    (["runs", "list", "--status", "running"], "runs"),
    (["approvals", "list", "--run", "run-1", "--status", "pending"], "approvals"),
]


@pytest.mark.parametrize(("args", "key"), LISTS, ids=["workflows", "runs", "approvals"])
def test_cold_root_lists_are_empty_and_create_nothing(
    tmp_path: Path, args: list[str], key: str
) -> None:
    """On a home that does not exist every list is empty, exits 0 and creates nothing."""
    home = tmp_path / "absent" / "home"
    document = _document(_run(tmp_path, home, *args, "--json"))
    assert document == {
        "schema_version": 1,
        key: [],
        "count": 0,
        "cold_root": True,
        "next_cursor": None,
        "unreadable": [],
    }
    human = _run(tmp_path, home, *args)
    assert human.returncode == 0
    assert human.stdout == f"no {key} (cold root: no store exists yet)\n"
    assert not (tmp_path / "absent").exists()
    assert not (tmp_path / "xdg").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["workflows", "show", "w1"],
        ["workflows", "events", "w1"],
        ["runs", "show", "run-1"],
        ["runs", "events", "run-1"],
        ["approvals", "show", "a1"],
        ["approvals", "decide", "a1", "--decision", "approve", "--actor", ACTOR, "--yes"],
    ],
    ids=" ".join,
)
def test_cold_root_show_and_decide_are_not_found(tmp_path: Path, args: list[str]) -> None:
    """On a cold root show and decide exit 1 with NOT_FOUND, creating nothing."""
    home = tmp_path / "absent"
    assert _error_code(_run(tmp_path, home, *args, "--json")) == "NOT_FOUND"
    human = _run(tmp_path, home, *args)
    assert human.returncode == 1
    assert human.stdout == ""
    assert "error: NOT_FOUND" in human.stderr
    assert not home.exists()


# -- workflows -----------------------------------------------------------------


def test_workflows_list_newest_first_filtered_and_limited(
    tmp_path: Path, home: Path, prepared: Prepared
) -> None:
    """Workflows list newest written first; --state filters and --limit bounds."""
    rows = _rows(_run(tmp_path, home, "workflows", "list", "--json"), "workflows")
    assert [row["workflow_id"] for row in rows] == [prepared.done_workflow, prepared.open_workflow]
    assert rows[0] == {
        "workflow_id": prepared.done_workflow,
        "kind": "report.build",
        "state": "stopped",
        "state_version": 2,
        "updated_at": rows[0]["updated_at"],
    }
    planning = _rows(
        _run(tmp_path, home, "workflows", "list", "--state", "planning", "--json"), "workflows"
    )
    assert [row["workflow_id"] for row in planning] == [prepared.open_workflow]
    limited = _rows(
        _run(tmp_path, home, "workflows", "list", "--limit", "1", "--json"), "workflows"
    )
    assert len(limited) == 1
    human = _run(tmp_path, home, "workflows", "list")
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert lines[0].split("\t") == ["workflow_id", "kind", "state", "state_version", "updated_at"]
    assert lines[1].startswith(f"{prepared.done_workflow}\treport.build\tstopped\t2\t")
    none = _run(tmp_path, home, "workflows", "list", "--state", "executing")
    assert none.stdout == "no workflows\n"


def test_workflows_list_rejects_a_bad_limit(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """A limit below 1 is INVALID_INPUT, not a crash."""
    del prepared
    result = _run(tmp_path, home, "workflows", "list", "--limit", "0", "--json")
    assert _error_code(result) == "INVALID_INPUT"


def test_workflows_show(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """Show prints state, version, times, hashes and ledger length, never the parameters."""
    document = _document(
        _run(tmp_path, home, "workflows", "show", prepared.open_workflow, "--json")
    )
    shown = document["workflow"]
    assert isinstance(shown, dict)
    assert shown["state"] == "planning"
    assert shown["state_version"] == 2
    assert shown["kind"] == "invoice.review"
    assert shown["parameter_count"] == 1
    assert shown["event_count"] == 2
    assert str(shown["machine_version"]).startswith("sha256:")
    assert str(shown["head_event_hash"]).startswith("sha256:")
    done = _document(_run(tmp_path, home, "workflows", "show", prepared.done_workflow, "--json"))
    assert isinstance(done["workflow"], dict)
    assert done["workflow"]["output_content_hash"] == content_hash("out")
    assert done["workflow"]["parameter_count"] == 0
    human = _run(tmp_path, home, "workflows", "show", prepared.open_workflow)
    assert human.returncode == 0
    assert human.stdout.startswith(f"workflow {prepared.open_workflow}\n")
    assert "  state: planning\n" in human.stdout
    assert "  event_count: 2\n" in human.stdout
    assert _error_code(_run(tmp_path, home, "workflows", "show", "nope", "--json")) == "NOT_FOUND"


# -- runs ----------------------------------------------------------------------


def test_runs_list(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """Runs list newest written first, filtered by --status."""
    rows = _rows(_run(tmp_path, home, "runs", "list", "--json"), "runs")
    assert [row["run_id"] for row in rows] == [prepared.paused_run, prepared.finished_run]
    assert rows[0]["status"] == "awaiting_approval"
    assert rows[0]["definition_id"] == "invoice.pay"
    completed = _rows(
        _run(tmp_path, home, "runs", "list", "--status", "completed", "--json"), "runs"
    )
    assert [row["run_id"] for row in completed] == [prepared.finished_run]
    assert completed[0]["finished_at"] is not None
    human = _run(tmp_path, home, "runs", "list", "--status", "awaiting_approval")
    lines = human.stdout.splitlines()
    assert lines[0].split("\t")[:3] == ["run_id", "definition_id", "status"]
    assert lines[1].startswith(f"{prepared.paused_run}\tinvoice.pay\tawaiting_approval\t")
    assert len(lines) == 2
    assert _run(tmp_path, home, "runs", "list", "--status", "failed").stdout == "no runs\n"


def test_runs_show_paused_and_finished(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """Show prints status, counts, event count and, once finished, the receipt's digests."""
    paused = _document(_run(tmp_path, home, "runs", "show", prepared.paused_run, "--json"))["run"]
    assert isinstance(paused, dict)
    assert paused["status"] == "awaiting_approval"
    assert paused["event_count"] == 3
    assert paused["budget_count"] == 1
    assert paused["events_trimmed"] is False
    assert paused["terminal_receipt"] is None
    assert str(paused["definition_version"]).startswith("sha256:")
    finished = _document(_run(tmp_path, home, "runs", "show", prepared.finished_run, "--json"))
    shown = finished["run"]
    assert isinstance(shown, dict)
    assert shown["status"] == "completed"
    assert shown["event_count"] == 3
    assert str(shown["terminal_receipt"]).startswith("sha256:")
    assert shown["receipt_event_count"] == 1
    assert str(shown["receipt_final_state_digest"]).startswith("sha256:")
    human = _run(tmp_path, home, "runs", "show", prepared.finished_run)
    assert human.stdout.startswith(f"run {prepared.finished_run}\n")
    assert f"  terminal_receipt: {shown['terminal_receipt']}\n" in human.stdout
    assert _error_code(_run(tmp_path, home, "runs", "show", "no-such-run", "--json")) == "NOT_FOUND"


# -- approvals -----------------------------------------------------------------


def test_approvals_list(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """A run's approvals list most recently written first, filtered by --status."""
    args = ["approvals", "list", "--run", prepared.paused_run]
    rows = _rows(_run(tmp_path, home, *args, "--json"), "approvals")
    assert [row["approval_id"] for row in rows] == [prepared.spare_approval, prepared.approval]
    assert rows[0]["status"] == "pending"
    assert rows[0]["allowed_decision_count"] == 2
    assert _rows(_run(tmp_path, home, *args, "--status", "decided", "--json"), "approvals") == []
    other = _rows(
        _run(tmp_path, home, "approvals", "list", "--run", prepared.finished_run, "--json"),
        "approvals",
    )
    assert other == []
    human = _run(tmp_path, home, *args, "--limit", "1")
    lines = human.stdout.splitlines()
    assert lines[0].split("\t")[:2] == ["approval_id", "status"]
    assert lines[1].startswith(f"{prepared.spare_approval}\tpending\t")
    assert lines[2].startswith("next_cursor: ")
    assert len(lines) == 3
    assert _run(tmp_path, home, *args, "--status", "expired").stdout == "no approvals\n"


def test_approvals_show(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """Show prints status, times, counts and digests; no audience, actor or decision."""
    result = _run(tmp_path, home, "approvals", "show", prepared.approval, "--json")
    shown = _document(result)["approval"]
    assert isinstance(shown, dict)
    assert shown["status"] == "pending"
    assert shown["run_id"] == prepared.paused_run
    assert shown["allowed_decision_count"] == 2
    assert shown["actor_digest"] is None
    assert shown["decision_digest"] is None
    for name in ("audience_digest", "integrity_digest", "checkpoint_digest", "receipt"):
        assert str(shown[name]).startswith("sha256:"), name
    human = _run(tmp_path, home, "approvals", "show", prepared.approval)
    assert human.stdout.startswith(f"approval {prepared.approval}\n")
    assert "  status: pending\n" in human.stdout
    assert "  actor_digest: -\n" in human.stdout
    assert _error_code(_run(tmp_path, home, "approvals", "show", "nope", "--json")) == "NOT_FOUND"


def _decide(
    tmp_path: Path, home: Path, approval_id: str, decision: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    return _run(
        tmp_path, home, "approvals", "decide", approval_id, "--decision", decision,
        "--actor", ACTOR, *extra,
    )  # fmt: skip


def test_decide_happy_path_then_already_decided(
    tmp_path: Path, home: Path, prepared: Prepared
) -> None:
    """A decision prints the receipt's digests; a retry prints it again, another is refused."""
    result = _decide(tmp_path, home, prepared.approval, APPROVE, "--json")
    assert result.returncode == 0, result.stderr
    shown = _document(result)["approval"]
    assert isinstance(shown, dict)
    assert shown["status"] == "decided"
    assert str(shown["actor_digest"]).startswith("sha256:")
    assert str(shown["decision_digest"]).startswith("sha256:")
    assert shown["decided_at"] is not None
    assert str(shown["resume_checkpoint_id"]).startswith("cp_")
    with bootstrap(_settings(home), create=True) as runtime:
        decided = runtime.approvals.get_approval(prepared.approval)
        assert decided.status is ApprovalStatus.DECIDED
        assert (decided.actor, decided.decision) == (ACTOR, APPROVE)
        assert runtime.approvals.approval_receipt(decided).actor == shown["actor_digest"]
    again = _decide(tmp_path, home, prepared.approval, APPROVE, "--json")
    assert again.returncode == 0, again.stderr
    replayed = _document(again)["approval"]
    assert isinstance(replayed, dict)
    assert {**replayed, "receipt": None} == {**shown, "receipt": None}
    human = _decide(tmp_path, home, prepared.approval, REJECT)
    assert human.returncode == 1
    assert "error: APPROVAL_ALREADY_DECIDED" in human.stderr
    listed = _rows(
        _run(tmp_path, home, "approvals", "list", "--run", prepared.paused_run, "--status",
             "decided", "--json"),
        "approvals",
    )  # fmt: skip
    assert [row["approval_id"] for row in listed] == [prepared.approval]


def test_decide_human_output(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """Without --json the decision prints the approval id, status and digests."""
    result = _decide(tmp_path, home, prepared.spare_approval, REJECT, "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"decided: approval {prepared.spare_approval}\n")
    assert "  status: decided\n" in result.stdout
    assert "  actor_digest: sha256:" in result.stdout
    assert "  resume_checkpoint_id: cp_" in result.stdout


def test_decide_not_allowed_changes_nothing(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """A decision outside the allowed ones is APPROVAL_DECISION_NOT_ALLOWED; it stays pending."""
    result = _decide(tmp_path, home, prepared.approval, "maybe", "--json")
    assert _error_code(result) == "APPROVAL_DECISION_NOT_ALLOWED"
    human = _decide(tmp_path, home, prepared.approval, "maybe")
    assert "error: APPROVAL_DECISION_NOT_ALLOWED" in human.stderr
    shown = _document(_run(tmp_path, home, "approvals", "show", prepared.approval, "--json"))
    assert isinstance(shown["approval"], dict)
    assert shown["approval"]["status"] == "pending"


def test_decide_expired(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """Past its deadline a decision is APPROVAL_EXPIRED and the approval shows expired."""
    with bootstrap(_settings(home), create=True) as runtime:
        short = _request(runtime, prepared.paused_run, 9, timedelta(seconds=1)).approval_id
    time.sleep(1.2)
    assert _error_code(_decide(tmp_path, home, short, APPROVE, "--json")) == "APPROVAL_EXPIRED"
    shown = _document(_run(tmp_path, home, "approvals", "show", short, "--json"))["approval"]
    assert isinstance(shown, dict)
    assert shown["status"] == "expired"
    assert shown["actor_digest"] is None
    assert _error_code(_decide(tmp_path, home, short, APPROVE, "--json")) == (
        "APPROVAL_ALREADY_DECIDED"
    )


def test_decide_unknown_approval_is_not_found(
    tmp_path: Path, home: Path, prepared: Prepared
) -> None:
    """Deciding an approval that does not exist is NOT_FOUND."""
    del prepared
    assert _error_code(_decide(tmp_path, home, "nope", APPROVE, "--json")) == "NOT_FOUND"


# -- the confirmation, in-process with a terminal-like io ----------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _terminal_io(answer: str) -> tuple[CommandIO, _Terminal, _Terminal]:
    out, err = _Terminal(), _Terminal()
    return CommandIO(out=out, err=err, stdin=_Terminal(answer + "\n")), out, err


@pytest.mark.parametrize(("answer", "status"), [("n", 1), ("y", 0)])
def test_decide_asks_on_a_terminal(
    home: Path, prepared: Prepared, answer: str, status: int
) -> None:
    """On a terminal decide asks first; anything but yes decides nothing."""
    command_io, out, err = _terminal_io(answer)
    request = DecideRequest(prepared.approval, APPROVE, ACTOR, yes=False)
    with bootstrap(_settings(home), create=True) as runtime:
        assert approvals_decide_command(runtime.approvals, request, command_io) == status
        after = runtime.approvals.get_approval(prepared.approval).status
    assert "Record a decision on approval" in err.getvalue()
    expected = ApprovalStatus.DECIDED if status == 0 else ApprovalStatus.PENDING
    assert after is expected
    assert ("aborted" in err.getvalue()) is (status == 1)
    for marker in MARKERS:
        assert marker not in out.getvalue() + err.getvalue()


def test_decide_with_yes_does_not_ask_on_a_terminal(home: Path, prepared: Prepared) -> None:
    """--yes skips the question even on a terminal."""
    command_io, _out, err = _terminal_io("n")
    request = DecideRequest(prepared.approval, APPROVE, ACTOR, yes=True)
    with bootstrap(_settings(home), create=True) as runtime:
        assert approvals_decide_command(runtime.approvals, request, command_io) == 0
    assert err.getvalue() == ""


# -- WorkflowService.list_workflows --------------------------------------------


def test_list_workflows_orders_filters_and_caps(tmp_path: Path) -> None:
    """Newest written first, by state, at most ``limit`` capped at 200, full records."""
    with bootstrap(_settings(tmp_path / "h"), create=True) as runtime:
        service = runtime.workflows
        ids = [service.create(_order(str(n)))[0].workflow_id for n in range(201)]
        service.transition(ids[0], "planning", expected_state="intake", expected_version=1)
        newest = service.list_workflows(limit=3).items
        assert [record.workflow_id for record in newest] == [ids[0], ids[200], ids[199]]
        assert newest[0] == service.get(ids[0])
        assert [r.workflow_id for r in service.list_workflows("planning").items] == [ids[0]]
        assert service.list_workflows("executing").items == ()
        assert len(service.list_workflows("intake", limit=1000).items) == 200
        assert len(service.list_workflows().items) == 50
        for bad in (0, -1, True):
            with pytest.raises(InvalidInput):
                service.list_workflows(limit=bad)


# -- paging and unreadable rows --------------------------------------------------


@dataclass(frozen=True)
class Listed:
    """One ``list`` verb: its arguments, its JSON key and the column naming a row."""

    args: tuple[str, ...]
    key: str
    column: str


PAGED = [
    Listed(("workflows", "list"), "workflows", "workflow_id"),
    Listed(("runs", "list"), "runs", "run_id"),
    Listed(("approvals", "list"), "approvals", "approval_id"),
]


@pytest.mark.parametrize("case", PAGED, ids=["workflows", "runs", "approvals"])
def test_lists_page_with_a_cursor_or_all_at_once(
    tmp_path: Path, home: Path, prepared: Prepared, case: Listed
) -> None:
    """--limit 1 prints one row and the next cursor; --cursor continues; --all reads every page."""
    del prepared
    args, key, column = case.args, case.key, case.column
    first = _document(_run(tmp_path, home, *args, "--limit", "1", "--json"))
    cursor = first["next_cursor"]
    assert isinstance(cursor, str)
    assert first["count"] == 1
    second = _document(_run(tmp_path, home, *args, "--limit", "1", "--cursor", cursor, "--json"))
    assert second["next_cursor"] is None
    whole = _rows(_run(tmp_path, home, *args, "--all", "--limit", "1", "--json"), key)
    listed = [row[column] for row in [*first[key], *second[key]]]  # type: ignore[misc]
    assert [row[column] for row in whole] == listed
    assert len(set(listed)) == 2
    human = _run(tmp_path, home, *args, "--limit", "1")
    assert human.returncode == 0
    assert human.stdout.splitlines()[-1] == f"next_cursor: {cursor}"
    everything = _run(tmp_path, home, *args, "--all", "--limit", "1")
    assert "next_cursor" not in everything.stdout
    assert len(everything.stdout.splitlines()) == 3


def test_a_cursor_of_another_listing_is_invalid_input(
    tmp_path: Path, home: Path, prepared: Prepared
) -> None:
    """A workflows cursor does not page runs, nor workflows of another state; junk is refused."""
    del prepared
    cursor = _document(_run(tmp_path, home, "workflows", "list", "--limit", "1", "--json"))
    token = str(cursor["next_cursor"])
    for args in (
        ["runs", "list", "--cursor", token],
        ["workflows", "list", "--state", "planning", "--cursor", token],
        ["approvals", "list", "--cursor", token],
        ["workflows", "list", "--cursor", "junk"],
    ):
        assert _error_code(_run(tmp_path, home, *args, "--json")) == "INVALID_INPUT"


def test_approvals_list_across_runs_and_by_status(
    tmp_path: Path, home: Path, prepared: Prepared
) -> None:
    """Without --run every run's approvals are listed, each row naming its run."""
    rows = _rows(_run(tmp_path, home, "approvals", "list", "--json"), "approvals")
    assert [row["approval_id"] for row in rows] == [prepared.spare_approval, prepared.approval]
    assert {row["run_id"] for row in rows} == {prepared.paused_run}
    pending = _rows(
        _run(tmp_path, home, "approvals", "list", "--status", "pending", "--json"), "approvals"
    )
    assert len(pending) == 2


def test_workflows_list_all_reaches_past_200(tmp_path: Path, home: Path) -> None:
    """230 workflows: one page stops at 200, --all lists every one."""
    with bootstrap(_settings(home), create=True) as runtime:
        made = {runtime.workflows.create(_order(str(n)))[0].workflow_id for n in range(230)}
    page = _document(_run(tmp_path, home, "workflows", "list", "--limit", "500", "--json"))
    assert page["count"] == 200
    assert isinstance(page["next_cursor"], str)
    rows = _rows(
        _run(tmp_path, home, "workflows", "list", "--all", "--limit", "200", "--json"), "workflows"
    )
    assert {row["workflow_id"] for row in rows} == made
    assert len(rows) == 230


def _damage(home: Path, namespace: str, key_digest: str) -> None:
    """Flip one byte of a sealed row's payload in the SQLite file, as a disk fault could."""
    with closing(sqlite3.connect(home / "data" / "flowvault.db")) as db, db:
        (payload,) = db.execute(
            "SELECT payload FROM records WHERE namespace = ? AND key_digest = ?",
            (namespace, key_digest),
        ).fetchone()
        flipped = bytes([payload[0] ^ 0x01]) + payload[1:]
        db.execute(
            "UPDATE records SET payload = ? WHERE namespace = ? AND key_digest = ?",
            (flipped, namespace, key_digest),
        )


@dataclass(frozen=True)
class Damaged:
    """A ``list`` verb, the namespace its rows live in, and which prepared row breaks."""

    listed: Listed
    namespace: str
    broken: str
    intact: str


DAMAGED = [
    Damaged(PAGED[0], WORKFLOWS, "done_workflow", "open_workflow"),
    Damaged(PAGED[1], GRAPH_RUNS, "finished_run", "paused_run"),
    Damaged(PAGED[2], APPROVALS, "approval", "spare_approval"),
]


@pytest.mark.parametrize("case", DAMAGED, ids=["workflows", "runs", "approvals"])
def test_a_damaged_row_is_printed_after_the_rows_and_exits_1(
    tmp_path: Path, home: Path, prepared: Prepared, case: Damaged
) -> None:
    """The other rows are listed; the damaged one follows as key digest and code; exit 1."""
    broken, intact = getattr(prepared, case.broken), getattr(prepared, case.intact)
    with bootstrap(_settings(home), create=True) as runtime:
        digest = runtime.repository.key_digest(case.namespace, broken)
    _damage(home, case.namespace, digest)
    args = case.listed.args
    result = _run(tmp_path, home, *args, "--json")
    assert result.returncode == 1
    document = _document(result)
    rows = document[case.listed.key]
    assert isinstance(rows, list)
    assert [row[case.listed.column] for row in rows] == [intact]
    assert document["unreadable"] == [{"key_digest": digest, "code": "INTEGRITY_FAILURE"}]
    human = _run(tmp_path, home, *args)
    assert human.returncode == 1
    lines = human.stdout.splitlines()
    assert lines[1].startswith(intact + "\t")
    assert lines[-1] == f"unreadable: {digest} INTEGRITY_FAILURE"
    assert len(lines) == 3
    assert broken not in human.stdout + human.stderr


# -- events ----------------------------------------------------------------------


def test_workflows_events_page_without_payloads(
    tmp_path: Path, home: Path, prepared: Prepared
) -> None:
    """A workflow's events list oldest first, a page at a time; payloads never print."""
    args = ["workflows", "events", prepared.done_workflow]
    rows = _rows(_run(tmp_path, home, *args, "--json"), "events")
    assert [(row["index"], row["type"], row["to_state"]) for row in rows] == [
        (0, "workflow.created", "intake"),
        (1, "workflow.transitioned", "stopped"),
    ]
    assert all(str(row["event_hash"]).startswith("sha256:") for row in rows)
    first = _document(_run(tmp_path, home, *args, "--limit", "1", "--json"))
    cursor = first["next_cursor"]
    assert isinstance(cursor, str)
    rest = _rows(_run(tmp_path, home, *args, "--cursor", cursor, "--json"), "events")
    assert [row["index"] for row in rest] == [1]
    assert _rows(_run(tmp_path, home, *args, "--all", "--limit", "1", "--json"), "events") == rows
    other = ["workflows", "events", prepared.open_workflow, "--cursor", cursor, "--json"]
    assert _error_code(_run(tmp_path, home, *other)) == "INVALID_INPUT"
    unknown = _run(tmp_path, home, "workflows", "events", "nope", "--json")
    assert _error_code(unknown) == "NOT_FOUND"
    human = _run(tmp_path, home, *args)
    assert human.returncode == 0
    header = human.stdout.splitlines()[0].split("\t")
    assert header == ["index", "type", "from_state", "to_state", "occurred_at", "event_hash"]


def test_runs_events_page_by_index(tmp_path: Path, home: Path, prepared: Prepared) -> None:
    """A run's events list oldest first; the cursor is the next event's index."""
    args = ["runs", "events", prepared.paused_run]
    rows = _rows(_run(tmp_path, home, *args, "--json"), "events")
    assert [row["index"] for row in rows] == [0, 1, 2]
    first = _document(_run(tmp_path, home, *args, "--limit", "2", "--json"))
    assert first["next_cursor"] == "2"
    rest = _rows(_run(tmp_path, home, *args, "--cursor", "2", "--json"), "events")
    assert rest == rows[2:]
    assert _rows(_run(tmp_path, home, *args, "--all", "--limit", "1", "--json"), "events") == rows
    assert _error_code(_run(tmp_path, home, *args, "--cursor", "two", "--json")) == "INVALID_INPUT"
    unknown = _run(tmp_path, home, "runs", "events", "no-such-run", "--json")
    assert _error_code(unknown) == "NOT_FOUND"


def test_a_broken_ledger_is_integrity_failure_not_a_partial_listing(
    tmp_path: Path, home: Path, prepared: Prepared
) -> None:
    """An edited event fails the events listing as a whole: a chain is not a set of rows."""
    with closing(sqlite3.connect(home / "data" / "flowvault.db")) as db, db:
        db.execute(
            "UPDATE ledger_events SET type = 'workflow.edited' WHERE stream = ? AND idx = 0",
            (f"workflow/{prepared.open_workflow}",),
        )
    result = _run(tmp_path, home, "workflows", "events", prepared.open_workflow, "--json")
    assert _error_code(result) == "INTEGRITY_FAILURE"
